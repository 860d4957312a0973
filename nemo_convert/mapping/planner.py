"""Turns a family's mapping into a checked plan before any tensor byte is read.

The plan lists every task (inputs → outputs with a pure function), proves that every
source tensor is consumed and every target tensor produced, and knows every output's
shape and dtype (computed by running the ops on ``meta`` tensors and checked against the
config). Only then does the engine stream.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import torch

from nemo_convert.errors import ConfigError, MappingError, ShapeError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import (Custom, FuseGated, FuseQKV, Mapping, Offset, PackedQKV, Parallel, Rename,
                                        Reshape, Rule, StackedExperts, Tied, cfg_get, condition_holds,
                                        layer_pattern)
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.pieces import Lazy, materialize

Direction = Literal["to_nemo", "to_hf"]
TaskFn = Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]
LazyFn = Callable[[Sequence[Lazy]], Sequence[Lazy]]


def _same(ts: Sequence[Lazy]) -> tuple[Lazy]:
    return (ts[0],)


@dataclass
class Task:
    """One unit of work: read ``inputs``, apply ``fn``, emit ``outputs``."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: TaskFn
    parallel: tuple[Parallel, ...]  # per output (NeMo side), REPLICATED on the HF side
    infos: tuple[TensorInfo, ...] = ()
    label: str = ""
    check_equal: bool = False  # a Tied check: inputs must be equal; no outputs
    #: ``fn`` in its deferred form, where it only rearranges rows: takes tensors or
    #: :class:`~nemo_convert.tensors.pieces.Pieces` and may return pieces (engine ``lazy`` runs)
    lazy_fn: LazyFn | None = None

    @property
    def out_bytes(self) -> int:
        return sum(i.nbytes for i in self.infos)


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

    def parallel_of(self) -> dict[str, Parallel]:
        return {o: p for t in self.tasks for o, p in zip(t.outputs, t.parallel)}

    @property
    def total_bytes(self) -> int:
        return sum(t.out_bytes for t in self.tasks)


def _layer_count(cfg: dict[str, Any], path: str) -> int:
    value = cfg_get(cfg, path, 0) or 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config field {path} = {value!r} is not a layer count") from None


@dataclass(frozen=True)
class Axes:
    """What a name template's indices range over: ``{i}`` the layers (``{i:PATH}`` only the
    layers a Megatron layer pattern at config ``PATH`` selects, ``{i:!PATH}`` the others)
    and ``{e}`` the experts of a mixture-of-experts layer."""

    layers: int
    experts: int
    cfg: dict[str, Any]

    @classmethod
    def of(cls, cfg: dict[str, Any], part: Mapping) -> "Axes":
        return cls(_layer_count(cfg, part.layers), _layer_count(cfg, part.experts), cfg)

    def layer_indices(self, selector: str | None) -> list[int]:
        if not selector:
            return list(range(self.layers))
        negate = selector.startswith("!")
        chosen = layer_pattern(cfg_get(self.cfg, selector.lstrip("!")), self.layers)
        return [i for i, on in enumerate(chosen) if on != negate]


_LAYER = re.compile(r"\{i(?::(!?[\w.]+))?\}")


def _expand(name: str, axes: Axes) -> list[tuple[int | None, str]]:
    """Every concrete name of a template, layer-major then expert (the same order for
    every template of a rule, so that a rule's names pair up by position)."""
    m = _LAYER.search(name)
    names: list[tuple[int | None, str]] = ([(i, name[:m.start()] + str(i) + name[m.end():])
                                             for i in axes.layer_indices(m[1])] if m else [(None, name)])
    if "{e}" in name:
        return [(i, n.replace("{e}", str(e))) for i, n in names for e in range(axes.experts)]
    return names


