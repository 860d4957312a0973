"""Rules where Megatron fuses what Hugging Face keeps apart, or the reverse: the grouped
QKV (from q, k, v or from a packed ``[q; k; v]``), the gated fc1, fused experts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from nemo_convert.mapping import ops
from nemo_convert.mapping.rules.base import Condition, Dim, Parallel, cfg_get
from nemo_convert.mapping.rules.protocol import Direction, LazyFn, Origin, PlanContext, Rule, Task, TaskFn
from nemo_convert.tensors.pieces import Lazy, materialize

if TYPE_CHECKING:
    import torch

_GEOMETRY = ("heads", "groups", "head_dim", "hidden")


def qkv_geometry(cfg: dict[str, Any], heads: str, groups: str, head_dim: str, hidden: str) -> dict[str, int]:
    """Heads, query groups (default: heads) and head size (default: hidden / heads) at
    those config paths."""
    n_heads = int(cfg_get(cfg, heads))
    n_groups = int(cfg_get(cfg, groups, n_heads))
    dim = cfg_get(cfg, head_dim)
    if dim is None:
        dim = int(cfg_get(cfg, hidden)) // n_heads
    return {"heads": n_heads, "groups": n_groups, "head_dim": int(dim)}


@dataclass(frozen=True)
class FuseQKV(Rule):
    """HF q, k, v projections (weights or biases) ⇄ Megatron's grouped ``linear_qkv``."""

    hf_fields: ClassVar[tuple[str, ...]] = ("q", "k", "v")
    cfg_fields: ClassVar[tuple[str, ...]] = _GEOMETRY

    q: str
    k: str
    v: str
    nemo: str
    heads: str = "num_attention_heads"
    groups: str = "num_query_groups"
    head_dim: str = "kv_channels"
    hidden: str = "hidden_size"
    parallel: Parallel = Parallel.QKV
    when: Condition = None

    def geometry(self, cfg: dict[str, Any]) -> dict[str, int]:
        return qkv_geometry(cfg, self.heads, self.groups, self.head_dim, self.hidden)

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        geo, pool = self.geometry(ctx.cfg), ctx.pool
        # One pair of functions for every layer's task (they close over the rule's values only).
        fuse: TaskFn = lambda ts: (ops.fuse_qkv(ts[0], ts[1], ts[2], pool=pool, **geo),)  # noqa: E731
        fuse_lazy: LazyFn = lambda ts: (_fuse_qkv_lazy(ts, geo),)  # noqa: E731
        split: TaskFn = lambda ts: ops.split_qkv(ts[0], **geo)  # noqa: E731
        split_lazy: LazyFn = lambda ts: ops.split_qkv_lazy(ts[0], **geo)  # noqa: E731
        out = []
        for q, k, v, n in zip(*(ctx.names(x) for x in (self.q, self.k, self.v, self.nemo))):
            if direction == "to_nemo":
                out.append(Task((q, k, v), (n,), fuse, (self.parallel,), label="fuse_qkv", lazy_fn=fuse_lazy))
            else:
                out.append(Task((n,), (q, k, v), split, (Parallel.REPLICATED,) * 3, label="split_qkv",
                                lazy_fn=split_lazy))
        return out


@dataclass(frozen=True)
class PackedQKV(Rule):
    """One HF tensor holding ``[q; k; v]`` one after another (Phi-3's ``qkv_proj``) ⇄
    Megatron's grouped ``linear_qkv`` (interleaved per query group, like :class:`FuseQKV`).
    ``transposed``: HF stores the weight as a ``Conv1D`` ``[in, q|k|v]`` (GPT-2's
    ``c_attn``), Megatron's rows are its columns (:func:`~nemo_convert.mapping.ops.transpose_2d`)."""

    cfg_fields: ClassVar[tuple[str, ...]] = _GEOMETRY

    hf: str
    nemo: str
    heads: str = "num_attention_heads"
    groups: str = "num_query_groups"
    head_dim: str = "kv_channels"
    hidden: str = "hidden_size"
    parallel: Parallel = Parallel.QKV
    when: Condition = None
    transposed: bool = False

    def geometry(self, cfg: dict[str, Any]) -> dict[str, int]:
        return qkv_geometry(cfg, self.heads, self.groups, self.head_dim, self.hidden)

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        geo = self.geometry(ctx.cfg)
        op = ops.regroup_qkv_lazy if direction == "to_nemo" else ops.ungroup_qkv_lazy
        kind = self.parallel if direction == "to_nemo" else Parallel.REPLICATED
        pairs = ctx.pairs(self.hf, self.nemo, direction)
        if self.transposed:  # a new tensor either way: no deferred form
            fn: TaskFn
            if direction == "to_nemo":
                fn = (lambda ts: (materialize(ops.regroup_qkv_lazy(ops.transpose_2d(ts[0]), **geo)),))
            else:
                fn = (lambda ts: (ops.transpose_2d(ops.ungroup_qkv_lazy(ts[0], **geo)),))
            return [Task((src,), (dst,), fn, (kind,), label="packed_qkv_conv1d") for src, dst in pairs]
        whole: TaskFn = lambda ts: (materialize(op(ts[0], **geo)),)  # noqa: E731  (one for every task)
        lazy: LazyFn = lambda ts: (op(ts[0], **geo),)  # noqa: E731
        return [Task((src,), (dst,), whole, (kind,), label="packed_qkv", lazy_fn=lazy) for src, dst in pairs]


