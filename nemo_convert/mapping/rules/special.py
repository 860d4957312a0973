"""The escape hatch (:class:`Custom`), the rule that moves nothing (:class:`Tied`) and the one
that stores a copy once (:class:`Shared`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence, TYPE_CHECKING, cast

from nemo_convert.errors import ShapeError
from nemo_convert.mapping.rules.base import Condition, Parallel, cfg_get
from nemo_convert.mapping.rules.protocol import Direction, PlanContext, Rule, Task, same
from nemo_convert.tensors.base import TensorInfo

if TYPE_CHECKING:
    import torch

TensorFn = Callable[[Sequence["torch.Tensor"], dict[str, Any]], Sequence["torch.Tensor"]]


@dataclass(frozen=True)
class Custom(Rule):
    """The escape hatch: a pure function pair over several tensors.

    ``to_nemo(hf_tensors, cfg)`` returns the NeMo tensors in ``nemo`` order and
    ``to_hf(nemo_tensors, cfg)`` the HF tensors in ``hf`` order. Both must work on meta
    tensors (the planner learns shapes that way) and be exact inverses.
    """

    hf: tuple[str, ...]
    nemo: tuple[str, ...]
    to_nemo: TensorFn
    to_hf: TensorFn
    parallel: tuple[Parallel, ...] | Parallel = Parallel.REPLICATED
    when: Condition = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Custom":
        out = cast("Custom", super().prefixed(hf, nemo, cfg))
        if not cfg:
            return out
        # Functions see the config of their own section.
        def sub(c: dict[str, Any]) -> dict[str, Any]:
            return cfg_get(c, cfg.rstrip("."), {}) or {}
        to_nemo, to_hf = self.to_nemo, self.to_hf
        wrapped_nemo: TensorFn = lambda ts, c: to_nemo(ts, sub(c))  # noqa: E731
        wrapped_hf: TensorFn = lambda ts, c: to_hf(ts, sub(c))  # noqa: E731
        return replace(out, to_nemo=wrapped_nemo, to_hf=wrapped_hf)

    def kinds(self) -> tuple[Parallel, ...]:
        """One kind per NeMo output."""
        return self.parallel if isinstance(self.parallel, tuple) else (self.parallel,) * len(self.nemo)

    def nemo_kinds(self, ctx: PlanContext) -> dict[str, Parallel]:
        kinds: dict[str, Parallel] = {}
        for name, p in zip(self.nemo, self.kinds()):
            for n in ctx.names(name):
                kinds[n] = p
        return kinds

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        cfg = ctx.cfg
        hf_lists = [ctx.names(h) for h in self.hf]
        nemo_lists = [ctx.names(n) for n in self.nemo]
        count = max([len(x) for x in hf_lists + nemo_lists] or [1])
        out = []
        to_nemo, to_hf = self.to_nemo, self.to_hf
        for j in range(count):
            hf_keys = tuple(lst[j if len(lst) > 1 else 0] for lst in hf_lists)
            nemo_keys = tuple(lst[j if len(lst) > 1 else 0] for lst in nemo_lists)
            if direction == "to_nemo":
                out.append(Task(hf_keys, nemo_keys, lambda ts: tuple(to_nemo(ts, cfg)),
                                tuple(self.kinds()), label="custom"))
            else:
                out.append(Task(nemo_keys, hf_keys, lambda ts: tuple(to_hf(ts, cfg)),
                                (Parallel.REPLICATED,) * len(hf_keys), label="custom"))
        return out


def _no_outputs(ts: Sequence[torch.Tensor]) -> tuple[()]:
    return ()


@dataclass(frozen=True)
class Tied(Rule):
    """An HF tensor that must equal another (``lm_head`` of a tied model): on import it
    is checked and consumed when present; on export it is not written (HF re-ties).

    It produces nothing: its import task is an equality check (``check_equal``) that is
    optional (no tensor, nothing to check) and consumes only ``hf``; :meth:`aliases` names
    the pair for ``verify``."""

    hf_fields: ClassVar[tuple[str, ...]] = ("hf", "same_as")
    nemo_fields: ClassVar[tuple[str, ...]] = ()

    hf: str
    same_as: str
    when: Condition = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        if direction != "to_nemo":
            return []
        return [Task((a, b), (), _no_outputs, (), label="tied", check_equal=True, optional=True, consumes=(a,))
                for a, b in zip(ctx.names(self.hf), ctx.names(self.same_as))]

    def check(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], ctx: PlanContext,
              direction: Direction) -> None:
        a, b = inputs
        if a.shape != b.shape:
            raise ShapeError(f"{a.name} {list(a.shape)} should equal {b.name} {list(b.shape)} (tied)")

    def aliases(self, ctx: PlanContext) -> dict[str, str]:
        return dict(zip(ctx.names(self.hf), ctx.names(self.same_as)))


@dataclass(frozen=True)
class Shared(Rule):
    """An HF tensor that is a stored copy of another, where the NeMo model shares one tensor
    (DeepSeek-V3's multi-token-prediction layer holds its own ``embed_tokens`` and
    ``shared_head.head``; Megatron-Core's MTP block uses the main model's embedding and
    output layer). Import checks the copy equal to ``same_as`` and consumes it (nothing is
    stored; ``why`` ends the error when they differ); export writes it again from the NeMo
    tensor ``nemo`` — the one ``same_as`` is made from — without consuming it.
    :meth:`aliases` names the pair for ``verify``."""

    hf_fields: ClassVar[tuple[str, ...]] = ("hf", "same_as")
    nemo_fields: ClassVar[tuple[str, ...]] = ("nemo",)

    hf: str
    same_as: str
    nemo: str
    why: str = "the NeMo model shares one tensor for both"
    when: Condition = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        if direction == "to_nemo":
            return [Task((a, b), (), _no_outputs, (), label="shared", check_equal=True, why_equal=self.why,
                         consumes=(a,)) for a, b in zip(ctx.names(self.hf), ctx.names(self.same_as))]
        return [Task((n,), (h,), same, (Parallel.REPLICATED,), label="shared", lazy_fn=same, consumes=())
                for h, n in zip(ctx.names(self.hf), ctx.names(self.nemo))]

    def nemo_kinds(self, ctx: PlanContext) -> dict[str, Parallel]:
        return {}  # produces no NeMo tensor: ``nemo`` is another rule's

    def check(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], ctx: PlanContext,
              direction: Direction) -> None:
        if direction == "to_nemo":
            a, b = inputs
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ShapeError(f"{a.name} {list(a.shape)} {a.dtype} should equal {b.name} {list(b.shape)} "
                                 f"{b.dtype} ({self.why})")

    def aliases(self, ctx: PlanContext) -> dict[str, str]:
        return dict(zip(ctx.names(self.hf), ctx.names(self.same_as)))
