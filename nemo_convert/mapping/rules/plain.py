"""Rules where one HF tensor is one NeMo tensor: renamed, reshaped, or offset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from nemo_convert.errors import ShapeError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules.base import Condition, Dim, Kind, Parallel, SpecField
from nemo_convert.mapping.rules.protocol import Direction, PlanContext, Rule, Task, TaskFn, same
from nemo_convert.tensors.base import TensorInfo


def _side_kind(kind: Kind, direction: Direction) -> tuple[Kind]:
    """An output's kind: the rule's on the NeMo side, replicated on the HF side."""
    return (kind if direction == "to_nemo" else Parallel.REPLICATED,)


def _transpose(ts: Sequence[Any]) -> tuple[Any, ...]:
    return (ops.transpose_2d(ts[0]),)


@dataclass(frozen=True)
class Rename(Rule):
    """One HF tensor is one NeMo tensor, unchanged.

    ``shape`` optionally states the NeMo tensor's shape in model terms: each entry an int,
    a :class:`SpecField` of the typed model spec (``SpecField("geometry.hidden")``), a
    config path (deprecated), or ``None`` for "any"; the planner checks it before writing.
    """

    cfg_fields: ClassVar[tuple[str, ...]] = ("shape",)

    hf: str
    nemo: str
    parallel: Kind = Parallel.REPLICATED
    when: Condition = None
    shape: tuple[Dim, ...] | None = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        return [Task((src,), (dst,), same, _side_kind(self.parallel, direction), label="rename", lazy_fn=same)
                for src, dst in ctx.pairs(self.hf, self.nemo, direction)]

    def check(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], ctx: PlanContext,
              direction: Direction) -> None:
        if self.shape is None:
            return
        for info in outputs if direction == "to_nemo" else inputs:
            want = ctx.dims(self.shape)
            ok = len(want) == len(info.shape) and all(w is None or int(w) == d for w, d in zip(want, info.shape))
            if not ok:
                desc = ", ".join(f"{s}={w}" if isinstance(s, (str, SpecField)) else str(s)
                                 for s, w in zip(self.shape, want))
                raise ShapeError(f"{info.name} has shape {list(info.shape)}, but the config implies [{desc}]")


@dataclass(frozen=True)
class Reshape(Rule):
    """One HF tensor is one NeMo tensor of another shape with the same elements (e.g. a
    class token ``[H]`` ⇄ ``[1, 1, H]``). ``nemo_shape`` entries are ints, spec fields or
    config paths (deprecated);
    the HF shape is restored from the source on export via ``hf_shape``."""

    cfg_fields: ClassVar[tuple[str, ...]] = ("nemo_shape", "hf_shape")

    hf: str
    nemo: str
    nemo_shape: tuple[int | SpecField | str, ...]
    hf_shape: tuple[int | SpecField | str, ...]
    parallel: Parallel = Parallel.REPLICATED
    when: Condition = None

    def resolve(self, ctx: PlanContext, which: str) -> tuple[int, ...]:
        shape = self.nemo_shape if which == "nemo" else self.hf_shape
        return tuple(int(ctx.dim(s)) for s in shape)

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        shape = self.resolve(ctx, "nemo" if direction == "to_nemo" else "hf")
        out = []
        for src, dst in ctx.pairs(self.hf, self.nemo, direction):
            fn = (lambda ts, s=shape: (ts[0].reshape(s),))
            out.append(Task((src,), (dst,), fn, _side_kind(self.parallel, direction), label="reshape", lazy_fn=fn))
        return out


@dataclass(frozen=True)
class Transposed(Rule):
    """One HF ``Conv1D`` weight ``[in, out]`` (GPT-2) is one NeMo linear weight ``[out, in]``
    (:func:`~nemo_convert.mapping.ops.transpose_2d`, both ways). ``shape`` states the NeMo
    weight's shape in model terms, as for :class:`Rename`."""

    cfg_fields: ClassVar[tuple[str, ...]] = ("shape",)

    hf: str
    nemo: str
    parallel: Parallel = Parallel.REPLICATED
    when: Condition = None
    shape: tuple[Dim, ...] | None = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        return [Task((src,), (dst,), _transpose, _side_kind(self.parallel, direction),
                     label="transpose") for src, dst in ctx.pairs(self.hf, self.nemo, direction)]

    def check(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], ctx: PlanContext,
              direction: Direction) -> None:
        Rename(self.hf, self.nemo, shape=self.shape).check(inputs, outputs, ctx, direction)


@dataclass(frozen=True)
class Offset(Rule):
    """One HF tensor is one NeMo tensor plus a constant: ``nemo = hf + value`` (NeMo 1
    Gemma's norms store ``1 + w`` where Hugging Face stores ``w``). Not bit-exact in
    general (``(w + 1) - 1`` rounds), so families use it only to *read* such checkpoints."""

    hf: str
    nemo: str
    value: float
    parallel: Parallel = Parallel.REPLICATED
    when: Condition = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        delta = self.value if direction == "to_nemo" else -self.value
        add: TaskFn = lambda ts: (ops.add_scalar(ts[0], delta),)  # noqa: E731  (one for every task)
        return [Task((src,), (dst,), add,
                     _side_kind(self.parallel, direction), label="offset")
                for src, dst in ctx.pairs(self.hf, self.nemo, direction)]