@dataclass(frozen=True)
class FuseGated(Rule):
    """HF gate and up projections ⇄ Megatron's gated ``linear_fc1`` = ``[gate; up]``; ``ffn``
    is the size of each half (a spec field, or a config path; None: half the rows)."""

    hf_fields: ClassVar[tuple[str, ...]] = ("gate", "up")
    cfg_fields: ClassVar[tuple[str, ...]] = ("ffn",)

    gate: str
    up: str
    nemo: str
    ffn: Dim = "ffn_hidden_size"
    parallel: Parallel = Parallel.GATED_FC1
    when: Condition = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        ffn = ctx.dim(self.ffn)
        ffn = int(ffn) if ffn is not None else None
        pool = ctx.pool
        # One pair of functions for every layer's (and expert's) task: they close over the
        # rule's values only, and a function pair per task was ~0.2 KiB of a plan per tensor.
        fuse: TaskFn = lambda ts: (ops.fuse_gated(ts[0], ts[1], ffn=ffn, pool=pool),)  # noqa: E731
        fuse_lazy: LazyFn = lambda ts: (ops.fuse_gated_lazy(*_two(ts), ffn=ffn),)  # noqa: E731
        split: TaskFn = lambda ts: tuple(materialize(t) for t in ops.split_gated(ts[0], ffn=ffn))  # noqa: E731
        split_lazy: LazyFn = lambda ts: ops.split_gated(ts[0], ffn=ffn)  # noqa: E731
        out = []
        for g, u, n in zip(*(ctx.names(x) for x in (self.gate, self.up, self.nemo))):
            if direction == "to_nemo":
                out.append(Task((g, u), (n,), fuse, (self.parallel,), label="fuse_gated", lazy_fn=fuse_lazy))
            else:
                out.append(Task((n,), (g, u), split, (Parallel.REPLICATED,) * 2, label="split_gated",
                                lazy_fn=split_lazy))
        return out


@dataclass(frozen=True)
class StackedExperts(Rule):
    """One HF tensor holding every expert of a layer on dim 0 (transformers v5's fused
    ``experts.gate_up_proj`` / ``experts.down_proj``) ⇄ one NeMo tensor per expert
    (``nemo`` has ``{e}``). ``parallel`` is the kind of each expert's NeMo tensor."""

    hf: str
    nemo: str
    parallel: Parallel = Parallel.REPLICATED
    when: Condition = None
    transpose: bool = False  # HF stores each expert as ``x @ W`` (GPT-OSS)
    interleaved: bool = False  # HF's gate/up rows alternate (GPT-OSS)

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        per_layer: dict[int | None, list[str]] = {}
        for i, n in ctx.expand(self.nemo):
            per_layer.setdefault(i, []).append(n)
        how = {"transpose": self.transpose, "interleaved": self.interleaved}
        stack: TaskFn = lambda ts: (materialize(ops.stack_experts_lazy(list(ts), **how)),)  # noqa: E731
        stack_lazy: LazyFn = lambda ts: (ops.stack_experts_lazy(list(ts), **how),)  # noqa: E731
        out = []
        for h, names in zip(ctx.names(self.hf), per_layer.values()):
            if direction == "to_nemo":
                lazy, fn = _unstack(len(names), how)
                out.append(Task((h,), tuple(names), fn, (self.parallel,) * len(names), label="unstack_experts",
                                lazy_fn=lazy))
            else:
                out.append(Task(tuple(names), (h,), stack, (Parallel.REPLICATED,), label="stack_experts",
                                lazy_fn=stack_lazy))
        return out

    def origins(self, ctx: PlanContext) -> dict[str, Origin]:
        """Expert ``e``'s NeMo tensor is slot ``e`` of the layer's stacked HF tensor."""
        per_layer: dict[int | None, list[str]] = {}
        for i, n in ctx.expand(self.nemo):
            per_layer.setdefault(i, []).append(n)
        return {n: Origin((h,), slot=e) for h, names in zip(ctx.names(self.hf), per_layer.values())
                for e, n in enumerate(names)}


def _unstack(experts: int, how: dict[str, bool]) -> tuple[LazyFn, TaskFn]:
    """The deferred and the tensor form of one layer's unstacking into ``experts`` tensors."""
    def lazy(ts: Sequence[Lazy]) -> Sequence[Lazy]:
        return ops.unstack_experts(ts[0], experts=experts, **how)

    def fn(ts: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        return tuple(materialize(t) for t in lazy(ts))
    return lazy, fn


def _fuse_qkv_lazy(ts: Sequence[Lazy], geo: dict[str, int]) -> Lazy:
    """:func:`~nemo_convert.mapping.ops.fuse_qkv_lazy` of a task's q, k, v (source tensors
    as they are; deferred pieces, which no rule feeds a fusion today, copied into one)."""
    q, k, v = ts
    return ops.fuse_qkv_lazy(materialize(q), materialize(k), materialize(v), **geo)


def _two(ts: Sequence[Lazy]) -> tuple[torch.Tensor, torch.Tensor]:
    """A deferred fusion's two inputs as tensors (as in :func:`_fuse_qkv_lazy`)."""
    a, b = ts
    return materialize(a), materialize(b)
