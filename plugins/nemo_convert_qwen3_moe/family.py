"""Qwen3-MoE: Qwen3's attention (q/k RMSNorms) with a mixture-of-experts MLP.

``mlp.gate`` ⇄ ``mlp.router``; expert e's ``gate_proj``/``up_proj``/``down_proj`` ⇄
``linear_fc1`` = ``[gate; up]`` and ``linear_fc2`` of expert e. ``norm_topk_prob`` ⇄
``moe_router_pre_softmax`` (negated). Layers in ``mlp_only_layers`` or off the
``decoder_sparse_step`` are dense: ``moe_layer_freq`` becomes a list, and the dist layout
stores every layer under its own keys (Megatron-Core's non-homogeneous layers).
"""

from nemo_convert.families import (AUTOCAST_BF16, Check, DENSE, Field, GPTFeatures, GPT_CONFIG, GPT_PROVIDER,
                                   MOE_HARMLESS, MOE_NEMO_CONSTANTS, MOE_ROWS, MoEBlock, NORM_TOPK_PROB, NO_LINEAR_BIAS,
                                   ProviderFamily, SILU, gpt_family, linear_biases, moe_layers, no_per_layer_windows,
                                   num_experts)
from nemo_convert.spec import spec_of
from nemo_convert_qwen3_moe.nemo2 import NEMO2_CONFIGS

QWEN3_MOE_CONFIG = GPT_CONFIG.extend(
    linear_biases("attention_bias", None),
    Check(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"), no_per_layer_windows),
    num_experts("num_local_experts", "num_experts"), moe_layers(), NORM_TOPK_PROB,
    Field("moe_intermediate_size", "moe_ffn_hidden_size", to_nemo=int, to_hf=int),
    *MOE_ROWS, harmless=MOE_HARMLESS, nemo_constants={**MOE_NEMO_CONSTANTS, "qk_layernorm": True})

#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``qwen/qwen3_moe_bridge.py`` lines 51-70 keeps the
#: ``GPTModelProvider`` with Qwen3's attention fields and the MoE training knobs below (not math).
MEGATRON_BRIDGE = ProviderFamily(
    GPT_PROVIDER, DENSE + NO_LINEAR_BIAS + (("add_qkv_bias", False), ("qk_layernorm", True),
                                            ("activation_func", SILU)),
    extra=AUTOCAST_BF16 + (("moe_grouped_gemm", True), ("moe_router_load_balancing_type", "aux_loss"),
                           ("moe_aux_loss_coeff", 1e-3), ("moe_token_dispatcher_type", "alltoall"),
                           ("moe_permute_fusion", True)), moe=True, modules=("megatron.bridge.models.qwen.",))

QWEN3_MOE = gpt_family(
    "qwen3_moe", architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe", config=QWEN3_MOE_CONFIG,
    features=GPTFeatures(qk_norm=True, moe=MoEBlock()),
    claims=lambda cfg: spec_of(cfg).attention.qk_norm and spec_of(cfg).moe is not None,
    nemo2_targets=("nemo.collections.llm.gpt.model.qwen3.Qwen3Model",), nemo2_configs=NEMO2_CONFIGS,
    description="Qwen3-MoE (q/k RMSNorm, softmax-routed experts, mixed dense/MoE stacks)",
    megatron_bridge=MEGATRON_BRIDGE)
