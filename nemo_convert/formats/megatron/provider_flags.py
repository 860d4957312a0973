"""What a Megatron-Bridge provider subclass expresses beyond the shared provider fields, as
its family declares it (:class:`~nemo_convert.formats.megatron.providers.ProviderFamily`'s
flags), written from the model spec and read back into the NeMo config:

* ``softcaps``: the scores' scalar and the tanh soft-caps (:data:`SCORE_FIELDS`);
* ``post_norms`` and ``window_layers``: what the class's layer spec does by itself;
* ``softmax_scale``, ``local_rope``, ``interleaved_windows`` and ``neutral``: a class that keeps
  the score scale, two RoPE bases or its window pattern in fields of its own;
* ``hybrid``: a hybrid stack's pattern and Mamba sizes (``HybridModelProvider``).

The shared fields and the rest of the table are :mod:`.megatron_config`'s; nothing here
names a family.
"""

from __future__ import annotations

import math
from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.megatron.providers import ProviderFamily
from nemo_convert.spec import ModelSpec, layer_symbols, mamba_dims


def target_of(v: Any) -> str:
    """The ``_target_`` of a provider section (or a function's, spelled as a string or a record)."""
    return str(v.get("_target_", "")) if isinstance(v, dict) else str(v or "")


#: Fields of a provider that declares :attr:`ProviderFamily.softcaps` (Megatron-Bridge
#: ``067f987d`` ``gemma/gemma2_provider.py`` lines 497-499, read at lines 150, 242 and 416;
#: the same names in the NeMo config, :mod:`nemo_convert.spec.nemo`): the scores' scalar and
#: the two tanh soft-caps (``logit_softcapping``, lines 420-425: null or 0 caps nothing).
SCORE_FIELDS = ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")


#: A hybrid stack (:attr:`ProviderFamily.hybrid`): the NeMo config's per-layer pattern (NeMo 1's
#: ``MegatronMambaModel``, Megatron-Core 0.16.1's ``MambaModel(hybrid_override_pattern=…)``) is
#: ``HybridModelProvider``'s ``hybrid_layer_pattern`` (``hybrid_provider.py`` at ``067f987d`` lines
#: 130-131; ``hybrid_override_pattern`` is its deprecated spelling, lines 181-196, never both);
#: the Mamba sizes have the same names on both sides (``TransformerConfig``'s).
NEMO_HYBRID_PATTERN = "hybrid_override_pattern"
MAMBA_FIELDS = ("mamba_num_heads", "mamba_head_dim", "mamba_num_groups", "mamba_state_dim")
#: Megatron-Core's layer symbols (``ssm/mamba_hybrid_layer_allocation.py`` lines 25-32).
HYBRID_SYMBOLS = "M*-E"
#: What a hybrid provider may set that the NeMo config does not carry: the allocation by
#: ratios (used only without a pattern), the multi-token-prediction block's pattern and
#: residuals kept in fp32 (``NemotronHBridge`` maps HF's ``residual_in_fp32`` to it, line 263;
#: ``MambaModel`` here adds them in the model's dtype, as the family's HF configs say).
HYBRID_NEUTRAL: dict[str, Any] = {"hybrid_attention_ratio": 0.0, "hybrid_mlp_ratio": 0.0,
                                  "mtp_hybrid_override_pattern": None, "fp32_residual_connection": False}


def hybrid_provider(s: ModelSpec, cfg: dict[str, Any]) -> dict[str, Any]:
    """A hybrid stack's provider fields: the pattern as one string, the Mamba sizes (Megatron-Core's
    defaults for what the NeMo config leaves out, :func:`nemo_convert.spec.mamba_dims`) and
    ``is_hybrid_model`` (what ``NemotronHBridge.provider_bridge`` sets, ``nemotron_h_bridge.py`` at
    ``067f987d`` line 303)."""
    pattern = "".join(layer_symbols(cfg.get(NEMO_HYBRID_PATTERN), s.geometry.layers))
    return {"hybrid_layer_pattern": pattern, **dict(zip(MAMBA_FIELDS, mamba_dims(cfg))), "is_hybrid_model": True}


