"""The rule protocol: what a rule gives the planner and what it is given.

A rule is a frozen dataclass that *declares* names (templates, config paths) and knows
how to plan itself: :meth:`Rule.tasks` expands it, for one section of a mapping and one
direction, into :class:`Task` s (inputs → pure function → outputs, with the function's
deferred form where it only rearranges rows). The planner knows no rule type: it calls
these methods, proves coverage, runs every task on ``meta`` tensors and calls
:meth:`Rule.check` on the result. A new rule type — in the core or in a plugin — is a
subclass of :class:`Rule`; nothing else is edited.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Sequence, TYPE_CHECKING, TypeVar

from nemo_convert.mapping.ops import BufferPool
from nemo_convert.mapping.rules.base import (Axes, Condition, Dim, Kind, Parallel, SpecField, Specs, cfg_get,
                                             condition_holds, prefix_name, prefix_path)
from nemo_convert.spec.model import ModelSpec
from nemo_convert.tensors.base import TensorInfo
from nemo_convert.tensors.pieces import Lazy

if TYPE_CHECKING:
    import torch

Direction = Literal["to_nemo", "to_hf"]
TaskFn = Callable[[Sequence["torch.Tensor"]], Sequence["torch.Tensor"]]
LazyFn = Callable[[Sequence[Lazy]], Sequence[Lazy]]


_T = TypeVar("_T")


def same(ts: Sequence[_T]) -> tuple[_T]:
    """The identity task function (its own deferred form: tensors in, tensors out; pieces
    in, pieces out)."""
    return (ts[0],)


@dataclass(slots=True)
class Task:
    """One unit of work: read ``inputs``, apply ``fn``, emit ``outputs``."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: TaskFn
    parallel: tuple[Kind, ...]  # per output (NeMo side), REPLICATED on the HF side
    infos: tuple[TensorInfo, ...] = ()
    label: str = ""
    check_equal: bool = False  # an equality check (Tied): the inputs must be equal; no outputs
    #: why they must be equal (the end of the error when they are not)
    why_equal: str = "the config says the embeddings are tied"
    #: ``fn`` in its deferred form, where it only rearranges rows: takes tensors or
    #: :class:`~nemo_convert.tensors.pieces.Pieces` and may return pieces (engine ``lazy`` runs)
    lazy_fn: LazyFn | None = None
    #: skipped (not an error) when an input is missing from the source
    optional: bool = False
    #: the inputs this task accounts for (None: all); the others are read, and consumed elsewhere
    consumes: tuple[str, ...] | None = None

    @property
    def out_bytes(self) -> int:
        return sum(i.nbytes for i in self.infos)

    @property
    def consumed(self) -> tuple[str, ...]:
        return self.inputs if self.consumes is None else self.consumes


@dataclass(frozen=True)
class Origin:
    """Where one NeMo tensor comes from on the Hugging Face side (:meth:`Rule.origins`).

    ``parts`` are the HF tensors it is made of: one per part along dim 0, in the NeMo
    tensor's order (``FuseQKV``: q, k, v; ``FuseGated``: gate, up), or one for the whole
    (a rename, a packed ``[q; k; v]``). ``slot`` is its index on dim 0 of a stacked HF
    tensor (fused experts: expert ``e`` of ``experts.gate_up_proj``), else None. A target
    that needs to know which HF modules feed a NeMo tensor (calibration statistics, the
    K and V of a KV-cache scale) asks this, never the rule's type.
    """

    parts: tuple[str, ...]
    slot: int | None = None


@dataclass(frozen=True)
class PlanContext:
    """What a rule plans against: the NeMo config and its typed model spec (built on first
    use, once per plan: ``specs``; of the config section at ``spec_at`` for a mapping
    nested under a config prefix), what the name templates of its mapping section range
    over, and the buffers fused outputs may reuse."""

    cfg: dict[str, Any]
    axes: Axes
    pool: BufferPool | None = None
    spec_at: str = ""
    specs: Specs | None = field(default=None, compare=False, repr=False)

    def _specs(self) -> Specs:
        specs = self.specs
        if specs is None:  # a context made without the plan's cache: its own
            specs = Specs(self.cfg)
            object.__setattr__(self, "specs", specs)
        return specs

    @property
    def spec(self) -> ModelSpec:
        """The typed model spec of the config (section) the rules read."""
        spec: ModelSpec | None = self.__dict__.get("_spec")
        if spec is None:
            spec = self._specs().at(self.spec_at)
            object.__setattr__(self, "_spec", spec)
        return spec

    def holds(self, when: Condition) -> bool:
        """Whether a rule's condition holds (:func:`~nemo_convert.mapping.rules.base.condition_holds`)."""
        if when is None or isinstance(when, str):
            return condition_holds(self.cfg, when)
        return when.holds(self.spec)

    def dims(self, shape: tuple[Dim, ...]) -> tuple[Any, ...]:
        """Every entry of a declared shape by :meth:`dim`, worked out once per context (a
        rule checks each of its tasks against the same shape)."""
        cache: dict[tuple[Dim, ...], tuple[Any, ...]] | None = self.__dict__.get("_dims")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_dims", cache)
        got = cache.get(shape)
        if got is None:
            got = cache[shape] = tuple(self.dim(d) for d in shape)
        return got

    def dim(self, d: Dim) -> Any:
        """One dimension of a declared shape: an int as is, a spec field's value, a config
        path's value (deprecated); None (and a field or path without a value): any."""
        if d is None or isinstance(d, int):
            return d
        if isinstance(d, SpecField):
            return d.value(self.spec)
        return cfg_get(self.cfg, d)

    def expand(self, template: str) -> list[tuple[int | None, str]]:
        """Every concrete name of ``template`` with its layer (None without ``{i}``)."""
        return self.axes.expand(template)

    def names(self, template: str) -> list[str]:
        """Every concrete name of ``template``."""
        return [n for _, n in self.axes.expand(template)]

    def pairs(self, a: str, b: str, direction: Direction) -> list[tuple[str, str]]:
        """The concrete (source, target) names of an HF template ``a`` and a NeMo template
        ``b`` that pair up by position, for ``direction``."""
        out = []
        for h, n in zip(self.names(a), self.names(b)):
            out.append((h, n) if direction == "to_nemo" else (n, h))
        return out