def _rule_tasks(rule: Rule, cfg: dict[str, Any], direction: Direction, layers: Axes,
                pool: ops.BufferPool) -> list[Task]:
    """The tasks one rule expands to, for one direction."""
    to_nemo = direction == "to_nemo"
    tasks: list[Task] = []
    if isinstance(rule, Rename):
        for (_, h), (_, n) in zip(_expand(rule.hf, layers), _expand(rule.nemo, layers)):
            src, dst = (h, n) if to_nemo else (n, h)
            tasks.append(Task((src,), (dst,), _same, (rule.parallel if to_nemo else Parallel.REPLICATED,),
                              label="rename", lazy_fn=_same))
    elif isinstance(rule, Reshape):
        shape = rule.resolve(cfg, "nemo" if to_nemo else "hf")
        for (_, h), (_, n) in zip(_expand(rule.hf, layers), _expand(rule.nemo, layers)):
            src, dst = (h, n) if to_nemo else (n, h)
            fn = (lambda ts, s=shape: (ts[0].reshape(s),))
            tasks.append(Task((src,), (dst,), fn, (rule.parallel if to_nemo else Parallel.REPLICATED,),
                              label="reshape", lazy_fn=fn))
    elif isinstance(rule, FuseQKV):
        geo = rule.geometry(cfg)
        qs, ks, vs, ns = (_expand(x, layers) for x in (rule.q, rule.k, rule.v, rule.nemo))
        for (_, q), (_, k), (_, v), (_, n) in zip(qs, ks, vs, ns):
            if to_nemo:
                tasks.append(Task((q, k, v), (n,), lambda ts, g=geo: (ops.fuse_qkv(*ts, **g, pool=pool),),
                                  (rule.parallel,), label="fuse_qkv",
                                  lazy_fn=lambda ts, g=geo: (ops.fuse_qkv_lazy(*ts, **g),)))
            else:
                tasks.append(Task((n,), (q, k, v), lambda ts, g=geo: ops.split_qkv(ts[0], **g),
                                  (Parallel.REPLICATED,) * 3, label="split_qkv",
                                  lazy_fn=lambda ts, g=geo: ops.split_qkv_lazy(ts[0], **g)))
    elif isinstance(rule, PackedQKV):
        geo = rule.geometry(cfg)
        for (_, h), (_, n) in zip(_expand(rule.hf, layers), _expand(rule.nemo, layers)):
            op = ops.regroup_qkv_lazy if to_nemo else ops.ungroup_qkv_lazy
            src, dst = (h, n) if to_nemo else (n, h)
            tasks.append(Task((src,), (dst,), lambda ts, f=op, g=geo: (materialize(f(ts[0], **g)),),
                              (rule.parallel if to_nemo else Parallel.REPLICATED,), label="packed_qkv",
                              lazy_fn=lambda ts, f=op, g=geo: (f(ts[0], **g),)))
    elif isinstance(rule, Offset):
        delta = rule.value if to_nemo else -rule.value
        for (_, h), (_, n) in zip(_expand(rule.hf, layers), _expand(rule.nemo, layers)):
            src, dst = (h, n) if to_nemo else (n, h)
            tasks.append(Task((src,), (dst,), lambda ts, d=delta: (ops.add_scalar(ts[0], d),),
                              (rule.parallel if to_nemo else Parallel.REPLICATED,), label="offset"))
    elif isinstance(rule, FuseGated):
        ffn = cfg_get(cfg, rule.ffn)
        ffn = int(ffn) if ffn is not None else None
        gs, us, ns = (_expand(x, layers) for x in (rule.gate, rule.up, rule.nemo))
        for (_, g), (_, u), (_, n) in zip(gs, us, ns):
            if to_nemo:
                tasks.append(Task((g, u), (n,), lambda ts, f=ffn: (ops.fuse_gated(ts[0], ts[1], ffn=f, pool=pool),),
                                  (rule.parallel,), label="fuse_gated",
                                  lazy_fn=lambda ts, f=ffn: (ops.fuse_gated_lazy(ts[0], ts[1], ffn=f),)))
            else:
                fn = (lambda ts, f=ffn: ops.split_gated(ts[0], ffn=f))
                tasks.append(Task((n,), (g, u), fn, (Parallel.REPLICATED,) * 2, label="split_gated", lazy_fn=fn))
    elif isinstance(rule, StackedExperts):
        per_layer: dict[int | None, list[str]] = {}
        for i, n in _expand(rule.nemo, layers):
            per_layer.setdefault(i, []).append(n)
        for (_, h), names in zip(_expand(rule.hf, layers), per_layer.values()):
            how = {"transpose": rule.transpose, "interleaved": rule.interleaved}
            if to_nemo:
                lazy = (lambda ts, k=len(names), w=how: ops.unstack_experts(ts[0], experts=k, **w))
                tasks.append(Task((h,), tuple(names), lambda ts, f=lazy: tuple(materialize(t) for t in f(ts)),
                                  (rule.parallel,) * len(names), label="unstack_experts", lazy_fn=lazy))
            else:
                tasks.append(Task(tuple(names), (h,),
                                  lambda ts, w=how: (materialize(ops.stack_experts_lazy(list(ts), **w)),),
                                  (Parallel.REPLICATED,), label="stack_experts",
                                  lazy_fn=lambda ts, w=how: (ops.stack_experts_lazy(list(ts), **w),)))
    elif isinstance(rule, Custom):
        par = rule.parallel if isinstance(rule.parallel, tuple) else (rule.parallel,) * len(rule.nemo)
        hf_lists = [[x for _, x in _expand(h, layers)] for h in rule.hf]
        nemo_lists = [[x for _, x in _expand(n, layers)] for n in rule.nemo]
        count = max([len(x) for x in hf_lists + nemo_lists] or [1])
        for j in range(count):
            hf_keys = tuple(lst[j if len(lst) > 1 else 0] for lst in hf_lists)
            nemo_keys = tuple(lst[j if len(lst) > 1 else 0] for lst in nemo_lists)
            if to_nemo:
                tasks.append(Task(hf_keys, nemo_keys, lambda ts, f=rule.to_nemo: tuple(f(ts, cfg)),
                                  tuple(par), label="custom"))
            else:
                tasks.append(Task(nemo_keys, hf_keys, lambda ts, f=rule.to_hf: tuple(f(ts, cfg)),
                                  (Parallel.REPLICATED,) * len(hf_keys), label="custom"))
    elif isinstance(rule, Tied):
        if to_nemo:
            for (_, a), (_, b) in zip(_expand(rule.hf, layers), _expand(rule.same_as, layers)):
                tasks.append(Task((a, b), (), lambda ts: (), (), label="tied", check_equal=True))
    else:  # pragma: no cover - guarded by typing
        raise TypeError(f"unknown rule {rule!r}")
    return tasks


