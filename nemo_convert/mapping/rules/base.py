"""What every rule is written in: TP kinds, config paths and name templates.

Names are templates: ``{i}`` stands for a layer index and is expanded over
``range(cfg[layers])`` (``{i:PATH}`` over the layers that the Megatron layer pattern at
config ``PATH`` selects — ``moe_layer_freq``: the mixture-of-experts layers of a mixed
stack — and ``{i:!PATH}`` over the others); ``{e}`` stands for an expert and is expanded
over ``range(cfg[experts])`` (``num_moe_experts``). Config references are dotted paths
into the NeMo config, so a rule set can be reused under a prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nemo_convert.errors import ConfigError
from nemo_convert.spec.nemo import layer_pattern


class Parallel(str, Enum):
    """How a NeMo tensor is split across tensor-parallel ranks (the sharding strategies
    hold the mechanics; plugins only name the kind)."""

    REPLICATED = "replicated"
    COLUMN = "column"        # dim 0
    ROW = "row"              # dim 1
    VOCAB = "vocab"          # dim 0, padded to a multiple of divisible_by × TP
    QKV = "qkv"              # dim 0 in whole query groups
    GATED_FC1 = "gated_fc1"  # gate and up halves chunked separately: rank r = [gate_r; up_r]


def cfg_get(cfg: dict[str, Any], path: str | None, default: Any = None) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; ``default`` when any part is missing or None."""
    if path is None:
        return default
    cur: Any = cfg
    for part in path.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            return default
        cur = cur[part]
    return cur


def condition_holds(cfg: dict[str, Any], when: str | None) -> bool:
    """``when="bias"`` holds when ``cfg.bias`` is truthy; ``"!bias"`` when it is not."""
    if when is None:
        return True
    if when.startswith("!"):
        return not cfg_get(cfg, when[1:], False)
    return bool(cfg_get(cfg, when, False))


def prefix_name(prefix: str, name: str) -> str:
    """A tensor name (template) under ``prefix``."""
    return prefix + name if prefix else name


def prefix_path(prefix: str, path: str | None) -> str | None:
    """A config path (or ``!path`` condition) under ``prefix``; None stays None."""
    if path is None or not prefix:
        return path
    if path.startswith("!"):
        return "!" + prefix + path[1:]
    return prefix + path


def _count(cfg: dict[str, Any], path: str) -> int:
    value = cfg_get(cfg, path, 0) or 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config field {path} = {value!r} is not a layer count") from None


_LAYER = re.compile(r"\{i(?::(!?[\w.]+))?\}")


@dataclass(frozen=True)
class Axes:
    """What a name template's indices range over: ``{i}`` the layers (``{i:PATH}`` only the
    layers a Megatron layer pattern at config ``PATH`` selects, ``{i:!PATH}`` the others)
    and ``{e}`` the experts of a mixture-of-experts layer."""

    layers: int
    experts: int
    cfg: dict[str, Any]

    @classmethod
    def of(cls, cfg: dict[str, Any], layers: str, experts: str) -> "Axes":
        """The axes for the layer and expert counts at config paths ``layers`` / ``experts``."""
        return cls(_count(cfg, layers), _count(cfg, experts), cfg)

    def layer_indices(self, selector: str | None) -> list[int]:
        if not selector:
            return list(range(self.layers))
        negate = selector.startswith("!")
        chosen = layer_pattern(cfg_get(self.cfg, selector.lstrip("!")), self.layers)
        return [i for i, on in enumerate(chosen) if on != negate]

    def expand(self, name: str) -> list[tuple[int | None, str]]:
        """Every concrete name of a template with its layer, layer-major then expert (the
        same order for every template of a rule, so that a rule's names pair up by position)."""
        m = _LAYER.search(name)
        names: list[tuple[int | None, str]] = ([(i, name[:m.start()] + str(i) + name[m.end():])
                                                 for i in self.layer_indices(m[1])] if m else [(None, name)])
        if "{e}" in name:
            return [(i, n.replace("{e}", str(e))) for i, n in names for e in range(self.experts)]
        return names
