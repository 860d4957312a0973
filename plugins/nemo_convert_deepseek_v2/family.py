"""DeepSeek-V2 / V2-Lite / V2.5 / Coder-V2 (``DeepseekV2ForCausalLM``): multi-latent
attention with or without the query LoRA, dense first layers, softmax-routed experts and
always-on shared experts.

What transformers 5.24 computes (``models/deepseek_v2/modeling_deepseek_v2.py``) and the
Megatron-Core 0.16.1 settings that compute the same:

* attention: MLA (:data:`~nemo_convert.families.MLA_ROWS`, ``DeepseekV2Attention`` lines
  290–423), weights as HF stores them (:func:`~nemo_convert.families.mla_attention_rules`);
  RoPE plain or YaRN, the softmax scaled by ``mscale(factor, mscale_all_dim)²``
  (``yarn_apply_mscale``, lines 281–287) as MLA's YaRN fields do
  (:mod:`nemo_convert.families.yarn`).
* router (``DeepseekV2TopkRouter``, lines 86–117): fp32 logits, softmax over all experts, then
  top-k: greedy, or ``group_limited_greedy`` — each group scored by its *largest* expert
  probability, the best ``topk_group`` groups kept, the others' scores zeroed — and the top-k
  weights times ``routed_scaling_factor``, never renormalised (``norm_topk_prob`` is not read)
  ⇄ ``moe_router_score_function: softmax``, ``moe_router_pre_softmax: true`` (softmax before
  top-k, ``transformer/moe/moe_utils.py`` lines 709–712), ``moe_router_topk_scaling_factor``
  (lines 726–727). Megatron-Core's groups (``group_limited_topk``, lines 515–565) are scored by
  the *sum of the top ``topk // group_topk``* scores (lines 553–555): HF's max exactly when
  ``num_experts_per_tok // topk_group`` is 1 — every other group-limited config (DeepSeek-V2 /
  V2.5's 6 // 3) is refused by name.
* MoE block (``DeepseekV2Moe``, lines 120–137): routed experts plus ungated shared experts of
  ``moe_intermediate_size · n_shared_experts`` ⇄ ``mlp.shared_experts``
  (``moe_shared_expert_intermediate_size``), no expert bias; layer ``i`` is MoE when
  ``i >= first_k_dense_replace`` (line 428) ⇄ ``moe_layer_freq`` as a list
  (:func:`~nemo_convert.families.dense_first_experts` without its groups: here they depend on
  ``topk_method``, the router row below). transformers does
  not read ``moe_layer_freq``, ``scoring_func``, ``norm_topk_prob`` (DeepSeek's own code does,
  differently): only the values under which both agree are accepted (1, softmax, false).
* training-only keys, kept verbatim and not translated: ``aux_loss_alpha`` and ``seq_aux``
  (the auxiliary balance loss), ``ep_size`` (DeepSeek's expert-parallel degree in its own
  code), ``output_router_logits``.
"""

from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import (DENSE, GPT_CONFIG, MLA_PROVIDER, MLA_ROWS, MOE_NEMO_CONSTANTS, NO_LINEAR_BIAS, SILU,
                                   Check, Derived, Field, GPTFeatures, MoEBlock, ProviderFamily, dense_first_experts,
                                   gpt_family, rope)
from nemo_convert.spec import spec_of


#: What an absent key means: ``DeepseekV2Config``'s defaults (transformers 5.24
#: ``configuration_deepseek_v2.py`` lines 104–119).
DEFAULTS = {"n_routed_experts": 64, "moe_intermediate_size": 1407, "n_shared_experts": 2, "first_k_dense_replace": 0,
            "topk_method": "greedy"}


def _get(hf: dict[str, Any], key: str) -> Any:
    return hf[key] if key in hf else DEFAULTS[key]


def _routing_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    method = _get(hf, "topk_method")
    if method == "greedy":  # transformers reads no group key then
        return {"moe_router_num_groups": None, "moe_router_group_topk": None}
    if method != "group_limited_greedy":
        raise UnsupportedError(f"topk_method={method!r} (DeepseekV2ForCausalLM routes 'greedy' or "
                               "'group_limited_greedy')")
    groups, keep = int(hf.get("n_group") or 0), int(hf.get("topk_group") or 0)
    experts, topk = int(_get(hf, "n_routed_experts")), int(hf["num_experts_per_tok"])
    if groups < 1 or keep < 1 or experts % groups or keep > groups:
        raise UnsupportedError(f"topk_method='group_limited_greedy' with n_group={hf.get('n_group')}, "
                               f"topk_group={hf.get('topk_group')} for {experts} experts")
    if groups == 1:
        return {"moe_router_num_groups": None, "moe_router_group_topk": None}
    if topk // keep != 1 or keep * (experts // groups) < topk:
        raise UnsupportedError(
            f"topk_method='group_limited_greedy' with num_experts_per_tok={topk}, topk_group={keep}: transformers "
            f"scores a group by its largest expert score, Megatron-Core by the sum of its top {max(topk // keep, 1)} "
            "(moe_utils.py group_limited_topk); they agree only when num_experts_per_tok // topk_group is 1")
    return {"moe_router_num_groups": groups, "moe_router_group_topk": keep}


