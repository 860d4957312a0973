"""GPT-OSS: biases on every linear, attention sinks, alternating sliding / full attention,
and fused experts stored as ``x @ W`` with gate and up columns interleaved.

``self_attn.sinks`` ⇄ ``core_attention.softmax_offset`` (``softmax_type: learnable``);
``mlp.router`` (weight and bias) ⇄ ``mlp.router``; expert e's fc1 = the de-interleaved
transpose of ``gate_up_proj[e]`` (bias likewise), fc2 = ``down_proj[e].T``. The expert
activation ``(up + 1) · gate · σ(1.702 · gate)`` with both clamped at ``swiglu_limit`` is
Megatron's quick-GELU GLU with ``glu_linear_offset: 1`` and ``activation_func_clamp_value``.
Experts with biases need ``expert_tensor_parallel_size: 1`` in Megatron: whole experts per
TP rank. YaRN (the hub models' RoPE) is GPTModel's ``position_embedding_type: yarn`` with
its ``yarn_*`` fields (:mod:`nemo_convert.families.yarn`). Refused: ``swiglu_alpha`` ≠ 1.702,
other RoPE scaling. The hub's MXFP4 experts are dequantized on import
(``nemo_convert/mapping/dequant.py``).
"""

from __future__ import annotations

from typing import Any

from nemo_convert.families import (Check, Derived, EXPERTS_FFN, Field, GPTFeatures, GPT_CONFIG, GPT_PROVIDER,
                                   MOE_HARMLESS, MOE_NEMO_CONSTANTS, MOE_ROWS, MoEBlock, ProviderFamily, QUICK_GELU,
                                   activation, gpt_family, num_experts, rope)
from nemo_convert.hf_config import read_rope
from nemo_convert.spec import megatron_window, spec_of
from nemo_convert_gpt_oss.nemo2 import NEMO2_CONFIGS


def _windows_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    types, w = hf.get("layer_types") or [], hf.get("sliding_window")
    sliding = [int(t == "sliding_attention") for t in types]
    if w is None or not any(sliding):
        return {"window_size": None, "layer_types": None}
    return {"window_size": megatron_window(int(w)), "window_attn_skip_freq": sliding,
            "nemo_convert.sliding_window": int(w)}


def _windows_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    spec = spec_of(cfg)
    sliding = spec.attention.window_pattern or (False,) * spec.geometry.layers
    return {"layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
            "sliding_window": spec.attention.window}


def _openai_context(hf: dict[str, Any]) -> str | None:
    """``initial_context_length`` is OpenAI's name for YaRN's original context: their
    reference model builds its rotary embedding from it (openai/gpt-oss ``7b583341``
    ``gpt_oss/torch/model.py`` lines 25, 69-105, 210). transformers never reads it and takes
    ``rope_scaling.original_max_position_embeddings`` instead; the published configs give
    both 4096. Equal (or without YaRN, where transformers has no original context) it is a
    duplicate; different, the two implementations run different models: refused by name."""
    value = hf.get("initial_context_length")
    rope = read_rope(hf)
    if value is None or rope.kind != "yarn":
        return None
    original = rope.params.get("original_max_position_embeddings")
    if original is not None and int(value) != int(original):
        return (f"initial_context_length={value} differs from the YaRN original_max_position_embeddings={original} "
                "(OpenAI's reference uses the first, transformers the second)")
    return None


def _openai_topk(hf: dict[str, Any]) -> str | None:
    """The published configs repeat OpenAI's own ``experts_per_token`` beside transformers'
    ``num_experts_per_tok`` (which ``GptOssConfig`` reads; it never reads this one)."""
    k = hf.get("experts_per_token")
    if k is not None and k != hf.get("num_experts_per_tok", 4):
        return f"experts_per_token={k} differs from num_experts_per_tok={hf.get('num_experts_per_tok', 4)}"
    return None


#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``gpt_oss/gpt_oss_bridge.py`` lines 57-101
#: (``nemo_convert.formats.megatron.provider_gpt_oss``).
MEGATRON_BRIDGE = ProviderFamily(
    GPT_PROVIDER, (("normalization", "RMSNorm"), ("gated_linear_unit", True), ("activation_func", QUICK_GELU),
                   ("add_bias_linear", True), ("softmax_type", "learnable"),
                   ("share_embeddings_and_output_weights", False)),
    extra=(("moe_grouped_gemm", True), ("moe_token_dispatcher_type", "alltoall"), ("moe_permute_fusion", True),
           ("moe_router_load_balancing_type", "none"), ("bias_activation_fusion", True),
           ("bias_dropout_fusion", False), ("hidden_dropout", 0.0)), moe=True, gpt_oss=True)

GPT_OSS = gpt_family(
    "gpt_oss", architecture="GptOssForCausalLM", model_type="gpt_oss",
    config=GPT_CONFIG.extend(
        Derived(("layer_types", "sliding_window"), _windows_to_nemo, _windows_to_hf, restore=True),
        Field("attention_bias", "bias", True, to_nemo=bool, to_hf=bool, accept=lambda v: v is True),
        Field("swiglu_alpha", "nemo_convert.swiglu_alpha", 1.702, accept=lambda v: float(v) == 1.702),
        Field("swiglu_limit", "activation_func_clamp_value", 7.0, to_nemo=float, to_hf=float),
        activation("silu", "quick-geglu"), num_experts("num_local_experts"),
        EXPERTS_FFN, rope("yarn", explicit_default=True),
        Check(("experts_per_token",), _openai_topk),
        Check(("initial_context_length",), _openai_context),
        *MOE_ROWS, harmless=MOE_HARMLESS,
        nemo_constants={**MOE_NEMO_CONSTANTS, "qkv_bias": True, "softmax_type": "learnable", "glu_linear_offset": 1.0,
                        "moe_router_pre_softmax": False, "moe_layer_freq": 1, "expert_tensor_parallel_size": 1,
                        "nemo_convert.linear_biases": {"qkv": True, "proj": True, "mlp": True}}),
    features=GPTFeatures(attention_sinks=True, moe=MoEBlock(router="router", router_bias=True, fused_transposed=True,
                                                           fused_interleaved=True, expert_biases=True,
                                                           expert_tp=False)),
    claims=lambda cfg: spec_of(cfg).attention.softmax == "learnable",  # attention sinks
    nemo2_targets=("nemo.collections.llm.gpt.model.gpt_oss.GPTOSSModel",), nemo2_configs=NEMO2_CONFIGS,
    description="GPT-OSS (attention sinks, biases, alternating windows, fused interleaved experts with biases)",
    megatron_bridge=MEGATRON_BRIDGE)
