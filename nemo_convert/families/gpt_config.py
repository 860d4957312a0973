"""The GPT decoder's config translation: the rows every HF decoder's ``config.json``
shares (:data:`GPT_CONFIG`), the feature rows families add (RoPE kinds, bias switches,
activation, sliding window). The mixture-of-experts and MTP rows are
:mod:`nemo_convert.families.moe_config`; the tensor side of the GPT base is
:mod:`nemo_convert.families.gpt`.
"""

from __future__ import annotations

from typing import Any, Callable

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families.architecture import describe_activation, mlp_activation
from nemo_convert.families.config_table import REQUIRED, ConfigTable, Derived, Field, positive_int
from nemo_convert.families.yarn import MLA_PLAIN, yarn_to_hf, yarn_to_nemo
from nemo_convert.hf_config import precision_of, read_rope
from nemo_convert.mapping.ops import largest_pow2_divisor
from nemo_convert.spec import (LLAMA3_DEFAULTS, Llama3Scaling, ModelSpec, Rope, YarnScaling, geometry_of,
                               linear_biases as bias_pattern, megatron_window, provenance_of, rope_of, sliding_window as window_of,
                               spec_of)


# -- config ------------------------------------------------------------------------------

def _heads_default(hf: dict[str, Any]) -> Any:
    return hf["num_attention_heads"]


def _head_dim_default(hf: dict[str, Any]) -> int:
    return int(hf["hidden_size"]) // int(hf["num_attention_heads"])


def _head_dim_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    d = int(hf.get("head_dim") or _head_dim_default(hf))
    # null means hidden / heads to NeMo and Megatron, and is what NeMo's converters write
    return {"kv_channels": None if d * int(hf["num_attention_heads"]) == int(hf["hidden_size"]) else d}


def _head_dim_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    source = provenance_of(cfg).hf_config or {}
    g = geometry_of(cfg)
    if g.head_dim * g.heads == g.hidden and "head_dim" in source and source["head_dim"] is None:
        return {"head_dim": None}  # the source's null (hidden / heads), as it was (Mixtral)
    return {"head_dim": g.head_dim}


#: HF ``head_dim`` (default hidden/heads) ⇄ NeMo ``kv_channels`` (null when it is hidden/heads).
HEAD_DIM = Derived(("head_dim",), _head_dim_to_nemo, _head_dim_to_hf, restore=True)


def rope(*kinds: str, partial: bool = False, explicit_default: bool = False, mla: bool = False) -> Derived:
    """RoPE in any spelling (v4 ``rope_theta`` + ``rope_scaling``, v5 ``rope_parameters``)
    with the scaling types a family represents (``"linear"``, ``"llama3"``, ``"yarn"``); any
    other type — longrope, dynamic — is refused by name. ``partial``: the family's HF model
    rotates only ``partial_rotary_factor`` of each head (Phi-3) ⇄ ``rotary_percentage``;
    elsewhere a factor other than 1 is refused (transformers' Llama-style attention
    rotates whole heads). ``explicit_default``: a synthesised ``config.json`` spells plain
    RoPE out as ``rope_parameters`` (GPT-OSS's config class defaults to yarn). ``mla``: the
    family runs multi-latent attention, whose RoPE Megatron-Core configures with
    ``MLATransformerConfig``'s ``rope_type`` and YaRN fields instead of GPTModel's
    ``position_embedding_type`` (:mod:`nemo_convert.families.yarn`)."""
    allowed = ("default", *kinds)

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        r = read_rope(hf)
        if r.kind not in allowed:
            why = (" (Megatron-Core has no LongRoPE: per-dimension short/long factors)" if r.kind in ("longrope", "su")
                   else "")
            raise UnsupportedError(f"rope scaling type {r.kind!r} has no Megatron-Core equivalent here{why} "
                                   f"(supported: {', '.join(kinds) or 'none'})")
        if any(isinstance(v, dict) for v in r.params.values()):
            raise UnsupportedError("rope_parameters per layer type (Megatron-Core has one RoPE for every layer)")
        factor = r.params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
        factor = float(factor) if factor is not None else 1.0
        if factor != 1.0 and not partial:
            raise UnsupportedError(f"partial_rotary_factor={factor} (this family's HF model rotates whole heads)")
        out: dict[str, Any] = {
            "rotary_base": r.theta,
            "rotary_percentage": factor,
            "seq_len_interpolation_factor": float(r.params["factor"]) if r.kind == "linear" else None,
            "scale_positional_embedding": r.kind == "llama3",
        }
        if r.kind == "llama3":
            d = LLAMA3_DEFAULTS
            out.update({
                "scale_factor": float(r.params.get("factor", d.factor)),
                "low_freq_factor": float(r.params.get("low_freq_factor", d.low_freq_factor)),
                "high_freq_factor": float(r.params.get("high_freq_factor", d.high_freq_factor)),
                "old_context_len": int(r.params.get("original_max_position_embeddings", d.original_max_positions)),
            })
        if r.kind == "yarn":
            out.update(yarn_to_nemo(r, hf, mla=mla))
        elif mla:
            out.update(MLA_PLAIN)
        return out

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        r = rope_of(cfg) or Rope()
        out: dict[str, Any] = {"rope_theta": r.theta}
        if isinstance(r.scaling, YarnScaling):
            if "yarn" not in kinds:
                raise UnsupportedError("YaRN RoPE: this family's table does not translate it (pass --family for the "
                                       "right one)")
            out["rope_scaling"] = yarn_to_hf(r.scaling, mla=mla)
        elif isinstance(r.scaling, Llama3Scaling):
            s = r.scaling
            out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                                   "high_freq_factor": s.high_freq_factor,
                                   "original_max_position_embeddings": s.original_max_positions}
        elif r.interpolation:
            out["rope_scaling"] = {"rope_type": "linear", "factor": r.interpolation}
        if explicit_default and "rope_scaling" not in out:
            out["rope_parameters"] = {"rope_type": "default", "rope_theta": out["rope_theta"]}
        if r.fraction != 1.0:
            if not partial:
                raise UnsupportedError(f"rotary_percentage={r.fraction}: this family's HF model "
                                       "rotates whole heads (pass --family for the right one)")
            out["partial_rotary_factor"] = r.fraction
        return out

    return Derived(("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor"), to_nemo, to_hf)


