"""The check export runs: does a family's HF class compute a NeMo config?

A family's HF class computes a NeMo config when the config the family's own table writes
for the ``config.json`` it would export has the same spec
(:func:`nemo_convert.spec.spec_of`, compared as architectures by
:func:`nemo_convert.spec.first_difference`): the same MLP activation, normalization,
positions and RoPE, linear biases, attention variant and window, experts and routing,
multi-token prediction. Every GPT-base family gets the check from
:func:`~nemo_convert.families.gpt_family.gpt_family`; nothing is declared twice, and a field the
family's table drops (a ``window_size`` on a Llama, a gated GeLU on any SiLU family) shows
up as a difference, refused by name (:func:`nemo_refusal`). How NeMo's fields are read —
NeMo's defaults, the fused tanh GeLU, ``layernorm1p`` — is the spec reader's
(:mod:`nemo_convert.spec.nemo`, :mod:`nemo_convert.spec.activations`), once.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Callable

from nemo_convert.errors import UnsupportedError
from nemo_convert.families.config_table import ConfigTable
from nemo_convert.spec import first_difference, linear_biases, nemo_activation, provenance_of, spec_of
from nemo_convert.spec import signature as spec_signature
from nemo_convert.spec.activations import FUNCTION_NAMES, NEMO_ACTIVATIONS, describe_activation

__all__ = ["FUNCTION_NAMES", "NEMO_ACTIVATIONS", "describe_activation", "linear_bias_pattern", "mlp_activation",
           "nemo_refusal", "signature"]

#: (gated, function) of a NeMo config's MLP (:func:`nemo_convert.spec.nemo_activation`).
mlp_activation = nemo_activation
#: (qkv, o_proj, mlp) biases of a NeMo config (:func:`nemo_convert.spec.linear_biases`).
linear_bias_pattern = linear_biases


def signature(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a NeMo GPT config computes, entry by entry: the architecture of its spec
    (:func:`nemo_convert.spec.signature` of :func:`nemo_convert.spec.spec_of`)."""
    return spec_signature(spec_of(cfg))


def _window(value: Any) -> str:
    keys, ahead = value
    if keys is None:
        return "no sliding window"
    return f"a sliding window of {keys} keys" + (f" and {ahead} ahead" if ahead else "")


def _shown(key: str, cfg: dict[str, Any], value: Any) -> str:
    """A signature entry as the user's config spells it."""
    if key == "activation":
        return f"activation={cfg.get('activation', 'gelu')!r} ({describe_activation(value)})"
    if key == "normalization":
        return f"normalization={cfg.get('normalization', 'layernorm')!r}"
    if key == "bias":
        qkv, proj, mlp = value
        return f"linear biases on q/k/v={qkv}, o_proj={proj}, MLP={mlp}"
    if key == "num_moe_experts":
        return "no experts" if value is None else f"num_moe_experts={value.experts} with its routing"
    if key == "multi_latent_attention":
        return "no multi-latent attention" if value is None else "multi_latent_attention=True with its dimensions"
    if key == "window_size":
        return f"window_size={cfg.get('window_size')!r} ({_window(value)})"
    return f"{key}={value!r}"


def _theirs(key: str, value: Any) -> str:
    if key == "activation":
        return describe_activation(value)
    if key == "bias":
        return "linear biases on q/k/v={}, o_proj={}, MLP={}".format(*value)
    if key == "num_moe_experts":
        return "no experts" if value is None else f"{value.experts} experts routed otherwise"
    if key == "multi_latent_attention":
        return "no multi-latent attention" if value is None else "multi-latent attention of other dimensions"
    if key == "window_size":
        return _window(value)
    return repr(value)


def _drop_ignored(hf: dict[str, Any], keys: Any) -> dict[str, Any]:
    """``hf`` without the keys import was told to ignore (``section.key`` names a key of a section)."""
    for key in keys or ():
        *parents, last = str(key).split(".")
        cur: Any = hf
        for p in parents:
            cur = cur.get(p) if isinstance(cur, dict) else None
        if isinstance(cur, dict):
            cur.pop(last, None)
    return hf


def nemo_refusal(table: ConfigTable, family: str, model: str, *,
                 zero_centred_either: bool = False) -> Callable[[dict[str, Any]], str | None]:
    """``refuse(nemo_config)``: None when ``model`` (the family's HF class) computes the
    config, else why not, in one line naming the field. The table's :class:`NemoCheck`
    rows speak first; then the config the table writes for the ``config.json`` it exports
    must have the config's :func:`signature`. ``zero_centred_either``: the family reads
    norms stored either way (NeMo 1 Gemma's ``1 + w``). A config that lacks what the
    table needs raises (``ConfigError``, ``KeyError``, …) as the translation would."""

    def refuse(cfg: dict[str, Any]) -> str | None:
        reason = table.refuse_nemo(cfg)
        if reason is not None:
            return reason
        try:
            mine = spec_of(cfg)
            hf = table.to_hf(copy.deepcopy(cfg))
            hf.setdefault("vocab_size", mine.geometry.vocab_size or 1)
            hf = _drop_ignored(hf, provenance_of(cfg).ignored_config_keys)
            theirs = spec_of(table.to_nemo(hf, family))
        except UnsupportedError as exc:
            return str(exc)
        if zero_centred_either:  # the family reads NeMo 1's 1 + w as well: the flag is not its math
            theirs = replace(theirs, norm=replace(theirs.norm, zero_centred=mine.norm.zero_centred))
        diff = first_difference(mine, theirs)
        if diff is None:
            return None
        key, value, other = diff
        return f"{_shown(key, cfg, value)}: {model} computes {_theirs(key, other)}"

    return refuse
