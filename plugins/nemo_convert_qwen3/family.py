"""Qwen3 (dense): Llama's block with per-head RMSNorms on queries and keys.

``self_attn.q_norm`` / ``k_norm`` ⇄ ``self_attention.q_layernorm`` / ``k_layernorm``
(Megatron's ``qk_layernorm``); ``head_dim`` is its own field (not hidden / heads).
"""

from nemo_convert.families import (AUTOCAST_BF16, Check, DENSE, DENSE_CLASS_DEFAULTS, GPTFeatures, GPT_CONFIG,
                                   GPT_PROVIDER, NO_LINEAR_BIAS, ProviderFamily, SILU, gpt_family, linear_biases,
                                   no_per_layer_windows)
from nemo_convert.families.trtllm import gpt_trtllm, qwen_fields
from nemo_convert.spec import spec_of
from nemo_convert_qwen3.nemo2 import NEMO2_CONFIGS

#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``qwen/qwen3_bridge.py`` lines 43-55 keeps the
#: ``GPTModelProvider`` with RMSNorm, gated SiLU, no biases, q/k norms and ``autocast_dtype: bfloat16``;
#: v0.3.0's own ``Qwen3ModelProvider`` (``qwen/qwen_provider.py`` lines 257-281) is read, never written.
MEGATRON_BRIDGE = ProviderFamily(
    GPT_PROVIDER, DENSE + NO_LINEAR_BIAS + (("add_qkv_bias", False), ("qk_layernorm", True),
                                            ("activation_func", SILU)), extra=AUTOCAST_BF16,
    reads=(("megatron.bridge.models.qwen.qwen_provider.Qwen3ModelProvider", tuple({
        **DENSE_CLASS_DEFAULTS, "layernorm_epsilon": 1e-6, "rotary_base": 1000000.0, "bf16": True,
        "params_dtype": "torch.bfloat16", "add_qkv_bias": False, "qk_layernorm": True, "kv_channels": 128,
        "num_query_groups": 8, "seq_length": 40960}.items())),),
    modules=("megatron.bridge.models.qwen.",))

QWEN3 = gpt_family(
    "qwen3", architecture="Qwen3ForCausalLM", model_type="qwen3",
    config=GPT_CONFIG.extend(
        linear_biases("attention_bias", None),
        Check(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"), no_per_layer_windows),
        nemo_constants={"qk_layernorm": True}),
    features=GPTFeatures(qk_norm=True),
    claims=lambda cfg: spec_of(cfg).attention.qk_norm,
    nemo2_targets=("nemo.collections.llm.gpt.model.qwen3.Qwen3Model",), nemo2_configs=NEMO2_CONFIGS,
    trtllm=gpt_trtllm("Qwen3ForCausalLM", qwen_fields("qwen3")),  # TensorRT-LLM's QWenForCausalLM
    description="Qwen3 dense (GQA, q/k RMSNorm, head_dim of its own)",
    megatron_bridge=MEGATRON_BRIDGE)
