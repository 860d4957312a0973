"""What every rule is written in: TP kinds, config paths and name templates.

Names are templates: ``{i}`` stands for a layer index and is expanded over
``range(cfg[layers])`` (``{i:PATH}`` over the layers that the Megatron layer pattern at
config ``PATH`` selects — ``moe_layer_freq``: the mixture-of-experts layers of a mixed
stack — and ``{i:!PATH}`` over the others; ``{i:PATH=S}`` over the layers whose symbol in
the per-layer pattern at ``PATH`` is one of the characters ``S`` — a hybrid stack's
``hybrid_override_pattern``, ``{i:hybrid_override_pattern=M}`` its Mamba layers);
``{e}`` stands for an expert and is expanded over ``range(cfg[experts])``
(``num_moe_experts``). Config references are dotted paths into the NeMo config, so a rule
set can be reused under a prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Union

from nemo_convert.errors import ConfigError
from nemo_convert.spec.nemo import layer_pattern, layer_symbols


class Parallel(str, Enum):
    """How a NeMo tensor is split across tensor-parallel ranks (the sharding strategies
    hold the mechanics; plugins only name the kind)."""

    REPLICATED = "replicated"
    COLUMN = "column"        # dim 0
    ROW = "row"              # dim 1
    VOCAB = "vocab"          # dim 0, padded to a multiple of divisible_by × TP
    QKV = "qkv"              # dim 0 in whole query groups
    GATED_FC1 = "gated_fc1"  # gate and up halves chunked separately: rank r = [gate_r; up_r]


@dataclass(frozen=True)
class Sections:
    """The tensor-parallel kind of a tensor made of named dim-0 sections, each split across
    the ranks on its own: rank ``r`` holds ``[s0_r; s1_r; …]`` (each ``sK_r`` the r-th
    contiguous chunk of section ``K``).

    Megatron-Core's Mamba mixer (0.16.1 ``ssm/mamba_mixer.py``): ``in_proj.weight`` is
    ``[z; x; B; C; dt]`` (rows ``d_inner, d_inner, groups·state, groups·state, heads``,
    lines 268–280) and ``conv1d`` is ``[x; B; C]`` (lines 292–305), and each rank's
    module holds the ``d_inner/TP``, ``groups/TP`` and ``heads/TP`` part of every section
    (lines 250–259); ``sharded_state_dict`` (lines 1098–1184) cuts the rank's tensor into
    those sections with ``_split_tensor_factory`` (lines 1187–1244), so a distributed
    checkpoint stores each section under its own key, ``<name>.<section>`` (``…in_proj.weight.z``),
    with its TP-global shape. ``names`` and ``sizes`` are the sections in order and their
    global row counts; ``units``, where given, the number of whole blocks each section is
    made of (a section's heads or groups: ranks hold whole ones, so TP must divide each)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    units: tuple[int, ...] | None = None
    #: what ``Parallel.X.value`` is for the enum kinds (messages print ``kind.value``)
    value: ClassVar[str] = "sections"

    def __post_init__(self) -> None:
        if len(self.names) != len(self.sizes) or not self.names:
            raise ConfigError(f"sections {self.names} / {self.sizes}: one size per section name")
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"sections {self.names}: names repeat")
        if any(int(n) < 0 for n in self.sizes):
            raise ConfigError(f"sections {self.names}: negative size in {self.sizes}")
        if self.units is not None and (len(self.units) != len(self.sizes)
                                       or any(u < 1 or n % u for n, u in zip(self.sizes, self.units))):
            raise ConfigError(f"sections {self.names}: {self.units} blocks do not divide the sizes {self.sizes}")

    @property
    def rows(self) -> int:
        """The rows of the whole tensor (the sizes summed)."""
        return sum(self.sizes)

    def spans(self) -> list[tuple[str, int, int]]:
        """``(name, first row, rows)`` of every section, in order."""
        out, start = [], 0
        for name, size in zip(self.names, self.sizes):
            out.append((name, start, int(size)))
            start += int(size)
        return out


#: A tensor-parallel kind: one of :class:`Parallel`, or :class:`Sections`.
Kind = Union[Parallel, Sections]


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


_LAYER = re.compile(r"\{i(?::(!?[\w.]+)(?:=([^{}]+))?)?\}")


@dataclass(frozen=True)
class Axes:
    """What a name template's indices range over: ``{i}`` the layers (``{i:PATH}`` only the
    layers a Megatron layer pattern at config ``PATH`` selects, ``{i:!PATH}`` the others,
    ``{i:PATH=S}`` those whose symbol at ``PATH`` is one of ``S``) and ``{e}`` the experts
    of a mixture-of-experts layer."""

    layers: int
    experts: int
    cfg: dict[str, Any]

    @classmethod
    def of(cls, cfg: dict[str, Any], layers: str, experts: str) -> "Axes":
        """The axes for the layer and expert counts at config paths ``layers`` / ``experts``."""
        return cls(_count(cfg, layers), _count(cfg, experts), cfg)

    def layer_indices(self, selector: str | None, symbols: str | None = None) -> list[int]:
        """The layers a ``{i:selector}`` (``{i:selector=symbols}``) template runs over."""
        if not selector:
            return list(range(self.layers))
        if symbols is not None:
            if selector.startswith("!"):
                raise ConfigError(f"layer selector {{i:{selector}={symbols}}}: negate the symbols instead")
            pattern = layer_symbols(cfg_get(self.cfg, selector), self.layers)
            return [i for i, s in enumerate(pattern) if s in symbols]
        negate = selector.startswith("!")
        chosen = layer_pattern(cfg_get(self.cfg, selector.lstrip("!")), self.layers)
        return [i for i, on in enumerate(chosen) if on != negate]

    def expand(self, name: str) -> list[tuple[int | None, str]]:
        """Every concrete name of a template with its layer, layer-major then expert (the
        same order for every template of a rule, so that a rule's names pair up by position)."""
        m = _LAYER.search(name)
        names: list[tuple[int | None, str]] = ([(i, name[:m.start()] + str(i) + name[m.end():])
                                                 for i in self.layer_indices(m[1], m[2])] if m else [(None, name)])
        if "{e}" in name:
            return [(i, n.replace("{e}", str(e))) for i, n in names for e in range(self.experts)]
        return names
