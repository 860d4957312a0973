"""Shared fixtures: tiny random models built from transformers configs (no downloads)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from tiny_models import make_tiny_llama  # noqa: E402


@pytest.fixture
def tiny_llama(tmp_path):
    """A factory: ``tiny_llama(**overrides) -> folder`` of a saved random LlamaForCausalLM."""
    counter = {"n": 0}

    def make(**kw):
        counter["n"] += 1
        return make_tiny_llama(str(tmp_path / f"llama{counter['n']}"), **kw)

    return make
