"""Turns a family's mapping into a checked plan before any tensor byte is read.

The plan lists every task (inputs → outputs with a pure function), proves that every
source tensor is consumed and every target tensor produced, and knows every output's
shape and dtype (computed by running the ops on ``meta`` tensors and checked against the
config). Only then does the engine stream. The planner knows no rule type: each rule
expands itself into tasks and checks them (:mod:`nemo_convert.mapping.rules.protocol`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Sequence

from nemo_convert.errors import MappingError, ShapeError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import Mapping, Parallel, Rule
from nemo_convert.mapping.rules.base import Kind, Specs
from nemo_convert.mapping.rules.protocol import (
    Direction,
    LazyFn,
    Origin,
    PlanContext,
    Task,
    TaskFn,
    same,
)
from nemo_convert.tensors.base import TensorInfo, TensorSource

__all__ = ["Direction", "LazyFn", "Origin", "Plan", "Task", "TaskFn", "identity_plan", "nemo_origins",
           "nemo_parallel_kinds", "plan_conversion"]


@dataclass
class Plan:
    """Every task of a conversion, in execution order, with coverage proven."""

    direction: Direction
    tasks: list[Task]
    dropped: list[str] = field(default_factory=list)
    check_finite: bool = False  # count NaN/Inf in every floating output while streaming
    pool: ops.BufferPool = field(default_factory=ops.BufferPool)  # reused fused-output buffers

    def outputs(self) -> list[TensorInfo]:
        return [i for t in self.tasks for i in t.infos]

    def parallel_of(self) -> dict[str, Kind]:
        return {o: p for t in self.tasks for o, p in zip(t.outputs, t.parallel)}

    @property
    def total_bytes(self) -> int:
        return sum(t.out_bytes for t in self.tasks)


def plan_conversion(mapping: Mapping, cfg: dict[str, Any], source: TensorSource, direction: Direction,
                    *, allow_unmapped: Sequence[str] = ()) -> Plan:
    """Build and check the plan that converts ``source`` in ``direction``.

    :raises MappingError: listing source tensors not consumed and target tensors whose
        inputs are missing.
    :raises ShapeError: when a tensor contradicts the config.
    """
    import torch
    available = set(source.keys())
    pool = ops.BufferPool()
    tasks: list[Task] = []
    unproduced: list[str] = []
    drops: list[str] = []
    rule_of: dict[int, tuple[Rule, PlanContext]] = {}
    specs = Specs(cfg)  # the typed model spec, built once if a rule reads it
    for part in mapping.parts():
        ctx = part.context(cfg, specs, pool)
        for rule in part.rules:
            if not rule.applies(ctx):
                continue
            for task in rule.tasks(ctx, direction):
                missing = [k for k in task.inputs if k not in available]
                if missing:
                    if not task.optional:
                        unproduced.extend(f"{o} (needs {', '.join(missing)})" for o in task.outputs)
                    continue
                rule_of[id(task)] = (rule, ctx)
                tasks.append(task)
        patterns = part.drop_hf if direction == "to_nemo" else part.drop_nemo
        for pat in patterns:
            drops.extend(ctx.names(pat))

    consumed: dict[str, int] = {}
    for t in tasks:
        for k in t.consumed:
            consumed[k] = consumed.get(k, 0) + 1
    twice = [k for k, n in consumed.items() if n > 1]
    if twice:
        raise MappingError(f"the mapping consumes tensors more than once: {', '.join(sorted(twice))}")
    dropped: list[str] = []
    unconsumed: list[str] = []
    for k in source.keys():
        if k in consumed:
            continue
        if any(fnmatch.fnmatchcase(k, d) for d in drops) or any(fnmatch.fnmatchcase(k, p) for p in allow_unmapped):
            dropped.append(k)
        else:
            unconsumed.append(k)
    if unconsumed or unproduced:
        raise MappingError("the checkpoint does not match the model family's mapping",
                           unconsumed=unconsumed, unproduced=unproduced)

    produced: set[str] = set()
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct output shape
    for t in tasks:
        ins = [source.info(k) for k in t.inputs]
        rule, ctx = rule_of[id(t)]
        metas = [torch.empty(i.shape, dtype=i.dtype, device="meta") for i in ins]
        try:
            outs = t.fn(metas)
        except ShapeError as exc:
            raise ShapeError(f"{', '.join(t.inputs)} → {', '.join(t.outputs)}: {exc}") from None
        if len(outs) != len(t.outputs):
            raise MappingError(f"a {t.label} op returned {len(outs)} tensors for {len(t.outputs)} outputs")
        t.infos = tuple(TensorInfo(n, shapes.setdefault(tuple(o.shape), tuple(o.shape)), o.dtype)
                        for n, o in zip(t.outputs, outs))
        rule.check(ins, t.infos, ctx, direction)
        dup = produced.intersection(t.outputs)
        if dup:
            raise MappingError(f"the mapping produces tensors more than once: {', '.join(sorted(dup))}")
        produced.update(t.outputs)
    order = {k: i for i, k in enumerate(source.keys())}
    groups = {k: source.group(k) for k in source.keys()}
    # Read one source file at a time; within it, in file order.
    tasks.sort(key=lambda t: (groups.get(t.inputs[0], ""), order.get(t.inputs[0], 0)) if t.inputs else ("", 0))
    return Plan(direction, tasks, dropped, pool=pool)


def _applying_rules(mapping: Mapping, cfg: dict[str, Any]) -> Iterator[tuple[Rule, PlanContext]]:
    """Every rule of the mapping that applies to ``cfg``, with its part's plan context."""
    specs = Specs(cfg)
    for part in mapping.parts():
        ctx = part.context(cfg, specs)
        for rule in part.rules:
            if rule.applies(ctx):
                yield rule, ctx