def hybrid_nemo(cfg: dict[str, Any], values: dict[str, Any], where: str) -> None:
    """A hybrid provider section's stack into the NeMo config: the pattern (one of its two
    spellings), checked against ``num_layers`` and Megatron-Core's symbols, and the Mamba sizes
    as written (an absent ``mamba_num_heads`` stays absent: ``2 × hidden / head size``). A
    section allocating layers by ratios, or with a multi-token-prediction pattern, is refused."""
    new, old = values.get("hybrid_layer_pattern"), values.get(NEMO_HYBRID_PATTERN)
    if new is not None and old is not None:
        raise UnsupportedError(f"{where}: hybrid_layer_pattern and hybrid_override_pattern are both set "
                               "(HybridModelProvider refuses that)")
    pattern = new if new is not None else old
    if not isinstance(pattern, str) or not pattern:
        raise UnsupportedError(f"{where}: a hybrid provider without hybrid_layer_pattern (layers allocated by "
                               "hybrid_attention_ratio / hybrid_mlp_ratio) is not read")
    odd = sorted(set(pattern) - set(HYBRID_SYMBOLS))
    if odd:
        raise UnsupportedError(f"{where}: hybrid_layer_pattern={pattern!r} has {''.join(odd)!r}: only Megatron-Core's "
                               f"layer symbols {HYBRID_SYMBOLS} are read (no multi-token-prediction part)")
    for k, neutral in HYBRID_NEUTRAL.items():
        if values.get(k) not in (None, neutral):
            raise UnsupportedError(f"{where}: {k}={values[k]!r} changes the model's math and is not supported")
    if int(cfg["num_layers"]) != len(pattern):
        raise UnsupportedError(f"{where}: num_layers={cfg['num_layers']} but hybrid_layer_pattern has {len(pattern)} "
                               "layers")
    if ("E" in pattern) != bool(cfg.get("num_moe_experts")):
        raise UnsupportedError(f"{where}: hybrid_layer_pattern={pattern!r} with num_moe_experts="
                               f"{cfg.get('num_moe_experts')!r}: E layers and experts come together")
    if int(values.get("mtp_num_layers") or 0) or cfg.get("mtp_num_layers"):
        raise UnsupportedError(f"{where}: mtp_num_layers={values.get('mtp_num_layers')!r}: Megatron-Core 0.16.1's "
                               "MambaModel has no multi-token-prediction block")
    cfg.pop("mtp_num_layers", None)
    cfg[NEMO_HYBRID_PATTERN] = pattern
    for k in MAMBA_FIELDS:
        if values.get(k) is not None:
            cfg[k] = int(values[k])
    for k in ("rotary_base", "rotary_percentage", "moe_layer_freq"):  # no rotary embedding; the pattern places experts
        cfg.pop(k, None)


def scores(s: ModelSpec) -> tuple[float | None, float | None, float | None]:
    return s.attention.query_pre_attn_scalar, s.attention.logit_softcap, s.final_logit_softcap


def scores_provider(s: ModelSpec) -> dict[str, Any]:
    """:data:`SCORE_FIELDS` of a model for a provider that carries them: the scalar as an
    int where it is one (the provider's type; HF's configs spell it so), the caps or null.
    A model without a scalar scales by the head size's ``-0.5`` power: ``kv_channels``."""
    scalar, attn, final = scores(s)
    value = float(scalar) if scalar is not None else float(s.geometry.head_dim)
    return {"query_pre_attn_scalar": int(value) if value.is_integer() else value,
            "attn_logit_softcapping": attn, "final_logit_softcapping": final}


def _scores_nemo(values: dict[str, Any], where: str) -> dict[str, Any]:
    """:data:`SCORE_FIELDS` of a provider section that carries them, for the NeMo config."""
    out: dict[str, Any] = {}
    for k in SCORE_FIELDS:
        v = values.get(k)
        if v is None and k != "query_pre_attn_scalar":
            out[k] = None
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (v == 0 and k == "query_pre_attn_scalar"):
            raise UnsupportedError(f"{where}: {k}={v!r} is not a positive number")
        out[k] = v if k == "query_pre_attn_scalar" else (float(v) or None)
    return out


