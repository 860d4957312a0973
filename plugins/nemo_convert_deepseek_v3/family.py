"""DeepSeek-V3: multi-latent attention, dense first layers, sigmoid-routed experts with a
score-correction bias, and always-on shared experts.

MLA weights are copied as HF stores them (:func:`mla_attention_rules`); ``mlp.gate`` ⇄
``mlp.router`` and its ``e_score_correction_bias`` ⇄ ``mlp.router.expert_bias``;
``mlp.shared_experts`` ⇄ ``mlp.shared_experts`` (ungated). Megatron's sigmoid router
(top-k of score + bias, the unbiased scores renormalised, times ``routed_scaling_factor``)
is HF's with ``norm_topk_prob: true``; without it, or with ``rope_interleave: false``,
the import is refused. The first ``first_k_dense_replace`` layers are dense: a mixed stack.
RoPE, plain or YaRN (the hub models'), is MLA's: ``rope_type`` and
``MLATransformerConfig``'s YaRN fields (:mod:`nemo_convert.families.yarn`).
The hub's multi-token-prediction layers (``num_nextn_predict_layers``) go to Megatron-Core's
MTP block (``GPTFeatures(mtp=True)``: :func:`~nemo_convert.families.gpt.mtp_rules`).
"""

from typing import Any

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families import (Check, DENSE, Derived, Field, GPTFeatures, GPT_CONFIG, MLA_PROVIDER,
                                   MOE_NEMO_CONSTANTS, MoEBlock, NO_LINEAR_BIAS, ProviderFamily, SILU, gpt_family, rope)
from nemo_convert.spec import spec_of


def _mla_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    return {"q_lora_rank": hf.get("q_lora_rank"), "kv_lora_rank": int(hf["kv_lora_rank"]),
            "qk_head_dim": int(hf["qk_nope_head_dim"]), "qk_pos_emb_head_dim": int(hf["qk_rope_head_dim"]),
            "v_head_dim": int(hf["v_head_dim"]), "kv_channels": int(hf["v_head_dim"])}


def _mla_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    mla = spec_of(cfg).attention.mla
    if mla is None or None in (mla.kv_lora_rank, mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim):
        raise ConfigError("the NeMo config is not multi-latent attention with its dimensions (kv_lora_rank, "
                          "qk_head_dim, qk_pos_emb_head_dim, v_head_dim)")
    return {"q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
            "qk_nope_head_dim": mla.qk_head_dim, "qk_rope_head_dim": mla.qk_pos_emb_head_dim,
            "v_head_dim": mla.v_head_dim, "head_dim": mla.qk_pos_emb_head_dim,
            "qk_head_dim": int(mla.qk_head_dim or 0) + int(mla.qk_pos_emb_head_dim or 0)}


def _mla_derived(hf: dict[str, Any]) -> str | None:
    rope, qk = int(hf["qk_rope_head_dim"]), int(hf["qk_nope_head_dim"]) + int(hf["qk_rope_head_dim"])
    if hf.get("head_dim") not in (None, rope) or hf.get("qk_head_dim") not in (None, qk):
        return f"head_dim={hf.get('head_dim')} / qk_head_dim={hf.get('qk_head_dim')} (MLA derives {rope} / {qk})"
    if int(hf.get("num_key_value_heads") or hf["num_attention_heads"]) != int(hf["num_attention_heads"]):
        return f"num_key_value_heads={hf['num_key_value_heads']} (MLA has one key and value per head)"
    return None


def _experts_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    fe, layers, dense = int(hf["moe_intermediate_size"]), int(hf["num_hidden_layers"]), int(hf["first_k_dense_replace"])
    reason = _mtp_layer_kind(hf)
    if reason:
        raise UnsupportedError(f"{reason} (family deepseek_v3 cannot represent it exactly)")
    groups = int(hf.get("n_group") or 1)
    return {"num_moe_experts": int(hf["n_routed_experts"]), "moe_ffn_hidden_size": fe,
            "moe_shared_expert_intermediate_size": fe * int(hf["n_shared_experts"]) or None,
            "moe_layer_freq": [0] * dense + [1] * (layers - dense) if dense else 1,
            "moe_router_num_groups": groups if groups > 1 else None,
            "moe_router_group_topk": int(hf["topk_group"]) if groups > 1 else None}


