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
The MLA sizes are :data:`~nemo_convert.families.MLA_ROWS`, the experts
:func:`~nemo_convert.families.dense_first_experts` with ``DeepseekV3Config``'s defaults: a
config without ``q_lora_rank`` has the 1536-wide query LoRA, one without ``n_group`` 8 groups.
"""

from typing import Any

from nemo_convert.families import (DENSE, GPT_CONFIG, MLA_PROVIDER, MLA_ROWS, MOE_NEMO_CONSTANTS, NO_LINEAR_BIAS, SILU,
                                   Check, Field, GPTFeatures, MoEBlock, ProviderFamily, dense_first_experts, gpt_family,
                                   rope)
from nemo_convert.spec import spec_of
from nemo_convert_deepseek_v3.nemo2 import NEMO2_CONFIGS


#: What an absent key means: ``DeepseekV3Config``'s defaults (transformers 5.25.0
#: ``configuration_deepseek_v3.py`` lines 86-102).
DEFAULTS = {"n_routed_experts": 256, "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3,
            "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8}


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
        *MLA_ROWS,
        dense_first_experts(DEFAULTS),
        Field("num_experts_per_tok", "moe_router_topk", to_nemo=int, to_hf=int),
        Field("routed_scaling_factor", "moe_router_topk_scaling_factor", 1.0, to_nemo=float, to_hf=float),
        Field("norm_topk_prob", "nemo_convert.norm_topk_prob", True, accept=lambda v: v is True),
        Field("rope_interleave", "nemo_convert.rope_interleave", True, accept=lambda v: v is True),
        Field("attention_bias", "bias", False, accept=lambda v: v is False),
        Check(("scoring_func", "topk_method", "moe_layer_freq"), _hub_routing),
        rope("yarn", mla=True),
        harmless=("output_router_logits", "aux_loss_alpha", "seq_aux", "ep_size"),
        nemo_constants={**MOE_NEMO_CONSTANTS, "multi_latent_attention": True, "qk_layernorm": True,
                        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                        "moe_router_pre_softmax": False, "moe_shared_expert_gate": False}),
    features=GPTFeatures(mla=True, moe=MoEBlock(shared="shared_experts", expert_bias="gate.e_score_correction_bias"),
                         mtp=True),
    claims=lambda cfg: spec_of(cfg).attention.mla is not None,
    nemo2_targets=("nemo.collections.llm.gpt.model.deepseek.DeepSeekModel",), nemo2_configs=NEMO2_CONFIGS,
    description="DeepSeek-V3 (MLA, dense first layers, sigmoid-routed experts with bias, shared experts)",
    megatron_bridge=MEGATRON_BRIDGE)
