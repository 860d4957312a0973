"""Llama config translation: the GPT base table plus Llama's bias switches and RoPE scaling.

Both directions are derived from the table (:mod:`nemo_convert.families.config_table`):
what NeMo has no field for (the source rope-scaling block, bos/eos ids, the original
vocabulary size, …) is kept verbatim in the ``nemo_convert`` section so that export
restores ``config.json`` key for key.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.families import GPT_CONFIG, NEMO_GPT_TARGET, linear_biases, rope, table_translation

__all__ = ["LLAMA_CONFIG", "NEMO_GPT_TARGET", "llama_config_to_hf", "llama_config_to_nemo"]

LLAMA_CONFIG = GPT_CONFIG.extend(linear_biases("attention_bias", "mlp_bias"), rope("linear", "llama3"),
                                 hf_constants={"architectures": ["LlamaForCausalLM"], "model_type": "llama"})

_to_nemo, _to_hf = table_translation(LLAMA_CONFIG, "llama")


def llama_config_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    """HF ``LlamaForCausalLM`` ``config.json`` → NeMo mcore GPT config (strict)."""
    return _to_nemo(hf)


def llama_config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """NeMo config → ``config.json`` (the recorded source restored, else synthesised)."""
    return _to_hf(cfg)
