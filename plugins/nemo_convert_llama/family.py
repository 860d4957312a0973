"""Llama: the GPT base as it is (Llama is the base's plain instance)."""

from __future__ import annotations

from typing import Any

from nemo_convert.families import DENSE, GPT_PROVIDER, ProviderFamily, gpt_family, gpt_mapping
from nemo_convert.families.trtllm import LLAMA_FIELDS, gpt_trtllm
from nemo_convert.mapping import Mapping
from nemo_convert_llama.config import LLAMA_CONFIG
from nemo_convert_llama.nemo2 import NEMO2_CONFIGS
from nemo_convert_llama.providers import PACKAGE, READS

_MAPPING = gpt_mapping()


def llama_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF Llama names ⇄ NeMo mcore GPT names (logical, per layer, no ``model.`` prefix)."""
    return _MAPPING(cfg)


#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``llama/llama_bridge.py`` builds the generic
#: ``GPTModelProvider`` with RMSNorm, a gated linear unit and RoPE. The per-model classes of
#: releases up to v0.3.1 (``LlamaModelProvider``, ``Llama31ModelProvider8B``, ``Llama32ModelProvider1B``,
#: ``CodeLlamaModelProvider34B``, …) are read, never written (:mod:`nemo_convert_llama.providers`);
#: any other class of the Llama package (Llama 4) is refused by name.
MEGATRON_BRIDGE = ProviderFamily(GPT_PROVIDER, DENSE, reads=READS, modules=(PACKAGE,))

LLAMA = gpt_family(
    "llama", architecture="LlamaForCausalLM", model_type="llama", config=LLAMA_CONFIG,
    nemo2_targets=("nemo.collections.llm.gpt.model.llama.LlamaModel",), nemo2_configs=NEMO2_CONFIGS,
    trtllm=gpt_trtllm("LlamaForCausalLM", LLAMA_FIELDS),  # TensorRT-LLM's LLaMAForCausalLM
    description="Llama 2/3/3.1/3.2 (MHA, GQA, tied embeddings, llama3/linear RoPE scaling)",
    megatron_bridge=MEGATRON_BRIDGE)