def _dtype_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    return {"precision": precision_of(hf)}


def _dtype_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"torch_dtype": spec_of(cfg).precision}


#: ``torch_dtype`` (v4) or ``dtype`` (v5) ⇄ NeMo ``precision``; export keeps the source's spelling.
DTYPE = Derived(("torch_dtype", "dtype"), _dtype_to_nemo, _dtype_to_hf)


def linear_biases(attention: str | None = "attention_bias", mlp: str | None = "mlp_bias") -> Derived:
    """HF bias switches: ``attention`` biases q, k, v and o; ``mlp`` the three MLP linears.
    Megatron's ``bias`` adds every linear's bias; the HF split is kept in
    ``nemo_convert.linear_biases`` (what the mapping reads)."""
    keys = tuple(k for k in (attention, mlp) if k)

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        a = bool(hf.get(attention, False)) if attention else False
        m = bool(hf.get(mlp, False)) if mlp else False
        return {"bias": a and m, "qkv_bias": a, "nemo_convert.linear_biases": {"attention": a, "mlp": m}}

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        qkv, _, mlp_bias = bias_pattern(cfg)
        out = {}
        if attention:
            out[attention] = qkv
        if mlp:
            out[mlp] = mlp_bias
        return out

    return Derived(keys, to_nemo, to_hf, restore=True)


def activation(hf_name: str, nemo_name: str, *, key: str = "hidden_act") -> Field:
    """The one HF activation a family runs, as NeMo's gated ``activation``; others refused."""
    return Field(key, "activation", hf_name, to_nemo=lambda _: nemo_name, to_hf=lambda _: hf_name,
                 accept=lambda v: v == hf_name)


def partial_rope(default: float, *kinds: str) -> Derived:
    """:func:`rope` with ``partial=True`` for an HF class whose ``partial_rotary_factor``
    defaults to ``default`` when the config lacks it (transformers' ``NemotronConfig``:
    0.5, ``configuration_nemotron.py`` ``__post_init__``): import reads the default, and a
    synthesised ``config.json`` always spells the factor out (1.0 included)."""
    inner = rope(*kinds, partial=True)

    def present(hf: dict[str, Any]) -> bool:
        raw = hf.get("rope_parameters")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        return hf.get("partial_rotary_factor") is not None or params.get("partial_rotary_factor") is not None

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        return inner.to_nemo(hf if present(hf) else {**hf, "partial_rotary_factor": default})

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        return {**inner.to_hf(cfg), "partial_rotary_factor": (rope_of(cfg) or Rope()).fraction}

    return Derived(inner.hf_keys, to_nemo, to_hf)


#: An MLP activation as NeMo fields: the function Megatron computes for each (the
#: ``bias_activation_fusion: false`` keeps Megatron-Core's tanh-GeLU kernel out of an
#: exact GeLU, and lets it build ``openai_gelu``, which its fused path rejects).
GELU_ERF: dict[str, Any] = {"activation": "gelu", "openai_gelu": False, "bias_activation_fusion": False}
GELU_TANH: dict[str, Any] = {"activation": "gelu", "openai_gelu": True, "bias_activation_fusion": False}