def _check_declared_shape(rule: Rule, nemo_info: TensorInfo, cfg: dict[str, Any]) -> None:
    if not isinstance(rule, Rename) or rule.shape is None:
        return
    want: list[Any] = []
    for s in rule.shape:
        want.append(cfg_get(cfg, s) if isinstance(s, str) else s)
    ok = len(want) == len(nemo_info.shape) and all(w is None or int(w) == d
                                                   for w, d in zip(want, nemo_info.shape))
    if not ok:
        desc = ", ".join(f"{s}={w}" if isinstance(s, str) else str(s) for s, w in zip(rule.shape, want))
        raise ShapeError(f"{nemo_info.name} has shape {list(nemo_info.shape)}, but the config implies [{desc}]")


def plan_conversion(mapping: Mapping, cfg: dict[str, Any], source: TensorSource, direction: Direction,
                    *, allow_unmapped: Sequence[str] = ()) -> Plan:
    """Build and check the plan that converts ``source`` in ``direction``.

    :raises MappingError: listing source tensors not consumed and target tensors whose
        inputs are missing.
    :raises ShapeError: when a tensor contradicts the config.
    """
    available = set(source.keys())
    pool = ops.BufferPool()
    tasks: list[Task] = []
    unproduced: list[str] = []
    drops: list[str] = []
    rule_of: dict[int, Rule] = {}
    for part in mapping.parts():
        layers = Axes.of(cfg, part)
        for rule in part.rules:
            if not condition_holds(cfg, rule.when):
                continue
            for task in _rule_tasks(rule, cfg, direction, layers, pool):
                missing = [k for k in task.inputs if k not in available]
                if task.check_equal:
                    if task.inputs[0] in available and not missing:
                        tasks.append(task)
                    continue
                if missing:
                    unproduced.extend(f"{o} (needs {', '.join(missing)})" for o in task.outputs)
                    continue
                rule_of[id(task)] = rule
                tasks.append(task)
        patterns = part.drop_hf if direction == "to_nemo" else part.drop_nemo
        for pat in patterns:
            drops.extend(x for _, x in _expand(pat, layers))

    consumed: dict[str, int] = {}
    for t in tasks:
        for k in t.inputs if not t.check_equal else t.inputs[:1]:
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
    for t in tasks:
        if t.check_equal:
            a, b = (source.info(k) for k in t.inputs)
            if a.shape != b.shape:
                raise ShapeError(f"{a.name} {list(a.shape)} should equal {b.name} {list(b.shape)} (tied)")
            continue
        metas = [torch.empty(source.info(k).shape, dtype=source.info(k).dtype, device="meta") for k in t.inputs]
        try:
            outs = t.fn(metas)
        except ShapeError as exc:
            raise ShapeError(f"{', '.join(t.inputs)} → {', '.join(t.outputs)}: {exc}") from None
        if len(outs) != len(t.outputs):
            raise MappingError(f"a {t.label} op returned {len(outs)} tensors for {len(t.outputs)} outputs")
        t.infos = tuple(TensorInfo(n, tuple(o.shape), o.dtype) for n, o in zip(t.outputs, outs))
        rule = rule_of.get(id(t))
        if rule is not None:
            nemo_side = t.infos if direction == "to_nemo" else tuple(source.info(k) for k in t.inputs)
            for info in nemo_side:
                _check_declared_shape(rule, info, cfg)
        dup = produced.intersection(t.outputs)
        if dup:
            raise MappingError(f"the mapping produces tensors more than once: {', '.join(sorted(dup))}")
        produced.update(t.outputs)
    order = {k: i for i, k in enumerate(source.keys())}
    groups = {k: source.group(k) for k in source.keys()}
    # Read one source file at a time; within it, in file order.
    tasks.sort(key=lambda t: (groups.get(t.inputs[0], ""), order.get(t.inputs[0], 0)) if t.inputs else ("", 0))
    return Plan(direction, tasks, dropped, pool=pool)