def declared_nemo(cfg: dict[str, Any], values: dict[str, Any], pf: ProviderFamily | None, where: str) -> None:
    """What the section's provider class expresses beyond the shared fields (its
    :class:`ProviderFamily` flags) into ``cfg``; a class that does not carry the score
    fields must leave them unset."""
    if pf is not None and pf.softcaps:
        cfg.update(_scores_nemo(values, where))
    else:
        for k in SCORE_FIELDS:
            if values.get(k) is not None:
                raise UnsupportedError(f"{where}: {k}={values[k]!r} changes the model's math and is not supported "
                                       f"by {target_of(values) or 'a provider without _target_'}")
    if pf is not None and pf.post_norms:
        cfg["nemo_convert"] = {**(cfg.get("nemo_convert") or {}), "post_norms": True}
    if pf is not None and pf.window_layers is not None and cfg.get("window_size"):
        cfg["window_attn_skip_freq"] = [int(x) for x in pf.window_layers(int(cfg["num_layers"]))]


#: Where a provider with :attr:`ProviderFamily.local_rope`, ``interleaved_windows`` or
#: ``softmax_scale`` keeps what the shared fields hold otherwise (Megatron-Bridge ``067f987d``
#: ``gemma/gemma3_provider.py``: ``rotary_base = (local, global)`` line 62, ``window_size`` an
#: int and ``interleaved_attn_pattern = (5, 1)`` lines 72-73, ``rope_scaling_factor`` line 76,
#: ``softmax_scale`` line 79; read at lines 113-137, 200, 241-255 and 349-357).
LAYER_KINDS = ("sliding_attention", "full_attention")


def _layer_kinds(flags: tuple[bool, ...] | list[bool]) -> list[Any]:
    """``interleaved_attn_pattern`` for one window flag per layer: ``[local, global]`` where
    the flags repeat that many windowed then full layers from the first (the shortest such
    period: 1-based layer ``n`` is local when ``(n - 1) % (local + global) < local``,
    ``_is_local_attn_layer`` lines 349-357), else one layer kind per layer (the list the
    same function reads, line 354)."""
    n = len(flags)
    for period in range(1, n + 1):
        local = sum(1 for f in flags[:period] if f)
        if all(bool(flags[i]) == (i % period < local) for i in range(n)):
            return [local, period - local]
    return [LAYER_KINDS[0] if f else LAYER_KINDS[1] for f in flags]


def _local_flags(pattern: Any, layers: int, where: str) -> tuple[bool, ...]:
    """The windowed layers of an ``interleaved_attn_pattern`` (:func:`_layer_kinds`' two forms)."""
    if isinstance(pattern, (list, tuple)) and pattern and all(isinstance(k, str) for k in pattern):
        odd = sorted({str(k) for k in pattern} - set(LAYER_KINDS))
        if odd or len(pattern) != layers:
            raise UnsupportedError(f"{where}: interleaved_attn_pattern has {len(pattern)} layer kinds for {layers} "
                                   f"layers" + (f" and kinds {odd} (known: {', '.join(LAYER_KINDS)})" if odd else ""))
        return tuple(k == LAYER_KINDS[0] for k in pattern)
    if (isinstance(pattern, (list, tuple)) and len(pattern) == 2 and sum(int(v) for v in pattern if isinstance(v, int)) > 0
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pattern)):
        local, period = int(pattern[0]), int(pattern[0]) + int(pattern[1])
        return tuple(i % period < local for i in range(layers))
    raise UnsupportedError(f"{where}: interleaved_attn_pattern={pattern!r} is neither (local, global) layer counts "
                           f"nor one {' / '.join(LAYER_KINDS)} per layer")