def activation_choice(key: str, choices: dict[str, dict[str, Any]], default: str) -> Derived:
    """An HF activation ``key`` with several values the family's HF class runs (GPT-2's
    ``activation_function``: ``gelu_new``, ``gelu``, …), each ⇄ the NeMo fields that make
    Megatron compute the same function; any other value is refused by name. Export keeps
    the source's spelling; a synthesised ``config.json`` names the first value whose
    function is the one the NeMo config computes (none: refused by name)."""

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        value = hf.get(key)
        value = default if value is None else value
        if value not in choices:
            raise UnsupportedError(f"{key}={value!r} is not supported (supported: {', '.join(choices)})")
        return dict(choices[value])

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        want = mlp_activation(cfg)
        for name, fields in choices.items():
            if mlp_activation(fields) == want:
                return {key: name}
        raise UnsupportedError(f"activation={cfg.get('activation')!r} ({describe_activation(want)}) has no {key} "
                               f"(supported: {', '.join(choices)})")

    return Derived((key,), to_nemo, to_hf)


def sliding_window() -> Derived:
    """HF ``sliding_window=W`` (query i sees keys i-W < j ≤ i: W keys) ⇄ Megatron
    ``window_size=[W-1, 0]`` (it keeps i-w0 ≤ j ≤ i+w1). NeMo's own importer writes
    ``[W, 0]`` (one key too many); a ``.nemo`` without our record is read that way."""

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        w = hf.get("sliding_window")
        if w is None:
            return {"window_size": None}
        return {"window_size": megatron_window(int(w)), "nemo_convert.sliding_window": int(w)}

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        return {"sliding_window": window_of(cfg)[0]}  # our record, else NeMo's importer convention [W, 0]

    return Derived(("sliding_window",), to_nemo, to_hf, restore=True)


def no_per_layer_windows(hf: dict[str, Any]) -> str | None:
    """Qwen2/Qwen3: per-layer sliding windows are refused (Megatron-Core has one window)."""
    if hf.get("use_sliding_window"):
        return (f"use_sliding_window=True (sliding windows on layers ≥ max_window_layers="
                f"{hf.get('max_window_layers')})")
    types = hf.get("layer_types")
    if isinstance(types, list) and any(t != "full_attention" for t in types):
        return f"layer_types={types!r} (per-layer attention kinds)"
    return None


def softcap(key: str, default: float | None, of: Callable[[ModelSpec], float | None]) -> Derived:
    """A tanh soft-cap ``c·tanh(x / c)`` (Gemma 2's ``attn_logit_softcapping`` on the
    attention scores, ``final_logit_softcapping`` on the logits) ⇄ the NeMo field of the
    same name (Megatron-Bridge's provider fields). Absent means the HF class's ``default``;
    null means no cap (transformers applies none: ``if softcap is not None``), so null is
    kept as null, unlike a :class:`Field`'s default for null. ``of`` reads the cap from the
    spec on export (either NeMo spelling, :mod:`nemo_convert.spec.nemo`)."""

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        value = hf[key] if key in hf else default
        if value is None:
            return {key: None}
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value) > 0:
            raise UnsupportedError(f"{key}={value!r} is not a positive soft-cap")
        return {key: float(value)}

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        return {key: of(spec_of(cfg))}

    return Derived((key,), to_nemo, to_hf)