def nemo_parallel_kinds(mapping: Mapping, cfg: dict[str, Any]) -> dict[str, Kind]:
    """The tensor-parallel kind of every NeMo tensor the mapping can produce (no I/O)."""
    kinds: dict[str, Kind] = {}
    for rule, ctx in _applying_rules(mapping, cfg):
        kinds.update(rule.nemo_kinds(ctx))
    return kinds


def nemo_origins(mapping: Mapping, cfg: dict[str, Any]) -> dict[str, Origin]:
    """Where every NeMo tensor the mapping can produce comes from on the HF side (no I/O):
    :meth:`Rule.origins` of every rule that applies."""
    origins: dict[str, Origin] = {}
    for rule, ctx in _applying_rules(mapping, cfg):
        origins.update(rule.origins(ctx))
    return origins


def _copy_tasks(source: TensorSource, kinds: dict[str, Kind]) -> list[Task]:
    # One tuple for a task's input and output names, one per kind (a task per tensor).
    one: dict[Any, Any] = {}
    tasks = []
    for k in source.keys():
        names, kind = (k,), (kinds.get(k, Parallel.REPLICATED),)
        tasks.append(Task(names, names, same, one.setdefault(kind, kind), (source.info(k),), label="copy",
                          lazy_fn=same))
    groups = {k: source.group(k) for k in source.keys()}
    order = {k: i for i, k in enumerate(source.keys())}
    tasks.sort(key=lambda t: (groups[t.inputs[0]], order[t.inputs[0]]))
    return tasks


class IdentityPlan(Plan):
    """:func:`identity_plan`'s plan: its tasks are made when first read (a writer that
    reads the source under the same names, e.g. the ``hf`` target through
    :func:`~nemo_convert.mapping.plan_view.plan_view`, never pays for them: 0.5 s at
    31k tensors)."""

    def __init__(self, source: TensorSource, kinds: dict[str, Kind]) -> None:
        self._source, self._kinds = source, kinds
        self._tasks: list[Task] | None = None
        super().__init__("to_nemo", [])

    @property  # type: ignore[override]
    def tasks(self) -> list[Task]:
        if self._tasks is None:
            self._tasks = _copy_tasks(self._source, self._kinds)
        return self._tasks

    @tasks.setter
    def tasks(self, value: list[Task]) -> None:
        if value or self._tasks is not None:  # Plan.__init__'s [] leaves them to be made
            self._tasks = value

    def copies(self, source: TensorSource) -> bool:
        """Whether this plan is still every tensor of ``source`` unchanged: its tasks were
        never handed out (so nothing re-typed them) and it was made over ``source``."""
        return self._tasks is None and self._source is source


def identity_plan(source: TensorSource, kinds: dict[str, Kind]) -> IdentityPlan:
    """Every tensor of ``source`` copied unchanged (resharding, layout changes); the
    tasks are made when first read (:class:`IdentityPlan`)."""
    return IdentityPlan(source, kinds)