def nemo_parallel_kinds(mapping: Mapping, cfg: dict[str, Any]) -> dict[str, Parallel]:
    """The tensor-parallel kind of every NeMo tensor the mapping can produce (no I/O)."""
    kinds: dict[str, Parallel] = {}
    for part in mapping.parts():
        layers = Axes.of(cfg, part)
        for rule in part.rules:
            if isinstance(rule, Tied) or not condition_holds(cfg, rule.when):
                continue
            if isinstance(rule, Custom):
                par = rule.parallel if isinstance(rule.parallel, tuple) else (rule.parallel,) * len(rule.nemo)
                for name, p in zip(rule.nemo, par):
                    for _, n in _expand(name, layers):
                        kinds[n] = p
                continue
            for _, n in _expand(rule.nemo, layers):
                kinds[n] = rule.parallel
    return kinds


def identity_plan(source: TensorSource, kinds: dict[str, Parallel]) -> Plan:
    """Every tensor of ``source`` copied unchanged (resharding, layout changes)."""
    tasks = [Task((k,), (k,), _same, (kinds.get(k, Parallel.REPLICATED),), (source.info(k),),
                  label="copy", lazy_fn=_same) for k in source.keys()]
    groups = {k: source.group(k) for k in source.keys()}
    order = {k: i for i, k in enumerate(source.keys())}
    tasks.sort(key=lambda t: (groups[t.inputs[0]], order[t.inputs[0]]))
    return Plan("to_nemo", tasks)
