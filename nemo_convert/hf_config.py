"""Reading Hugging Face ``config.json`` spellings once, for every family.

HF configs spell the same facts several ways across versions (``rope_scaling`` with
``type`` or ``rope_type``, ``rope_theta`` or transformers v5's ``rope_parameters``,
``torch_dtype`` or ``dtype``); families call these helpers instead of re-parsing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from nemo_convert.errors import ConfigError, InputError
from nemo_convert.spec.precision import dtype_name_of_precision, precision_of_dtype_name

__all__ = ["Rope", "dtype_name_of_precision", "hf_dtype_name", "precision_of", "read_config_json",
           "read_json_object", "read_layer_ropes", "read_rope", "require", "set_dtype_name"]



def read_json_object(path: str, missing: str | None = None) -> dict[str, Any]:
    """The JSON object in the file ``path``; a one-line :class:`InputError` when it cannot
    be read, is not JSON or not an object (``missing``: the message when it does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except FileNotFoundError as exc:
        raise InputError(missing or f"{path}: not valid JSON ({exc})") from None
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: not a JSON object")
    return obj


def read_config_json(folder: str) -> dict[str, Any]:
    return read_json_object(os.path.join(folder, "config.json"),
                            missing=f"{folder}: no config.json (is this a Hugging Face model folder?)")


def require(cfg: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise ConfigError(f"config.json lacks required field(s): {', '.join(missing)}")


@dataclass(frozen=True)
class Rope:
    """RoPE facts, whatever the spelling: base, scaling type and the scaling block."""

    theta: float
    kind: str  # "default", "linear", "llama3", or another HF rope_type
    params: dict[str, Any]  # the scaling block (factor, low_freq_factor, …), without type keys


def read_rope(cfg: dict[str, Any]) -> Rope:
    params_v5 = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else None
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else None
    theta = cfg.get("rope_theta")
    if theta is None and params_v5:
        theta = params_v5.get("rope_theta")
    block = scaling or params_v5 or {}
    kind = block.get("rope_type") or block.get("type") or "default"
    params = {k: v for k, v in block.items() if k not in ("rope_type", "type", "rope_theta")}
    return Rope(float(theta if theta is not None else 10000.0), str(kind), params)


def read_layer_ropes(cfg: dict[str, Any]) -> dict[str, Rope] | None:
    """The RoPE of each layer kind (``layer_types``' names), where a config gives its layer
    kinds RoPEs of their own; None where one RoPE rotates every layer (:func:`read_rope`).

    Two spellings, one fact (transformers 5.25 ``models/gemma3/configuration_gemma3.py``
    ``convert_rope_params_to_dict``, lines 132-159, which turns the older one into the newer):

    * transformers 5's ``rope_parameters`` with one block per layer kind
      (``{"full_attention": {...}, "sliding_attention": {...}}``: every value a mapping,
      where a single block's values are numbers and names), each block read as :func:`read_rope`
      reads one; a block without a base takes the older keys' (as the conversion's
      ``setdefault`` does): ``rope_local_base_freq`` for ``sliding_attention``, else ``rope_theta``;
    * the older ``rope_local_base_freq`` (Gemma 3 / 3n and T5Gemma 2 configs of transformers 4):
      ``sliding_attention`` rotates on that base unscaled, ``full_attention`` with ``rope_theta``
      and ``rope_scaling`` (:func:`read_rope` of the rest).
    """
    params = cfg.get("rope_parameters")
    theta, local = cfg.get("rope_theta"), cfg.get("rope_local_base_freq")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        out = {}
        for kind, block in params.items():
            base = local if kind == "sliding_attention" and local is not None else theta
            out[str(kind)] = read_rope({"rope_parameters": {**({"rope_theta": base} if base is not None else {}),
                                                            **block}})
        return out
    if local is None:
        return None
    rest = {k: v for k, v in cfg.items() if k != "rope_local_base_freq"}
    return {"full_attention": read_rope(rest), "sliding_attention": Rope(float(local), "default", {})}


def hf_dtype_name(cfg: dict[str, Any]) -> str | None:
    """``"bfloat16"`` etc. from ``torch_dtype`` or ``dtype``."""
    d = cfg.get("torch_dtype") or cfg.get("dtype")
    return d if isinstance(d, str) else None


def precision_of(cfg: dict[str, Any]) -> Any:
    """NeMo ``precision`` for an HF config's dtype (bf16 / 16 / 32; :mod:`nemo_convert.spec.precision`)."""
    return precision_of_dtype_name(hf_dtype_name(cfg))


def set_dtype_name(cfg: dict[str, Any], name: str) -> None:
    """Record the dtype under whichever spelling the config uses (``dtype`` in v5)."""
    if "dtype" in cfg and "torch_dtype" not in cfg:
        cfg["dtype"] = name
    else:
        cfg["torch_dtype"] = name