def query_pre_attn_scalar(default: float) -> Field:
    """HF ``query_pre_attn_scalar`` (scores × its ``-0.5`` power instead of the head size's,
    Gemma 2 / 3) ⇄ the NeMo field of that name (Megatron-Bridge's provider field), the
    number kept as the source spells it (256 stays an int)."""

    def number(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise UnsupportedError(f"query_pre_attn_scalar={v!r} is not a positive number")
        return v

    def spelled(cfg: dict[str, Any]) -> Any:  # NeMo 1's mcore_customization_config (spec reader)
        value = spec_of(cfg).attention.query_pre_attn_scalar
        return int(value) if value is not None and float(value).is_integer() else value

    return Field("query_pre_attn_scalar", "query_pre_attn_scalar", default, to_nemo=number, to_hf=number,
                 nemo_default=spelled)


LAYER_KINDS = ("sliding_attention", "full_attention")


def layer_windows(default_types: Callable[[dict[str, Any]], list[str]], *, pattern_key: str | None = None) -> Derived:
    """A sliding window on some layers: HF ``sliding_window`` (keys a query sees) and
    ``layer_types`` (per layer ``sliding_attention`` / ``full_attention``; absent:
    ``default_types(hf)``, what the HF config class fills in) ⇄ Megatron-Core's
    ``window_size`` ``[W-1, 0]`` with ``window_attn_skip_freq`` as a per-layer list (1:
    windowed). ``pattern_key``: the HF key that sets the default pattern (read by
    ``default_types``; kept as the source has it). Other layer kinds are refused by name."""
    keys = ("sliding_window", "layer_types") + ((pattern_key,) if pattern_key else ())

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        types = hf.get("layer_types")
        types = list(types) if types is not None else default_types(hf)
        if len(types) != int(hf["num_hidden_layers"]):
            raise ConfigError(f"layer_types has {len(types)} entries for num_hidden_layers={hf['num_hidden_layers']}")
        other = sorted({str(t) for t in types} - set(LAYER_KINDS))
        if other:
            raise UnsupportedError(f"layer_types entries {other} (Megatron-Core computes sliding and full attention)")
        w = hf.get("sliding_window")
        sliding = [int(t == "sliding_attention") for t in types]
        if w is None or not any(sliding):
            return {"window_size": None, "window_attn_skip_freq": None}
        return {"window_size": megatron_window(int(w)), "window_attn_skip_freq": sliding,
                "nemo_convert.sliding_window": int(w)}

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        spec = spec_of(cfg)
        sliding = spec.attention.window_pattern
        if spec.attention.window is None:
            sliding = (False,) * spec.geometry.layers
        elif sliding is None:
            sliding = (True,) * spec.geometry.layers
        return {"layer_types": [LAYER_KINDS[0] if s else LAYER_KINDS[1] for s in sliding],
                "sliding_window": spec.attention.window}

    return Derived(keys, to_nemo, to_hf, restore=True)


#: NeMo fields every GPT family writes with a fixed value (NeMo's converters' choices).
GPT_NEMO_CONSTANTS: dict[str, Any] = {
    "mcore_gpt": True,
    "transformer_engine": True,
    "micro_batch_size": 1,
    "global_batch_size": 1,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "normalization": "rmsnorm",
    "bias": False,
    "qkv_bias": False,
    "position_embedding_type": "rope",
    "hidden_dropout": 0.0,
    "ffn_dropout": 0.0,
    # NeMo's value; Megatron applies it only in fp16 (scores / layer number, multiplied back
    # in the fp32 softmax): the same attention either way
    "apply_query_key_layer_scaling": True,
    "normalize_attention_scores": True,
    "transformer_block_type": "pre_ln",
    "megatron_amp_O2": False,
    "persist_layer_norm": True,
    "masked_softmax_fusion": True,
    "apply_rope_fusion": False,
    "nemo_convert.linear_biases": {"attention": False, "mlp": False},
}

#: The shared rows: what every HF decoder's ``config.json`` says the same way.
GPT_CONFIG = ConfigTable(
    rows=(
        Field("hidden_size", "hidden_size", to_nemo=positive_int("hidden_size"), to_hf=int),
        Field("num_hidden_layers", "num_layers", to_nemo=positive_int("num_hidden_layers"), to_hf=int),
        Field("num_attention_heads", "num_attention_heads", to_nemo=positive_int("num_attention_heads"), to_hf=int),
        Field("num_key_value_heads", "num_query_groups", _heads_default, to_nemo=positive_int("num_key_value_heads"),
              to_hf=int,
              nemo_default=lambda c: c["num_attention_heads"]),
        Field("intermediate_size", "ffn_hidden_size", to_nemo=positive_int("intermediate_size"), to_hf=int),
        HEAD_DIM,
        Field("vocab_size", "nemo_convert.vocab_size", REQUIRED, to_nemo=positive_int("vocab_size"), to_hf=int,
              always=True,
              nemo_default=lambda c: None),
        Field("vocab_size", "make_vocab_size_divisible_by", REQUIRED, to_nemo=lambda v: largest_pow2_divisor(int(v)),
              to_hf=None),
        Field("max_position_embeddings", "max_position_embeddings", 4096, to_nemo=int, to_hf=int,
              nemo_default=lambda c: c.get("encoder_seq_length")),
        Field("max_position_embeddings", "encoder_seq_length", 4096, to_nemo=int, to_hf=None),
        Field("rms_norm_eps", "layernorm_epsilon", 1e-5, to_nemo=float, to_hf=float),
        Field("initializer_range", "init_method_std", 0.02, to_nemo=float, to_hf=float),
        Field("tie_word_embeddings", "share_embeddings_and_output_weights", False, to_nemo=bool, to_hf=bool),
        Field("attention_dropout", "attention_dropout", 0.0, to_nemo=float, to_hf=None),
        activation("silu", "fast-swiglu"),
        rope(),
        DTYPE,
    ),
    nemo_constants=GPT_NEMO_CONSTANTS,
)
