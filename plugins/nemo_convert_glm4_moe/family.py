"""GLM-4.5 / GLM-4.6 (``Glm4MoeForCausalLM``): grouped-query attention with q/k/v biases
and optional per-head q/k RMSNorms, half-rotary RoPE, dense first layers, then
sigmoid-routed experts with a score-correction bias and an always-on shared expert, and
the hub's multi-token-prediction layer.

What each HF key computes is read from transformers 5.24 ``models/glm4_moe/``:

* ``attention_bias`` biases q, k and v only (``o_proj`` has ``bias=False``,
  ``modeling_glm4_moe.py`` lines 188-197) ⇄ Megatron's ``add_qkv_bias`` without
  ``add_bias_linear``; ``use_qk_norm`` ⇄ ``qk_layernorm`` (lines 198-221: the norms act
  per head before RoPE, as Megatron-Core's ``q_layernorm`` / ``k_layernorm``).
* ``partial_rotary_factor`` (the config class sets 0.5 when absent,
  ``configuration_glm4_moe.py`` line 122) ⇄ ``rotary_percentage``: HF rotates the first
  ``int(head_dim · f)`` channels of each head, halves not interleaved (lines 64-82, 131-171),
  as Megatron-Core's ``RotaryEmbedding(rotary_percent=f)`` and ``_apply_rotary_pos_emb_bshd``
  (``rot_dim = freqs.shape[-1]``, the rest passed through) do.
* The router (lines 269-307): sigmoid scores, top-k of score + ``e_score_correction_bias``
  within the ``topk_group`` best of ``n_group`` groups, the unbiased scores renormalised
  (``norm_topk_prob``) and times ``routed_scaling_factor`` ⇄ Megatron-Core's
  ``moe_router_score_function: sigmoid`` with ``moe_router_enable_expert_bias`` and
  ``moe_router_topk_scaling_factor``; Megatron renormalises sigmoid top-k always, so
  ``norm_topk_prob: false`` is refused by name. The shared MLP (``moe_intermediate_size ·
  n_shared_experts``, ungated, added, lines 371-392) ⇄ ``mlp.shared_experts``.
* Layers below ``first_k_dense_replace`` are dense (line 402):
  :func:`~nemo_convert.families.dense_first_experts`.
* ``num_nextn_predict_layers`` ⇄ Megatron-Core's MTP block (``GPTFeatures(mtp=True)``). GLM-4.5's
  hub files store layer ``L`` as ``enorm``, ``hnorm``, ``eh_proj``, a decoder layer,
  ``shared_head.norm`` and copies of the embedding and the output layer, the names
  Megatron-Bridge maps (``glm/glm45_bridge.py`` at 067f987d, lines 193-300).

Megatron-Bridge's ``GLM45Bridge.provider_bridge`` (same file, lines 57-94) sets the same
fields: ``add_bias_linear: false``, sigmoid routing with expert bias, ``moe_router_pre_softmax:
false``, ``moe_shared_expert_intermediate_size = moe_intermediate_size``, ``moe_layer_freq`` from
``first_k_dense_replace``, ``mtp_num_layers`` from ``num_nextn_predict_layers``.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import (AUTOCAST_BF16, DENSE, GPT_CONFIG, GPT_PROVIDER, MOE_NEMO_CONSTANTS, NO_LINEAR_BIAS,
                                   SILU, Derived, Field, GPTFeatures, MoEBlock, ProviderFamily, dense_first_experts,
                                   gpt_family, linear_bias_pattern, partial_rope)
from nemo_convert.spec import rope_of, spec_of


def _qkv_bias_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    on = bool(hf.get("attention_bias", False))
    return {"qkv_bias": on, "nemo_convert.linear_biases": {"qkv": on, "proj": False, "mlp": False}}


def _qkv_bias_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    qkv, proj, mlp = linear_bias_pattern(cfg)
    if proj or mlp:
        raise UnsupportedError(f"linear biases on o_proj={proj}, MLP={mlp} (Glm4MoeForCausalLM biases q, k and v only)")
    return {"attention_bias": qkv}


#: ``attention_bias`` ⇄ biases on q, k and v only (Megatron's ``add_qkv_bias``).
QKV_BIAS = Derived(("attention_bias",), _qkv_bias_to_nemo, _qkv_bias_to_hf, restore=True)

#: What an absent key means: ``Glm4MoeConfig``'s defaults (transformers 5.25.0
#: ``configuration_glm4_moe.py`` lines 102-110).
DEFAULTS = {"n_routed_experts": 128, "moe_intermediate_size": 1408, "n_shared_experts": 1, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8}

GLM4_MOE_CONFIG = GPT_CONFIG.extend(
    QKV_BIAS,
    Field("use_qk_norm", "qk_layernorm", False, to_nemo=bool, to_hf=bool),
    partial_rope(0.5),
    dense_first_experts(DEFAULTS),
    Field("num_experts_per_tok", "moe_router_topk", DEFAULTS["num_experts_per_tok"], to_nemo=int, to_hf=int),
    Field("routed_scaling_factor", "moe_router_topk_scaling_factor", 1.0, to_nemo=float, to_hf=float),
    Field("norm_topk_prob", "nemo_convert.norm_topk_prob", True, accept=lambda v: v is True),
    harmless=("output_router_logits",),
    nemo_constants={**MOE_NEMO_CONSTANTS, "moe_router_score_function": "sigmoid",
                    "moe_router_enable_expert_bias": True, "moe_router_pre_softmax": False,
                    "moe_shared_expert_gate": False,
                    # HF routes in fp32 (the hub's gate weight and bias are kept in fp32, the
                    # hidden state is cast: modeling_glm4_moe.py lines 284, 460)
                    "moe_router_dtype": "fp32"})

#: ``--to megatron-bridge``: Megatron-Bridge's ``GLM45Bridge`` (``src/megatron/bridge/models/glm/glm45_bridge.py``
#: at 067f987d, lines 57-94) builds a ``GPTModelProvider`` with RMSNorm, a gated linear unit, no
#: linear biases, untied embeddings, sigmoid routing with the expert bias (``routing``: with the
#: routed scaling factor and groups from the spec), ``mtp_num_layers`` (``mtp``) and the training
#: knobs below; ``add_qkv_bias``, ``qk_layernorm`` and ``rotary_percent`` come from the base
#: bridge's table (``conversion/model_bridge.py`` lines 456-498).
MEGATRON_BRIDGE = ProviderFamily(
    GPT_PROVIDER, DENSE + NO_LINEAR_BIAS + (
        ("activation_func", SILU), ("share_embeddings_and_output_weights", False),
        ("moe_router_score_function", "sigmoid"), ("moe_router_enable_expert_bias", True),
        ("moe_router_pre_softmax", False), ("moe_shared_expert_gate", False)),
    extra=AUTOCAST_BF16 + (
        ("moe_shared_expert_overlap", True), ("moe_token_dispatcher_type", "alltoall"),
        ("moe_router_load_balancing_type", "seq_aux_loss"), ("moe_grouped_gemm", True), ("moe_permute_fusion", True),
        ("moe_router_dtype", "fp32"), ("moe_router_bias_update_rate", 0), ("moe_aux_loss_coeff", 0.001),
        ("persist_layer_norm", True), ("bias_activation_fusion", True), ("bias_dropout_fusion", True),
        ("hidden_dropout", 0.0), ("mtp_loss_scaling_factor", 0.3)),
    moe=True, shared_experts=True, routing=True, mtp=True)


def _claims(cfg: dict[str, Any]) -> bool:
    """A NeMo-written GPT config is GLM-4.5's: sigmoid-routed experts over grouped-query
    attention (not MLA) with partial RoPE."""
    spec, rope = spec_of(cfg), rope_of(cfg)
    return (spec.moe is not None and spec.moe.score_function == "sigmoid" and spec.attention.mla is None
            and rope is not None and rope.fraction != 1.0)


GLM4_MOE = gpt_family(
    "glm4_moe", architecture="Glm4MoeForCausalLM", model_type="glm4_moe", config=GLM4_MOE_CONFIG,
    features=GPTFeatures(qk_norm=True, moe=MoEBlock(shared="shared_experts", expert_bias="gate.e_score_correction_bias"),
                         mtp=True),
    claims=_claims,
    description="GLM-4.5 / 4.6 (GQA with q/k/v biases, half-rotary RoPE, dense first layers, sigmoid-routed experts "
                "with bias, a shared expert, MTP)",
    megatron_bridge=MEGATRON_BRIDGE,
)