def _routing_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    moe = spec_of(cfg).moe
    if moe is None or moe.groups <= 1:
        return {"topk_method": "greedy", "n_group": 1, "topk_group": 1}
    return {"topk_method": "group_limited_greedy", "n_group": moe.groups, "topk_group": moe.group_topk or 1}


def _agreed(hf: dict[str, Any]) -> str | None:
    """Keys transformers ignores but DeepSeek's own code reads: only the values where both
    compute the same are accepted."""
    for key, ok in (("scoring_func", "softmax"), ("moe_layer_freq", 1)):
        if hf.get(key) is not None and hf[key] != ok:
            return f"{key}={hf[key]!r} (DeepseekV2ForCausalLM computes {key}={ok!r} whatever the config says)"
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            return f"{key}={hf[key]!r} (the MLA and expert layers here have no biases)"
    return None


DEEPSEEK_V2_CONFIG = GPT_CONFIG.extend(
    *MLA_ROWS,
    # the groups mean something else here (topk_method): _routing_to_nemo
    dense_first_experts(DEFAULTS, groups=False),
    Field("num_experts_per_tok", "moe_router_topk", to_nemo=int, to_hf=int),
    Derived(("topk_method", "n_group", "topk_group"), _routing_to_nemo, _routing_to_hf),
    Field("routed_scaling_factor", "moe_router_topk_scaling_factor", 1.0, to_nemo=float, to_hf=float),
    # softmax over every expert, then top-k, no renormalisation: pre-softmax in Megatron-Core
    Field("norm_topk_prob", "moe_router_pre_softmax", False, accept=lambda v: not v, to_nemo=lambda v: True,
          to_hf=lambda v: False),
    Check(("scoring_func", "moe_layer_freq", "attention_bias", "mlp_bias"), _agreed),
    rope("yarn", mla=True),
    harmless=("output_router_logits", "aux_loss_alpha", "seq_aux", "ep_size"),
    nemo_constants={**MOE_NEMO_CONSTANTS, "multi_latent_attention": True, "qk_layernorm": True,
                    "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False,
                    "moe_shared_expert_gate": False})


def _claims(cfg: dict[str, Any]) -> bool:
    spec = spec_of(cfg)
    return spec.attention.mla is not None and spec.moe is not None and spec.moe.score_function == "softmax"


#: ``--to megatron-bridge``: Megatron-Bridge's ``DeepSeekV2Bridge``
#: (``src/megatron/bridge/models/deepseek/deepseek_v2_bridge.py``, NVIDIA-NeMo/Megatron-Bridge 067f987,
#: lines 35-84) builds an ``MLAModelProvider`` with softmax routing taken before top-k
#: (``moe_router_pre_softmax``, line 57; ``scoring_func`` / ``n_group`` / ``topk_group`` /
#: ``routed_scaling_factor`` through ``conversion/model_bridge.py`` lines 485-489), the latent q/k
#: norms, untied embeddings, ``moe_layer_freq`` and the shared experts' size, and the knobs below.
#: Its ``seq_length = 4096`` is a training default, not the model: the model's context is written.
MEGATRON_BRIDGE = ProviderFamily(
    MLA_PROVIDER, DENSE + NO_LINEAR_BIAS + (
        ("activation_func", SILU), ("qk_layernorm", True), ("share_embeddings_and_output_weights", False),
        ("multi_latent_attention", True), ("moe_router_score_function", "softmax"),
        ("moe_router_enable_expert_bias", False), ("moe_router_pre_softmax", True),
        ("moe_shared_expert_gate", False)),
    extra=(("moe_grouped_gemm", True), ("moe_token_dispatcher_type", "alltoall"),
           ("moe_router_load_balancing_type", "seq_aux_loss"), ("moe_shared_expert_overlap", True),
           ("moe_router_dtype", "fp32"), ("moe_permute_fusion", True), ("apply_rope_fusion", False),
           ("bias_activation_fusion", True), ("bias_dropout_fusion", True), ("masked_softmax_fusion", True),
           ("persist_layer_norm", True), ("hidden_dropout", 0.0), ("make_vocab_size_divisible_by", 3200)),
    moe=True, mla=True, shared_experts=True)

DEEPSEEK_V2 = gpt_family(
    "deepseek_v2", architecture="DeepseekV2ForCausalLM", model_type="deepseek_v2", config=DEEPSEEK_V2_CONFIG,
    features=GPTFeatures(mla=True, moe=MoEBlock(shared="shared_experts")),
    claims=_claims,
    description="DeepSeek-V2 / V2-Lite (MLA with or without q LoRA, dense first layers, softmax-routed experts, "
                "shared experts)",
    megatron_bridge=MEGATRON_BRIDGE)