def _positive(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UnsupportedError(f"{where}: {name}={value!r} is not a positive number")
    return float(value)


def declared_provider(s: ModelSpec, pf: ProviderFamily) -> dict[str, Any]:
    """What a provider with :attr:`ProviderFamily.softmax_scale`, ``local_rope`` or
    ``interleaved_windows`` holds in its own fields, from the spec; a RoPE it cannot hold is
    refused by name."""
    out: dict[str, Any] = {}
    a, layers = s.attention, s.geometry.layers
    if pf.softmax_scale:
        scalar = a.query_pre_attn_scalar if a.query_pre_attn_scalar is not None else s.geometry.head_dim
        out["softmax_scale"] = 1.0 / math.sqrt(float(scalar))  # as Gemma3Bridge writes it (gemma3_bridge.py l. 71)
    if pf.local_rope and s.rope is not None:
        r = s.rope
        if r.fraction != 1.0 or r.scaling is not None:
            raise UnsupportedError(f"rotary_percent={r.fraction}, scaling={type(r.scaling).__name__ if r.scaling else None}: "
                                   f"{pf.target.rsplit('.', 1)[-1]}'s RoPE rotates whole heads, plainly or linearly scaled")
        windowed = a.window is not None and any(a.window_pattern or (True,))
        if r.local_theta is None and r.interpolation and windowed:
            raise UnsupportedError(f"seq_len_interpolation_factor={r.interpolation} on every layer: "
                                   f"{pf.target.rsplit('.', 1)[-1]} scales the global layers' RoPE only")
        out["rotary_base"] = [float(r.local_theta if r.local_theta is not None else r.theta), float(r.theta)]
        out["rope_scaling_factor"] = float(r.interpolation or 1.0)
    if pf.interleaved_windows:
        flags = tuple(a.window_pattern or (True,) * layers) if a.window is not None else (False,) * layers
        out["window_size"] = None if a.window is None else int(a.window)
        out["interleaved_attn_pattern"] = _layer_kinds(flags)
    return out


def declared_read(model: dict[str, Any], pf: ProviderFamily | None, where: str
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A section of a class with those flags in the shared fields' spelling, and the NeMo
    fields it has beyond them (``rotary_base_local``, ``query_pre_attn_scalar``,
    ``window_attn_skip_freq``). A ``rotary_base`` pair of any other class is refused by name."""
    model = dict(model)
    extra: dict[str, Any] = {}
    if isinstance(model.get("rotary_base"), (list, tuple)) and not (pf is not None and pf.local_rope):
        raise UnsupportedError(f"{where}: rotary_base={list(model['rotary_base'])!r} (a (local, global) pair of RoPE "
                               f"bases) is not supported by {target_of(model) or 'a provider without _target_'}")
    if pf is None:
        return model, extra
    for k, v in pf.neutral:
        if model.get(k, v) != v:
            raise UnsupportedError(f"{where}: {k}={model[k]!r} changes the model's math and is not supported")
    if pf.softmax_scale:
        scale = model.pop("softmax_scale", None)
        if scale is None:  # Megatron-Core's 1/sqrt(kv_channels)
            extra["query_pre_attn_scalar"] = int(model.get("kv_channels") or
                                                 int(model["hidden_size"]) // int(model["num_attention_heads"]))
        else:
            scalar = 1.0 / _positive(scale, "softmax_scale", where) ** 2
            # an integer within 1e-9, as Gemma3Bridge.megatron_to_hf_config reads it back (lines 88-93)
            extra["query_pre_attn_scalar"] = round(scalar) if math.isclose(scalar, round(scalar), rel_tol=0.0,
                                                                           abs_tol=1e-9) else scalar
    if pf.local_rope:
        pair = model.get("rotary_base")
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise UnsupportedError(f"{where}: rotary_base={pair!r} is not a (local, global) pair of RoPE bases")
        for k, neutral in (("seq_len_interpolation_factor", None), ("rope_scaling", False), ("rotary_percent", 1.0)):
            if model.get(k) is not None and model[k] != neutral and not (k == "seq_len_interpolation_factor"
                                                                          and model[k] == 1):
                raise UnsupportedError(f"{where}: {k}={model[k]!r} is not read as the model's RoPE by "
                                       f"{target_of(model)} (its RoPE takes the global layers' factor from "
                                       "rope_scaling_factor, rotates whole heads and interpolates no local layer)")
        factor = _positive(model.pop("rope_scaling_factor", 1.0), "rope_scaling_factor", where)
        model.update({"rotary_base": _positive(pair[1], "rotary_base[1]", where), "rotary_percent": 1.0,
                      "seq_len_interpolation_factor": factor if factor != 1.0 else None, "rope_scaling": None})
        extra["rotary_base_local"] = _positive(pair[0], "rotary_base[0]", where)
    if pf.interleaved_windows:
        flags = _local_flags(model.pop("interleaved_attn_pattern", None), int(model["num_layers"]), where)
        window = model.get("window_size")
        if not any(flags):
            model["window_size"] = None
        elif isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise UnsupportedError(f"{where}: window_size={window!r} is not the positive key count W of windowed "
                                   f"layers that {target_of(model)} reads")
        else:
            model["window_size"] = [window - 1, 0]  # (W - 1, 0) on the local layers, lines 250-252
            extra["window_attn_skip_freq"] = [int(f) for f in flags]
    return model, extra