def _experts_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    moe = spec_of(cfg).moe
    if moe is None:
        raise ConfigError("the NeMo config has no num_moe_experts (DeepSeek-V3 routes experts)")
    dense = next((i for i, on in enumerate(moe.layer_pattern) if on), len(moe.layer_pattern))
    return {"n_routed_experts": moe.experts, "moe_intermediate_size": moe.ffn,
            "n_shared_experts": moe.shared_ffn // moe.ffn, "first_k_dense_replace": dense,
            "n_group": moe.groups, "topk_group": moe.group_topk or 1}


def _mtp_layer_kind(hf: dict[str, Any]) -> str | None:
    """Megatron-Core's MTP layer has the last decoder layer's kind; HF's is MoE from layer
    ``first_k_dense_replace`` on. They differ only when every decoder layer is dense and the
    first MTP layer is the first MoE one."""
    layers, dense = int(hf["num_hidden_layers"]), int(hf["first_k_dense_replace"])
    if int(hf.get("num_nextn_predict_layers") or 0) and dense == layers:
        return (f"num_nextn_predict_layers={hf['num_nextn_predict_layers']} with first_k_dense_replace={dense}: HF's "
                "MTP layer would be MoE, Megatron-Core's a copy of the last (dense) layer (use --drop-mtp)")
    return None


def _hub_routing(hf: dict[str, Any]) -> str | None:
    for key, ok in (("scoring_func", ("sigmoid",)), ("topk_method", ("noaux_tc",)), ("moe_layer_freq", (1,))):
        if hf.get(key) is not None and hf[key] not in ok:
            return f"{key}={hf[key]!r} (DeepSeek-V3 routes with {ok[0]!r})"
    return None


#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``deepseek/deepseek_v3_bridge.py`` lines 44-99 builds an
#: ``MLAModelProvider`` with sigmoid routing, expert bias, ungated shared experts and the knobs below.
MEGATRON_BRIDGE = ProviderFamily(
    MLA_PROVIDER, DENSE + NO_LINEAR_BIAS + (
        ("activation_func", SILU), ("qk_layernorm", True), ("share_embeddings_and_output_weights", False),
        ("multi_latent_attention", True), ("moe_router_score_function", "sigmoid"),
        ("moe_router_enable_expert_bias", True), ("moe_shared_expert_gate", False)),
    extra=(("moe_grouped_gemm", True), ("moe_router_pre_softmax", True), ("moe_token_dispatcher_type", "alltoall"),
           ("moe_router_load_balancing_type", "seq_aux_loss"), ("moe_shared_expert_overlap", True),
           ("moe_router_dtype", "fp32"), ("moe_permute_fusion", True), ("hidden_dropout", 0.0),
           ("make_vocab_size_divisible_by", 1280)), moe=True, mla=True, shared_experts=True,
    modules=("megatron.bridge.models.deepseek.",))

DEEPSEEK_V3 = gpt_family(
    "deepseek_v3", architecture="DeepseekV3ForCausalLM", model_type="deepseek_v3",
    config=GPT_CONFIG.extend(
        Derived(("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
                _mla_to_nemo, _mla_to_hf),
        Check(("head_dim", "qk_head_dim"), _mla_derived),
        Derived(("n_routed_experts", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                 "n_group", "topk_group"), _experts_to_nemo, _experts_to_hf),
        Field("num_experts_per_tok", "moe_router_topk", to_nemo=int, to_hf=int),
        Field("routed_scaling_factor", "moe_router_topk_scaling_factor", 1.0, to_nemo=float, to_hf=float),
        Field("norm_topk_prob", "nemo_convert.norm_topk_prob", True, accept=lambda v: v is True),
        Field("rope_interleave", "nemo_convert.rope_interleave", True, accept=lambda v: v is True),
        Field("attention_bias", "bias", False, accept=lambda v: v is False),
        Check(("scoring_func", "topk_method", "moe_layer_freq"), _hub_routing),
        rope("yarn", mla=True),
        harmless=("output_router_logits", "aux_loss_alpha", "seq_aux", "ep_size"), drop=("head_dim",),
        nemo_constants={**MOE_NEMO_CONSTANTS, "multi_latent_attention": True, "qk_layernorm": True,
                        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                        "moe_router_pre_softmax": False, "moe_shared_expert_gate": False}),
    features=GPTFeatures(mla=True, moe=MoEBlock(shared="shared_experts", expert_bias="gate.e_score_correction_bias"),
                         mtp=True),
    claims=lambda cfg: spec_of(cfg).attention.mla is not None,
    nemo2_targets=("nemo.collections.llm.gpt.model.deepseek.DeepSeekModel",),
    description="DeepSeek-V3 (MLA, dense first layers, sigmoid-routed experts with bias, shared experts)",
    megatron_bridge=MEGATRON_BRIDGE)
