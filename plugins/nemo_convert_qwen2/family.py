"""Qwen2 / Qwen2.5: Llama's block with biases on q, k and v only.

The biases are fused like the weights (interleaved per query group) into
``linear_qkv.bias``: Megatron's ``add_qkv_bias``. Per-layer sliding windows
(``use_sliding_window``) have no Megatron-Core equivalent and are refused; the window
keys are accepted while they are off. The published Qwen2.5 configs (3B, 7B) carry
``use_mrope: false``: transformers' ``Qwen2Config`` has no such field (it is Qwen2-VL's
switch for multimodal rotary sections), so false is harmless and true is refused by name.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.families import (AUTOCAST_BF16, Check, DENSE, DENSE_CLASS_DEFAULTS, GPT_CONFIG, GPT_PROVIDER,
                                   NO_LINEAR_BIAS, ProviderFamily, SILU, gpt_family, no_per_layer_windows)
from nemo_convert.families.trtllm import gpt_trtllm, qwen_fields
from nemo_convert.spec import spec_of
from nemo_convert_qwen2.nemo2 import NEMO2_CONFIGS


def _no_mrope(hf: dict[str, Any]) -> str | None:
    """``use_mrope: true`` asks for Qwen2-VL's multimodal rotary sections, which neither
    ``Qwen2ForCausalLM`` nor Megatron-Core's GPT computes."""
    return "use_mrope=True (Qwen2-VL's multimodal RoPE sections)" if hf.get("use_mrope") else None


QWEN2_CONFIG = GPT_CONFIG.extend(
    Check(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"), no_per_layer_windows),
    Check(("use_mrope",), _no_mrope),
    nemo_constants={"qkv_bias": True, "nemo_convert.linear_biases": {"qkv": True, "proj": False, "mlp": False}},
)

#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``qwen/qwen2_bridge.py`` lines 46-57 keeps the
#: ``GPTModelProvider`` with RMSNorm, gated SiLU, q/k/v biases only and ``autocast_dtype: bfloat16``;
#: v0.3.0's own ``Qwen2ModelProvider`` (``qwen/qwen_provider.py`` lines 49-68) is read, never written.
MEGATRON_BRIDGE = ProviderFamily(
    GPT_PROVIDER, DENSE + NO_LINEAR_BIAS + (("add_qkv_bias", True), ("activation_func", SILU)), extra=AUTOCAST_BF16,
    reads=(("megatron.bridge.models.qwen.qwen_provider.Qwen2ModelProvider", tuple({
        **DENSE_CLASS_DEFAULTS, "layernorm_epsilon": 1e-6, "rotary_base": 1000000.0, "bf16": True,
        "params_dtype": "torch.bfloat16", "add_qkv_bias": True, "seq_length": 4096}.items())),),
    modules=("megatron.bridge.models.qwen.",))

QWEN2 = gpt_family(
    "qwen2", architecture="Qwen2ForCausalLM", model_type="qwen2", config=QWEN2_CONFIG,
    claims=lambda cfg: spec_of(cfg).attention.qkv_bias and not spec_of(cfg).attention.proj_bias,  # q/k/v biases only
    nemo2_targets=("nemo.collections.llm.gpt.model.qwen2.Qwen2Model",), nemo2_configs=NEMO2_CONFIGS,
    trtllm=gpt_trtllm("Qwen2ForCausalLM", qwen_fields("qwen2")),  # TensorRT-LLM's QWenForCausalLM
    description="Qwen2 / Qwen2.5 (GQA, q/k/v biases, tied or not)",
    megatron_bridge=MEGATRON_BRIDGE)
