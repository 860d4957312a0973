"""What every rule is written in: TP kinds, config paths and name templates.

Names are templates: ``{i}`` stands for a layer index and is expanded over
``range(cfg[layers])`` (``{i:@FIELD}`` over the layers that a per-layer field of the model
spec selects — ``{i:@moe.layer_pattern}``: the mixture-of-experts layers of a mixed stack —
and ``{i:!@FIELD}`` over the others; ``{i:@FIELD=S}`` over the layers whose symbol is one
of the characters ``S`` — ``{i:@layer_kinds=M}`` a hybrid stack's Mamba layers;
:meth:`SpecField.layers` writes them; ``{i:PATH}``, ``{i:!PATH}``, ``{i:PATH=S}`` read a
Megatron layer pattern at config ``PATH`` instead, deprecated);
``{e}`` stands for an expert and is expanded over ``range(cfg[experts])``
(``num_moe_experts``).

A rule's condition (``when``) and the symbolic dimensions of its shapes read the typed model
spec (:class:`~nemo_convert.spec.model.ModelSpec`, built once per plan by
:func:`~nemo_convert.spec.nemo.spec_of`) through :class:`SpecField`:
``when=SpecField("embedding.tied")``, ``when=~SpecField("embedding.tied")``,
``shape=(SpecField("geometry.hidden"),)``. The path is checked against the spec's dataclass
fields when the rule is built, so a typo fails at import. The older form, a dotted path
into the NeMo config (``when="share_embeddings_and_output_weights"``, ``"!path"``,
``shape=("hidden_size",)``), still works for plugins written against it but is deprecated
(docs/plugins.md); it is what a config section the spec does not model (CLIP's towers)
still uses, and it is what :meth:`Mapping.nested`'s config prefix rewrites.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass
from enum import Enum
from collections.abc import Callable
from typing import Any, ClassVar, Union

from nemo_convert.errors import ConfigError
from nemo_convert.spec.model import ModelSpec
from nemo_convert.spec.nemo import layer_pattern, layer_symbols, spec_of


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


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """A spec record's field names → their resolved type hints."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _record_of(hint: Any) -> type | None:
    """The spec record a field's type holds (``MoE`` of ``MoE | None``), None for a leaf."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) in (Union, types.UnionType):
        records = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a) and isinstance(a, type)]
        return records[0] if len(records) == 1 else None
    return None


@dataclass(frozen=True)
class SpecField:
    """A field of the typed model spec, by its dotted path from
    :class:`~nemo_convert.spec.model.ModelSpec` (``"embedding.tied"``, ``"moe.shared_gate"``,
    ``"attention.mla.q_lora_rank"``): a rule's condition (``when=``; ``~field`` negates it)
    or a symbolic dimension of a shape.

    The path is checked against the spec's dataclass fields here, when the rule is built: a
    name that is not a field raises :class:`ConfigError` at import, never reads as False.
    Through an optional record that is absent (a dense model's ``moe``) the value is None:
    a condition on it is False (``~`` of it True), a dimension "any"."""

    path: str
    negate: bool = False
    #: the path's parts (for reading the value without splitting it again)
    parts: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        record: type | None = ModelSpec
        parts = self.path.split(".")
        object.__setattr__(self, "parts", tuple(parts))
        for k, part in enumerate(parts):
            if record is None:
                raise ConfigError(f"spec field {self.path!r}: {'.'.join(parts[:k])} is not a record")
            types_ = _field_types(record)
            if part not in types_:
                raise ConfigError(f"spec field {self.path!r}: {record.__name__} has no field {part!r} "
                                  f"(it has {', '.join(types_)})")
            record = _record_of(types_[part])

    def __invert__(self) -> SpecField:
        return SpecField(self.path, not self.negate)

    def __str__(self) -> str:
        return ("!" if self.negate else "") + self.path

    def value(self, spec: ModelSpec) -> Any:
        """The field's value in ``spec`` (None through an absent record); a negated field
        has no value, only :meth:`holds`."""
        if self.negate:
            raise ConfigError(f"spec field {self}: a negated field is a condition, not a value")
        return self._read(spec)

    def _read(self, spec: ModelSpec) -> Any:
        cur: Any = spec
        for part in self.parts:
            if cur is None:
                return None
            cur = getattr(cur, part)
        return cur

    def holds(self, spec: ModelSpec) -> bool:
        """Whether the field is truthy in ``spec`` (falsy, when negated)."""
        return bool(self._read(spec)) != self.negate

    def layers(self, symbols: str | None = None) -> str:
        """The layer index of a name template over the layers this per-layer field selects
        (:class:`Axes`): ``{i:@moe.layer_pattern}`` its true layers (``~field``: the
        others), ``{i:@layer_kinds=M}`` those whose symbol is one of ``symbols``."""
        if symbols is None:
            return "{i:" + ("!" if self.negate else "") + "@" + self.path + "}"
        if self.negate or not symbols or any(c in "{}" for c in symbols):
            raise ConfigError(f"layer selector {self} = {symbols!r}: name the symbols to keep")
        return "{i:@" + self.path + "=" + symbols + "}"


#: A rule's condition: a :class:`SpecField`, a config path (deprecated: ``"path"`` truthy,
#: ``"!path"`` falsy), or None (always).
Condition = SpecField | str | None
#: One dimension of a declared shape: an int, a :class:`SpecField`, a config path
#: (deprecated), or None for "any".
Dim = int | SpecField | str | None


class Specs:
    """The model spec of a plan's NeMo config, built on first use and once (per config
    section: a mapping nested under a config prefix reads the spec of that section,
    :attr:`Mapping.spec_at`). A plan whose rules name no spec field never builds one (a
    CLIP config is not a decoder's)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self._built: dict[str, ModelSpec] = {}

    def at(self, path: str = "") -> ModelSpec:
        """The spec of the config section at ``path`` (a config prefix, ``""``: the whole)."""
        spec = self._built.get(path)
        if spec is None:
            section = cfg_get(self.cfg, path.rstrip(".")) if path else self.cfg
            if not isinstance(section, dict):
                raise ConfigError(f"the NeMo config has no section {path.rstrip('.')} to read a model spec from")
            spec = self._built[path] = spec_of(section)
        return spec


def condition_holds(cfg: dict[str, Any], when: Condition, spec: ModelSpec | None = None) -> bool:
    """Whether a rule's condition holds: a :class:`SpecField` on ``spec`` (None: the spec of
    ``cfg``), a config path ``"bias"`` when ``cfg.bias`` is truthy and ``"!bias"`` when it is
    not (deprecated), None always."""
    if when is None:
        return True
    if isinstance(when, SpecField):
        return when.holds(spec if spec is not None else spec_of(cfg))
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


_LAYER = re.compile(r"\{i(?::(!?@?[\w.]+)(?:=([^{}]+))?)?\}")


@functools.cache
def _selector_field(path: str) -> SpecField:
    return SpecField(path)


@dataclass(frozen=True)
class Axes:
    """What a name template's indices range over: ``{i}`` the layers (``{i:@FIELD}`` only the
    layers a per-layer field of the model spec selects — ``{i:@moe.layer_pattern}`` the
    mixture-of-experts layers, :meth:`SpecField.layers` writes it —, ``{i:!@FIELD}`` the
    others, ``{i:@FIELD=S}`` those whose symbol is one of ``S``: ``{i:@layer_kinds=M}`` a
    hybrid stack's Mamba layers; ``{i:PATH}``, ``{i:!PATH}``, ``{i:PATH=S}`` the same over a
    Megatron layer pattern at config ``PATH``, deprecated) and ``{e}`` the experts of a
    mixture-of-experts layer. ``spec`` gives the plan's model spec (None: read from ``cfg``)."""

    layers: int
    experts: int
    cfg: dict[str, Any]
    spec: Callable[[], ModelSpec] | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, cfg: dict[str, Any], layers: str, experts: str,
           spec: Callable[[], ModelSpec] | None = None) -> "Axes":
        """The axes for the layer and expert counts at config paths ``layers`` / ``experts``."""
        return cls(_count(cfg, layers), _count(cfg, experts), cfg, spec)

    def _pattern(self, selector: str) -> Any:
        """The per-layer pattern a selector names: a spec field (``@path``) or a config path."""
        if selector.startswith("@"):
            return _selector_field(selector[1:]).value(self.spec() if self.spec is not None else spec_of(self.cfg))
        return cfg_get(self.cfg, selector)

    def layer_indices(self, selector: str | None, symbols: str | None = None) -> list[int]:
        """The layers a ``{i:selector}`` (``{i:selector=symbols}``) template runs over."""
        if not selector:
            return list(range(self.layers))
        if symbols is not None:
            if selector.startswith("!"):
                raise ConfigError(f"layer selector {{i:{selector}={symbols}}}: negate the symbols instead")
            pattern = layer_symbols(self._pattern(selector), self.layers)
            return [i for i, s in enumerate(pattern) if s in symbols]
        negate = selector.startswith("!")
        chosen = layer_pattern(self._pattern(selector.lstrip("!")), self.layers)
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
