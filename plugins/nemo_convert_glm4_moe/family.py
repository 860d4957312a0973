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
from nemo_convert.families import (GPT_CONFIG, MOE_NEMO_CONSTANTS, Derived, Field, GPTFeatures, MoEBlock,
                                   dense_first_experts, gpt_family, linear_bias_pattern, partial_rope)
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

GLM4_MOE_CONFIG = GPT_CONFIG.extend(
    QKV_BIAS,
    Field("use_qk_norm", "qk_layernorm", False, to_nemo=bool, to_hf=bool),
    partial_rope(0.5),
    dense_first_experts(dense_default=1),
    Field("num_experts_per_tok", "moe_router_topk", 8, to_nemo=int, to_hf=int),
    Field("routed_scaling_factor", "moe_router_topk_scaling_factor", 1.0, to_nemo=float, to_hf=float),
    Field("norm_topk_prob", "nemo_convert.norm_topk_prob", True, accept=lambda v: v is True),
    harmless=("output_router_logits",),
    nemo_constants={**MOE_NEMO_CONSTANTS, "moe_router_score_function": "sigmoid",
                    "moe_router_enable_expert_bias": True, "moe_router_pre_softmax": False,
                    "moe_shared_expert_gate": False,
                    # HF routes in fp32 (the hub's gate weight and bias are kept in fp32, the
                    # hidden state is cast: modeling_glm4_moe.py lines 284, 460)
                    "moe_router_dtype": "fp32"})

#: ``--to megatron-bridge``: refused by name. Megatron-Bridge's ``GLM45Bridge`` builds a
#: ``GPTModelProvider`` with sigmoid routing, the expert bias, the routed scaling factor and
#: ``mtp_num_layers`` (``src/megatron/bridge/models/glm/glm45_bridge.py`` at 067f987d, lines
#: 57-94; ``add_qkv_bias``, ``qk_layernorm``, ``rotary_percent`` from ``conversion/model_bridge.py``
#: lines 456-498); the provider table expresses that routing and MTP only with multi-latent
#: attention (``ProviderFamily.mla``), so a GLM-4.5 provider would lose them.
MEGATRON_BRIDGE = ("GLM45Bridge's GPTModelProvider (sigmoid routing with expert bias, routed scaling, MTP: "
                   "glm/glm45_bridge.py lines 57-94) is not expressed by the provider table yet (it writes that "
                   "routing and MTP only with multi-latent attention)")


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
