"""The typed protocols of the three sharding axes, and the bundle a conversion uses.

A sharding strategy (``ShardingStrategy.implementation``, registered through the
``nemo_convert_sharding_strategies`` hook) is an object with the methods of its axis's
protocol:

* ``"tp"`` — :class:`TensorSharding`: the split of a global tensor for one tensor-parallel
  rank and the merge of every rank's slice back, by the tensor's :class:`Parallel` kind
  (column, row, replicated, vocabulary — padded to the per-rank multiple on split,
  trimmed on merge —, grouped QKV, gated fc1), and the shape of one rank's slice. It may
  also have the deferred forms ``split_lazy`` / ``merge_lazy`` (:class:`LazyTensorSharding`,
  used through :func:`nemo_convert.sharding.tensor.deferred`).
* ``"pp"`` — :class:`PipelineSharding`: the global layer range of each pipeline stage.
* ``"ep"`` — :class:`ExpertSharding`: whether EP ranks can hold the experts, which
  experts a rank holds, and which rank holds an expert.

The built-ins (``sharding/tensor.py``, ``pipeline.py``, ``expert.py``) implement them and
are registered by ``sharding/builtin.py``, the only place that constructs them; every
reader and writer takes the registry's (:class:`Strategies`, from
``Registry.strategies()``). The registry refuses, when it is built, an implementation
whose methods cannot take the calls below (:func:`protocol_problem`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch

    from nemo_convert.mapping.rules import Kind
    from nemo_convert.tensors.pieces import Lazy


@runtime_checkable
class TensorSharding(Protocol):
    """Tensor parallelism (axis ``"tp"``): how a global tensor splits across TP ranks."""

    def split(self, t: torch.Tensor, kind: Kind, tp: int, rank: int, *, name: str = "tensor",
              padded_vocab: int | None = None) -> torch.Tensor:
        """Rank ``rank``'s slice of global tensor ``t`` of parallel kind ``kind`` at TP size
        ``tp``; a ``VOCAB`` tensor is first padded to ``padded_vocab`` rows (when given)."""
        ...

    def merge(self, parts: Sequence[torch.Tensor], kind: Kind, *, name: str = "tensor",
              vocab: int | None = None) -> torch.Tensor:
        """The global tensor from every rank's slice, in rank order; a ``VOCAB`` tensor is
        trimmed to ``vocab`` rows (when given)."""
        ...

    def local_shape(self, shape: tuple[int, ...], kind: Kind, tp: int, *,
                    padded_vocab: int | None = None) -> tuple[int, ...]:
        """The shape of one rank's slice of a global tensor of ``shape``; raises
        (``UnsupportedError``) when ``tp`` does not split it."""
        ...


@runtime_checkable
class LazyTensorSharding(TensorSharding, Protocol):
    """A :class:`TensorSharding` with deferred forms: the same arguments, taking and
    returning :data:`~nemo_convert.tensors.pieces.Lazy` (row concatenations not yet copied)."""

    def split_lazy(self, t: Lazy, kind: Kind, tp: int, rank: int, *, name: str = "tensor",
                   padded_vocab: int | None = None) -> Lazy:
        ...

    def merge_lazy(self, parts: Sequence[Lazy], kind: Kind, *, name: str = "tensor",
                   vocab: int | None = None) -> Lazy:
        ...


@runtime_checkable
class PipelineSharding(Protocol):
    """Pipeline parallelism (axis ``"pp"``): which layers each stage holds."""

    def stage_layers(self, num_layers: int, pp: int, sizes: Sequence[int] | None = None) -> list[range]:
        """The global layer range of each of the ``pp`` stages (``sizes``: explicit layers
        per stage); raises (``UnsupportedError``) when ``pp`` cannot split the layers."""
        ...


@runtime_checkable
class ExpertSharding(Protocol):
    """Expert parallelism (axis ``"ep"``): which experts each EP rank holds."""

    def check(self, num_experts: int | None, ep: int, *, layout: str = "dist") -> None:
        """Raise (``UnsupportedError``) when ``ep`` ranks cannot hold ``num_experts``
        experts in ``layout`` (``"dist"`` or ``"legacy"``)."""
        ...

    def local_experts(self, num_experts: int, ep: int, rank: int) -> range:
        """The global indices of the experts EP rank ``rank`` holds."""
        ...

    def rank_of(self, expert: int, num_experts: int, ep: int) -> int:
        """The EP rank that holds global expert ``expert``."""
        ...


#: The protocol of each axis.
AXES: dict[str, type] = {"tp": TensorSharding, "pp": PipelineSharding, "ep": ExpertSharding}

#: How the core calls each method (positional arguments, keyword arguments): an
#: implementation must accept these calls. Placeholders stand for the values.
_CALLS: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "tp": {"split": (("t", "kind", "tp", "rank"), ("name", "padded_vocab")),
           "merge": (("parts", "kind"), ("name", "vocab")),
           "local_shape": (("shape", "kind", "tp"), ("padded_vocab",))},
    "pp": {"stage_layers": (("num_layers", "pp", "sizes"), ())},
    "ep": {"check": (("num_experts", "ep"), ("layout",)),
           "local_experts": (("num_experts", "ep", "rank"), ()),
           "rank_of": (("expert", "num_experts", "ep"), ())},
}


def _spelled(method: str, call: tuple[tuple[str, ...], tuple[str, ...]]) -> str:
    pos, kw = call
    return f"{method}({', '.join(pos)}{', *, ' + ', '.join(kw) if kw else ''})"


def protocol_problem(axis: str, implementation: object) -> str | None:
    """Why ``implementation`` is not a strategy for ``axis`` (one phrase), or None: the
    axis is unknown, or a method of its protocol is missing or cannot take the core's call."""
    calls = _CALLS.get(axis)
    if calls is None:
        return f"axis {axis!r} is not one of {', '.join(AXES)}"
    what = type(implementation).__name__
    for method, call in calls.items():
        fn = getattr(implementation, method, None)
        if not callable(fn):
            return f"{what} has no {_spelled(method, call)} ({AXES[axis].__name__})"
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: trust it
            continue
        pos, kw = call
        try:
            sig.bind(*pos, **{k: None for k in kw})
        except TypeError as exc:
            return f"{what}.{method} cannot be called as {_spelled(method, call)} ({exc}; {AXES[axis].__name__})"
    return None


@dataclass(frozen=True)
class Strategies:
    """The sharding strategies one conversion uses, one per axis, from the plugin registry
    (``Registry.strategies()``: the built-in ones, or a third party's registered for an
    axis). ``expert`` is None where no expert-parallel strategy is installed: then only
    EP = 1 is written."""

    tensor: TensorSharding
    pipeline: PipelineSharding
    expert: ExpertSharding | None = None

    def with_tensor(self, tensor: TensorSharding) -> Strategies:
        """The same strategies with ``tensor`` for TP (a device wrapper of the registry's)."""
        return Strategies(tensor, self.pipeline, self.expert)