R = TypeVar("R", bound="Rule")
NameFn = Callable[[str], str]


def _keep(name: str) -> str:
    return name


def _map_field(value: Any, fn: NameFn) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(fn(v) if isinstance(v, str) else v for v in value)
    return value


class Rule(ABC):
    """A mapping rule. Subclasses are frozen dataclasses holding names and config paths.

    The fields named by :attr:`hf_fields`, :attr:`nemo_fields` and :attr:`cfg_fields`
    (each a string, a tuple of strings, or None; non-string tuple entries are kept) are
    what :meth:`prefixed` and :meth:`renamed` rewrite (their config-path strings; a
    :class:`SpecField` is kept); ``when`` is a condition (:data:`Condition`).
    """

    #: the fields holding HF name templates
    hf_fields: ClassVar[tuple[str, ...]] = ("hf",)
    #: the fields holding NeMo name templates
    nemo_fields: ClassVar[tuple[str, ...]] = ("nemo",)
    #: the fields holding config paths (besides ``when``)
    cfg_fields: ClassVar[tuple[str, ...]] = ()
    #: the condition: a :class:`SpecField` (``~`` negates), a config path (deprecated:
    #: ``"path"`` truthy, ``"!path"`` falsy); None: always
    when: Condition = None

    @abstractmethod
    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        """The tasks this rule expands to in ``direction``, over ``ctx``'s axes. Every
        task's ``fn`` is pure and works on ``meta`` tensors; give ``lazy_fn`` where it only
        rearranges rows (written once, in its deferred form)."""

    def applies(self, ctx: PlanContext) -> bool:
        """Whether the rule applies to the config and spec of ``ctx`` (its ``when``)."""
        return ctx.holds(self.when)

    def nemo_kinds(self, ctx: PlanContext) -> dict[str, Parallel]:
        """The tensor-parallel kind of every NeMo tensor the rule can produce (no I/O).
        Default: each name of each NeMo field, of kind ``self.parallel``."""
        kind = getattr(self, "parallel", Parallel.REPLICATED)
        kinds: dict[str, Parallel] = {}
        for name in self.nemo_names():
            for n in ctx.names(name):
                kinds[n] = kind
        return kinds

    def check(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], ctx: PlanContext,
              direction: Direction) -> None:
        """Checks one of its planned tasks — the infos of its inputs, and of its outputs as
        the ``meta`` run computed them — against the config; raises ``ShapeError``.
        Default: nothing beyond what the task's function checks."""

    def origins(self, ctx: PlanContext) -> dict[str, Origin]:
        """Where each NeMo tensor the rule makes comes from on the HF side (:class:`Origin`),
        names only (no source). Default: the inputs of its ``to_nemo`` tasks, in order, for
        each output; a rule whose NeMo tensors are slots of one HF tensor says so."""
        out: dict[str, Origin] = {}
        for task in self.tasks(ctx, "to_nemo"):
            for name in task.outputs:
                out[name] = Origin(tuple(task.inputs))
        return out

    def aliases(self, ctx: PlanContext) -> dict[str, str]:
        """HF tensors the rule declares equal to another HF tensor (name → the name it
        equals): not stored on the NeMo side, checked on import (:class:`Tied`)."""
        return {}

    def hf_names(self) -> list[str]:
        """The HF name templates the rule reads or writes, in field order."""
        return _names(self, self.hf_fields)

    def nemo_names(self) -> list[str]:
        """The NeMo name templates, in field order."""
        return _names(self, self.nemo_fields)

    def renamed(self: R, *, hf: NameFn = _keep, nemo: NameFn = _keep, cfg: NameFn = _keep) -> R:
        """This rule with every HF name, NeMo name and config path passed through a function."""
        changes = {f: _map_field(getattr(self, f), hf) for f in self.hf_fields}
        changes.update({f: _map_field(getattr(self, f), nemo) for f in self.nemo_fields})
        changes.update({f: _map_field(getattr(self, f), cfg) for f in (*self.cfg_fields, "when")
                        if f in {x.name for x in dataclasses.fields(self)}})  # type: ignore[arg-type]
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Rule":
        """This rule under name and config prefixes (:meth:`Mapping.nested`)."""
        return self.renamed(hf=lambda n: prefix_name(hf, n), nemo=lambda n: prefix_name(nemo, n),
                            cfg=lambda p: prefix_path(cfg, p) or p)


def _names(rule: Rule, fields: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for f in fields:
        v = getattr(rule, f)
        out.extend(x for x in (v if isinstance(v, tuple) else (v,)) if isinstance(x, str))
    return out
