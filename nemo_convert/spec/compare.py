"""Comparing two specs as architectures: what export's check and the family choice use.

Two specs compute the same model when every field below is equal. :func:`signature` lists
them under the NeMo field that holds each (so a difference is named the way the user's
config spells it); :data:`NOT_COMPARED` names the spec fields left out, and why. A test
(``tests/test_spec.py``) proves that the two together cover every field of
:class:`~nemo_convert.spec.model.ModelSpec`, so signature equality is spec equality on
the architecture.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.spec.model import ModelSpec

#: Spec fields the architecture comparison leaves out: the sizes (every table copies them
#: through unchanged, and the tensors' shapes prove them against the config), the storage
#: dtype (not math) and the MTP layers (not part of the HF model).
NOT_COMPARED: dict[str, str] = {
    "geometry.layers": "a size", "geometry.hidden": "a size", "geometry.heads": "a size",
    "geometry.ffn": "a size (an all-MoE model's dense size is unused)", "geometry.vocab_size": "a size",
    "geometry.max_positions": "a size", "precision": "the storage dtype",
    "mtp_layers": "HF classes never run the multi-token-prediction layers (transformers neither loads nor saves "
                  "them); the mapping places their tensors or the plan refuses them",
}


def signature(spec: ModelSpec) -> dict[str, Any]:
    """The spec's architecture, entry by entry, keyed by the NeMo field that holds it."""
    a, rope, mlp = spec.attention, spec.rope, spec.mlp
    return {
        "activation": (mlp.gated, mlp.activation),
        "normalization": spec.norm.kind,
        "layernorm_zero_centered_gamma": spec.norm.zero_centred,
        "layernorm_epsilon": spec.norm.eps,
        "position_embedding_type": spec.positions,
        "rotary_percentage": rope.fraction if rope else None,
        "rotary_base": rope.theta if rope else None,
        "rope_scaling": (rope.interpolation, rope.scaling) if rope else None,
        "rotary_interleaved": rope.interleaved if rope else False,
        "rotary_base_local": rope.local_theta if rope else None,
        "bias": (a.qkv_bias, a.proj_bias, mlp.bias),
        "num_query_groups": spec.geometry.query_groups,
        "kv_channels": spec.geometry.head_dim,
        "share_embeddings_and_output_weights": spec.embedding.tied,
        "qk_layernorm": a.qk_norm,
        "window_size": (a.window, a.window_lookahead),
        "window_attn_skip_freq": a.window_pattern,
        "softmax_type": a.softmax,
        "glu_linear_offset": mlp.glu_offset,
        "activation_func_clamp_value": mlp.clamp,
        "apply_embedding_scaling": spec.embedding.scaled,
        "multi_latent_attention": a.mla,
        "num_moe_experts": spec.moe,
        "transformer_block_type": spec.block.kind,
        "normalize_attention_scores": a.normalized_scores,
        "query_pre_attn_scalar": a.query_pre_attn_scalar,
        "attn_logit_softcapping": a.logit_softcap,
        "final_logit_softcapping": spec.final_logit_softcap,
        "nemo_convert.post_norms": spec.block.post_norms,
        "apply_residual_connection_post_layernorm": spec.block.residual_post_norm,
        "headscale": a.headscale,
        "attention_type": a.kind,
        "hybrid_override_pattern": spec.layer_kinds,
        "unsupported": spec.unsupported,
    }


def first_difference(mine: ModelSpec, theirs: ModelSpec) -> tuple[str, Any, Any] | None:
    """The first entry of :func:`signature` where two specs differ: (NeMo field, mine,
    theirs), or None when they compute the same model."""
    a, b = signature(mine), signature(theirs)
    for key, value in a.items():
        if b.get(key) != value:
            return key, value, b.get(key)
    return None
