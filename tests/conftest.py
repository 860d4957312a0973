"""Shared fixtures: tiny random models built from transformers configs (no downloads)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from tiny_models import make_tiny_llama  # noqa: E402


def _measured_slow() -> set[str]:
    """Node ids in ``tests/measured_slow.txt`` (written by ``tests/measure_durations.py``)."""
    path = os.path.join(os.path.dirname(__file__), "measured_slow.txt")
    if os.environ.get("NEMO_CONVERT_MEASURE") or not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line.rstrip("\n").rpartition("  # ")[0].strip() for line in f if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Tests that measured slow (``tests/measured_slow.txt``) are marked ``slow``: ``-m "not slow"``
    stays the under-a-minute suite; the full suite runs them."""
    slow = _measured_slow()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


def folder_factory(tmp_path, build, stem):  # type: ignore[no-untyped-def]
    """``make(**overrides) -> folder``: each call builds a model in a new folder."""
    counter = {"n": 0}

    def make(**kw):  # type: ignore[no-untyped-def]
        counter["n"] += 1
        return build(str(tmp_path / f"{stem}{counter['n']}"), **kw)

    return make


@pytest.fixture
def tiny_llama(tmp_path):
    """A factory: ``tiny_llama(**overrides) -> folder`` of a saved random LlamaForCausalLM."""
    return folder_factory(tmp_path, make_tiny_llama, "llama")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests (tiny tensors: extra threads only contend on
    a busy machine; and a reference run that must match torchrun processes started with
    OMP_NUM_THREADS=1)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def cli(capsys):
    """``cli(*argv) -> (exit code, stdout, stderr)``: ``main`` in-process, the signal handlers it
    installs restored afterwards."""
    from nemo_convert.cli.main import main

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def call(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    yield call
    for s, h in saved.items():
        signal.signal(s, h)
