"""Where the tensor transforms of a conversion run: the CPU, or a CUDA device.

The ``--device`` option of ``import``, ``export``, ``reshard`` and ``quantize`` is resolved
here, once (:func:`resolve_device`), before anything is read or written.

A conversion hands its checked plan to :meth:`Compute.place`. The rule, per task, from
its op: a task whose op *builds new tensors* — a QKV or gated fuse, a plugin's ``Custom``
function, or any dtype cast of its outputs — runs on the device: its inputs are copied
there, the op and the cast run there, and the outputs are copied back to the CPU before
the writer sees them; nothing of the task stays on the device afterwards. A task whose
outputs are *views* of its inputs (a rename, a reshard's copy, a reshape, a QKV or gated
split) stays on the CPU: a view costs nothing there, and the device would only add two
copies over the bus. The per-rank writer's tensor-parallel split follows the same rule
(:meth:`Compute.tensor_parallel`): slicing stays a CPU view; a gated fc1 split at TP > 1
and vocabulary padding build a new tensor and run on the device.

With the CPU (the default) :meth:`Compute.place` returns the plan unchanged, so the plain
path does no extra work per tensor. ``Compute(staged=True)`` forces the device path on the
CPU — real copies in and out, the same code — which is how the tests cover it without a GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from nemo_convert.dtypes import cast_for_output
from nemo_convert.errors import InputError
from nemo_convert.mapping.planner import Plan, Task, TaskFn
from nemo_convert.mapping.rules import Kind, Parallel
from nemo_convert.sharding.protocol import TensorSharding
from nemo_convert.tensors.base import TensorSource

#: Ops whose outputs are views of their inputs: they stay on the CPU unless their outputs are cast.
VIEW_OPS = frozenset({"rename", "copy", "reshape", "split_qkv", "split_gated"})

_CUDA_INDEX = re.compile(r"cuda:(\d+)")


def _local_rank() -> int | None:
    """``LOCAL_RANK`` as ``torchrun`` sets it for each process, if set."""
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else None


def _cuda(spec: str, index: int | None) -> torch.device:
    if not torch.cuda.is_available():
        raise InputError(f"--device {spec}: no CUDA device is available to this PyTorch "
                         f"({torch.__version__}); use --device cpu or auto")
    count = torch.cuda.device_count()
    if index is None:
        local = _local_rank()
        # under torchrun, process i uses GPU i; more processes than GPUs share them round robin
        index = local % count if local is not None else torch.cuda.current_device()
    if index >= count:
        raise InputError(f"--device {spec}: cuda:{index} does not exist ({count} CUDA device(s) visible)")
    return torch.device("cuda", index)


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """The device a ``--device`` value names: ``cpu`` (also for None), ``cuda`` (under
    ``torchrun``: ``cuda:LOCAL_RANK``, else the current CUDA device), ``cuda:N``, or
    ``auto`` (``cuda`` when available, else ``cpu``).

    :raises InputError: for another spelling, a CUDA device this PyTorch cannot reach, or
        a device index that does not exist.
    """
    text = str(spec if spec is not None else "cpu").strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text == "auto":
        return _cuda(text, None) if torch.cuda.is_available() else torch.device("cpu")
    if text == "cuda":
        return _cuda(text, None)
    match = _CUDA_INDEX.fullmatch(text)
    if match:
        return _cuda(text, int(match.group(1)))
    raise InputError(f"--device {spec}: expected cpu, cuda, cuda:N or auto")


@dataclass(frozen=True)
class Compute:
    """Where transforms run. ``staged=True`` forces the copy-in / transform / copy-out
    path even when ``device`` is the CPU (tests)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    staged: bool = False

    @classmethod
    def of(cls, device: DeviceOption) -> Compute:
        """A ``Compute`` for a ``device=`` argument (a ``Compute`` is taken as it is)."""
        return device if isinstance(device, Compute) else cls(resolve_device(device))

    @property
    def active(self) -> bool:
        return self.staged or self.device.type != "cpu"

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, copy=True)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.to("cpu", copy=True)

    def moves(self, task: Task, source: TensorSource) -> bool:
        """Whether ``task`` runs on the device: it has outputs, and its op builds new
        tensors or one of its outputs is cast (module docstring)."""
        if task.check_equal or not task.outputs:
            return False
        if task.label not in VIEW_OPS:
            return True
        input_dtypes = {source.info(k).dtype for k in task.inputs}
        return any(info.dtype not in input_dtypes for info in task.infos)

    def place(self, plan: Plan, source: TensorSource) -> Plan:
        """``plan`` with each task that :meth:`moves` wrapped to run on the device; the plan
        itself when nothing runs off the plain CPU path. Call after the output dtypes are
        final (``engine.apply_dtype``)."""
        if not self.active:
            return plan
        tasks = [replace(t, fn=OnDevice(self, t.fn, tuple(i.dtype for i in t.infos)), lazy_fn=None)
                 if self.moves(t, source) else t for t in plan.tasks]
        return Plan(plan.direction, tasks, plan.dropped, plan.check_finite, plan.pool)

    def tensor_parallel(self, inner: TensorSharding) -> TensorSharding:
        """The tensor-parallel strategy for the per-rank writer and reader: ``inner`` (the
        registry's), with the splits and merges that build a new tensor run on the device."""
        return DeviceTensorParallel(inner, self) if self.active else inner

    def notes(self, plan: Plan, source: TensorSource) -> list[str]:
        """A report note: how many of ``plan``'s tasks run on the device (none for the CPU)."""
        if self.device.type == "cpu":
            return []
        moved = sum(self.moves(t, source) for t in plan.tasks)
        return [(f"transforms on {self.device}: {moved} of {len(plan.tasks)} task(s) (the others are views — "
                 "renames, copies, splits — and stay on the CPU)")]

    def release(self) -> None:
        """Return the device memory the conversion's tensors used to the driver."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


DeviceOption = str | torch.device | Compute | None

#: The plain path: every transform on the CPU, no copies.
CPU = Compute()


class OnDevice:
    """A task function run on ``compute``'s device: inputs copied in, the op and the
    outputs' casts run there, the outputs copied back. Every device tensor is released
    when the call returns."""

    def __init__(self, compute: Compute, fn: TaskFn, dtypes: tuple[torch.dtype, ...]) -> None:
        self.compute, self.fn, self.dtypes = compute, fn, dtypes

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        outs = self.fn([self.compute.to_device(t) for t in inputs])
        return tuple(self.compute.to_host(cast_for_output(o, d)) for o, d in zip(outs, self.dtypes))


def _split_builds(t: torch.Tensor, kind: Kind, tp: int, padded_vocab: int | None) -> bool:
    """Whether splitting ``t`` makes a new tensor rather than a slice of it."""
    if kind is Parallel.GATED_FC1:
        return tp > 1
    return kind is Parallel.VOCAB and padded_vocab is not None and padded_vocab > t.shape[0]


class DeviceTensorParallel:
    """``inner``'s tensor parallelism (a :class:`~nemo_convert.sharding.protocol.TensorSharding`),
    with the splits that build a new tensor (gated fc1 at TP > 1, vocabulary padding) and
    the merges of per-rank slices (concatenations) run on ``compute``'s device; slices stay
    CPU views. It has no deferred forms: its callers take its eager ``split`` / ``merge``."""

    def __init__(self, inner: TensorSharding, compute: Compute) -> None:
        self.inner, self.compute = inner, compute

    def split(self, t: torch.Tensor, kind: Kind, tp: int, rank: int, *, name: str = "tensor",
              padded_vocab: int | None = None) -> torch.Tensor:
        if not _split_builds(t, kind, tp, padded_vocab):
            return self.inner.split(t, kind, tp, rank, name=name, padded_vocab=padded_vocab)
        piece = self.inner.split(self.compute.to_device(t), kind, tp, rank, name=name, padded_vocab=padded_vocab)
        return self.compute.to_host(piece)

    def merge(self, parts: Sequence[torch.Tensor], kind: Kind, *, name: str = "tensor",
              vocab: int | None = None) -> torch.Tensor:
        if len(parts) == 1 or kind is Parallel.REPLICATED or parts[0].is_meta:
            return self.inner.merge(parts, kind, name=name, vocab=vocab)  # no new tensor (or shapes only)
        merged = self.inner.merge([self.compute.to_device(p) for p in parts], kind, name=name, vocab=vocab)
        return self.compute.to_host(merged)

    def local_shape(self, shape: tuple[int, ...], kind: Kind, tp: int, *,
                    padded_vocab: int | None = None) -> tuple[int, ...]:
        return self.inner.local_shape(shape, kind, tp, padded_vocab=padded_vocab)
