"""GPT-OSS's Megatron-Bridge provider fields, and GPTModel's YaRN fields, both ways.

Megatron-Bridge v0.6.0 ``models/gpt_oss/gpt_oss_bridge.py`` (``GPTOSSBridge.provider_bridge``,
lines 57–101) builds a ``GPTModelProvider`` with RMSNorm, a gated linear unit with
``megatron.core.fusions.fused_bias_geglu.quick_gelu``, ``add_bias_linear: true``,
``softmax_type: learnable`` (the sinks), ``window_size = (sliding_window - 1, 0)`` with
``window_attn_skip_freq: 2``, ``glu_linear_offset: 1.0``, ``activation_func_clamp_value: 7.0``,
``moe_ffn_hidden_size = intermediate_size``, ``moe_router_pre_softmax: false``, untied
embeddings, ``position_embedding_type: yarn`` and the ``yarn_*`` fields of
``GPTModelProvider`` (``gpt_provider.py`` lines 150–157) set to gpt-oss's published YaRN;
``conversion/model_bridge.py`` (lines 483–493, 595–603) maps an HF ``yarn`` block onto the
same fields for any GPT provider. Those are exactly the Megatron-Core fields our NeMo config
carries for the GPT-OSS family (``plugins/nemo_convert_gpt_oss/family.py``,
``nemo_convert/families/yarn.py``), so they pass through under their names; we write what
the model is (its clamp, its per-layer window pattern, its YaRN) where the bridge writes
the hub model's constants.

Megatron-Core 0.16.1 reads the window pattern as a list (1 = windowed) or an int N (layer
``n`` 1-based is windowed unless ``n % N == 0``; ``transformer/utils.py`` lines 451–467),
and ``YarnRotaryEmbedding`` rounds the correction range only when
``correction_range_round_to_int`` is truthy (``yarn_rotary_pos_embedding.py`` lines 227–240).
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.spec import ModelSpec, YarnScaling, window_pattern

#: The gated quick-GELU GPTOSSBridge sets (``x · sigmoid(1.702 x)``; ``megatron.core.activations``
#: has the same function, read alike).
QUICK_GELU = "megatron.core.fusions.fused_bias_geglu.quick_gelu"
#: Fields of the GPT-OSS provider that other providers must leave neutral (same names in the
#: NeMo config and the provider).
GPT_OSS_FIELDS = ("softmax_type", "glu_linear_offset", "activation_func_clamp_value", "window_attn_skip_freq")
#: GPTModel's YaRN fields (megatron-core 0.16.1 ``gpt_model.py`` lines 172–191).
YARN_FIELDS = ("yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
               "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim", "yarn_correction_range_round_to_int")


def is_gpt_oss(values: dict[str, Any]) -> bool:
    """Whether a provider section (or NeMo config) is GPT-OSS's: attention sinks."""
    return values.get("softmax_type") == "learnable"


def yarn_provider(yarn: YarnScaling) -> dict[str, Any]:
    """GPTModel's YaRN fields of a config's YaRN (:class:`~nemo_convert.spec.YarnScaling`), for
    the provider."""
    return dict(zip(YARN_FIELDS, (yarn.factor, yarn.original_max_positions, yarn.beta_fast, yarn.beta_slow,
                                  yarn.mscale, yarn.mscale_all_dim, yarn.truncate)))


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def yarn_nemo(values: dict[str, Any], where: str) -> dict[str, Any]:
    """GPTModel's YaRN fields of a provider section, for the NeMo config. The factor, the
    original context and the betas have no usable default (GPTModelProvider's are None);
    ``yarn_correction_range_round_to_int`` None means no rounding; ``yarn_mscale`` /
    ``yarn_mscale_all_dim`` None mean the concentration mscale(factor)."""
    missing = [k for k in YARN_FIELDS[:4] if values.get(k) is None]
    if missing:
        raise UnsupportedError(f"{where}: position_embedding_type yarn without {', '.join(missing)}")
    return {"position_embedding_type": "yarn",
            "yarn_rotary_scaling_factor": float(values["yarn_rotary_scaling_factor"]),
            "yarn_original_max_position_embeddings": int(values["yarn_original_max_position_embeddings"]),
            "yarn_beta_fast": float(values["yarn_beta_fast"]), "yarn_beta_slow": float(values["yarn_beta_slow"]),
            "yarn_mscale": _opt_float(values.get("yarn_mscale")),
            "yarn_mscale_all_dim": _opt_float(values.get("yarn_mscale_all_dim")),
            "yarn_correction_range_round_to_int": bool(values.get("yarn_correction_range_round_to_int"))}


def gpt_oss_provider(spec: ModelSpec, cfg: dict[str, Any]) -> dict[str, Any]:
    """GPT-OSS's attention and GLU fields of a model, for the provider; experts with
    biases need ``expert_tensor_parallel_size: 1`` in Megatron-Core; the auxiliary-loss
    coefficient (a training knob, not math) rides along from the NeMo config (the bridge
    leaves it, and balances nothing: ``none``)."""
    a = spec.attention
    pattern = [int(x) for x in a.window_pattern] if a.window_pattern is not None else None
    out: dict[str, Any] = dict(zip(GPT_OSS_FIELDS, (a.softmax, spec.mlp.glu_offset, spec.mlp.clamp, pattern or None)))
    out["expert_tensor_parallel_size"] = 1
    out["moe_aux_loss_coeff"] = cfg.get("moe_aux_loss_coeff")  # HF's router_aux_loss_coef (training only)
    return out


def gpt_oss_nemo(values: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """GPT-OSS's fields of a provider section, for the NeMo config (the window pattern as a
    per-layer list, an int N meaning "every N-th layer full")."""
    freq = values.get("window_attn_skip_freq")
    flags = None
    if (isinstance(freq, int) and not isinstance(freq, bool) and freq > 0) or (
            isinstance(freq, (list, tuple)) and len(freq) == layers):
        flags = window_pattern(freq, layers)
    elif freq is not None:
        raise UnsupportedError(f"{where}: window_attn_skip_freq={freq!r} is not a window pattern of {layers} layers")
    if flags is not None:
        pattern: Any = [int(x) for x in flags]
    else:  # every layer windowed when there is a window
        pattern = [1] * layers if values.get("window_size") else None
    # HF's GptOssExperts always computes (up + 1) · gate · σ(1.702 · gate) with both clamped;
    # every linear has a bias (the family refuses attention_bias false)
    offset, clamp = values.get("glu_linear_offset"), values.get("activation_func_clamp_value")
    if not values.get("add_bias_linear"):
        raise UnsupportedError(f"{where}: softmax_type learnable without add_bias_linear: GPT-OSS has biases")
    if offset is None or float(offset) != 1.0 or clamp is None:
        raise UnsupportedError(f"{where}: softmax_type learnable with glu_linear_offset={offset!r} and "
                               f"activation_func_clamp_value={clamp!r}: GPT-OSS adds 1 to up and clamps")
    return {"softmax_type": "learnable", "glu_linear_offset": 1.0, "activation_func_clamp_value": float(clamp),
            "window_attn_skip_freq": pattern, "expert_tensor_parallel_size": 1,
            # linear_qkv's bias is add_bias_linear's as well (GPTOSSBridge writes add_qkv_bias false)
            "qkv_bias": True,
            # transformers stores GPT-OSS's experts fused only (GptOssExperts): the HF layout to export
            "nemo_convert": {"hf_experts": "fused"}}
