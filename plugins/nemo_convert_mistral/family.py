"""Mistral (7B v0.1–v0.3, NeMo 12B): Llama's block with a sliding attention window.

``sliding_window=W`` is written as Megatron's ``window_size=[W-1, 0]``: HF lets a query
see W keys (itself and W-1 before), and Megatron's window counts the keys *before*.
NeMo's own importer writes ``[W, 0]`` (one key too many); see docs/families/mistral.md.
"""

from nemo_convert.families import (DENSE, DENSE_CLASS_DEFAULTS, GPT_CONFIG, ProviderFamily, SILU, gpt_family,
                                   sliding_window)
from nemo_convert.families.trtllm import LLAMA_FIELDS, gpt_trtllm
from nemo_convert.spec import spec_of
from nemo_convert_mistral.nemo2 import NEMO2_CONFIGS

#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``mistral/mistral_bridge.py`` lines 56-59 builds a
#: ``MistralModelProvider`` (``mistral/mistral_provider.py`` lines 28-56: its defaults) with
#: ``window_size = [sliding_window - 1, 0]`` and ``cp_comm_type: a2a`` beside it (context parallel only).
MISTRAL_PROVIDER = "megatron.bridge.models.mistral.mistral_provider.MistralModelProvider"
MEGATRON_BRIDGE = ProviderFamily(
    MISTRAL_PROVIDER, DENSE + (("activation_func", SILU),), extra_with_window=(("cp_comm_type", "a2a"),),
    defaults=tuple({**DENSE_CLASS_DEFAULTS, "num_query_groups": 8, "ffn_hidden_size": 14336, "seq_length": 32768,
                    "rotary_base": 1000000.0, "bf16": True, "params_dtype": "torch.bfloat16",
                    "window_size": None}.items()),
    modules=("megatron.bridge.models.mistral.",))

MISTRAL = gpt_family(
    "mistral", architecture="MistralForCausalLM", model_type="mistral",
    config=GPT_CONFIG.extend(sliding_window()),
    claims=lambda cfg: spec_of(cfg).attention.window is not None,  # a sliding window (NeMo's importer writes it)
    nemo2_targets=("nemo.collections.llm.gpt.model.mistral.MistralModel",), nemo2_configs=NEMO2_CONFIGS,
    trtllm=gpt_trtllm("LlamaForCausalLM", LLAMA_FIELDS),  # MODEL_MAP: MistralForCausalLM → LLaMAForCausalLM
    description="Mistral 7B / NeMo 12B (GQA, sliding window as window_size=[W-1, 0])",
    megatron_bridge=MEGATRON_BRIDGE)
