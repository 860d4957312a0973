"""Executes a checked plan: streams tasks one at a time, frees each group after use.

Memory: at any moment only the inputs and outputs of the task in flight are alive (the
inputs are memory-mapped views; the outputs are the fused tensors, if any). Outputs go
to a ``sink(name, tensor)`` callback — a format writer — that writes them out before the
next task starts. The engine only ever sees CPU tensors: a conversion that runs transforms
on a GPU wraps the task functions that compute before streaming (``compute.Compute.place``).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from nemo_convert.dtypes import SHORT, cast_for_output, lossy_cast
from nemo_convert.errors import InputError
from nemo_convert.mapping.planner import Plan
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.file_map import release_pages
from nemo_convert.tensors.heap import release_heap
from nemo_convert.tensors.pieces import Pieces, materialize

#: ``sink(name, tensor)``: a ``torch.Tensor``, or :class:`Pieces` for a lazy plan (the writers that
#: copy byte ranges take them without joining)
Sink = Callable[[str, Any], None]


class Progress(Protocol):
    """Receives progress; the CLI shows it as a rich progress bar."""

    def start(self, description: str, total_bytes: int, total_tensors: int) -> None: ...

    def advance(self, nbytes: int, ntensors: int) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    def start(self, description: str, total_bytes: int, total_tensors: int) -> None:
        pass

    def advance(self, nbytes: int, ntensors: int) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class RunStats:
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    non_finite: dict[str, int] = field(default_factory=dict)  # tensor -> NaN/Inf count (check_finite)


def apply_dtype(plan: Plan, dtype: torch.dtype | None) -> list[str]:
    """Re-type the plan's floating outputs to ``dtype``; returns warnings about lossy casts."""
    if dtype is None:
        return []
    lossy: dict[tuple[torch.dtype, str], int] = {}
    for task in plan.tasks:
        new = []
        for info in task.infos:
            if info.dtype.is_floating_point and info.dtype != dtype:
                why = lossy_cast(info.dtype, dtype)
                if why:
                    lossy[(info.dtype, why)] = lossy.get((info.dtype, why), 0) + 1
                info = TensorInfo(info.name, info.shape, dtype)
            new.append(info)
        task.infos = tuple(new)
    return [f"casting {n} tensor(s) from {SHORT.get(src, str(src))} to {SHORT.get(dtype, str(dtype))} "
            f"loses {why}" for (src, why), n in lossy.items()]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN equals an identical NaN, unlike ``torch.equal``)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point and a.element_size() in (1, 2, 4, 8):
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


#: Output bytes streamed between two :func:`~nemo_convert.tensors.file_map.release_pages`:
#: the mapped inputs' pages read since the last call stop counting in the resident set.
#: Each call advises only the ranges read since the one before (cheap), so it can be
#: frequent: at 32 MiB a large model's resident set carried up to 32 MiB of read input
#: pages that a small one never reached (docs/performance.md, "Memory, third round").
RELEASE_BYTES = 4 << 20

#: Tensors queued between the transforming thread and the writing thread.
QUEUE_DEPTH = 2


class _Writer(threading.Thread):
    """Calls the sink for each queued tensor, in order, overlapping the writes with the
    next task's reads and transforms. Memory stays bounded by the queue depth."""

    def __init__(self, sink: Sink) -> None:
        super().__init__(name="nemo-convert-writer", daemon=True)
        self._sink = sink
        self.queue: queue.Queue[tuple[str, torch.Tensor] | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        self.error: BaseException | None = None

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self._sink(*item)
                except BaseException as exc:  # handed to the main thread
                    self.error = exc
            del item

    def put(self, name: str, tensor: Any) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put((name, tensor))

    def finish(self) -> None:
        self.queue.put(None)
        self.join()
        if self.error is not None:
            raise self.error


def run_plan(plan: Plan, source: TensorSource, sink: Sink, *, progress: Progress | None = None,
             description: str = "converting", own_progress: bool = True, overlap: bool = False,
             lazy: bool = False) -> RunStats:
    """Stream every task of ``plan`` from ``source`` into ``sink``.

    With ``overlap`` a writer thread calls ``sink`` while the next task is
    read and transformed; the plan's buffer pool then keeps enough buffers in rotation
    that a queued tensor is never overwritten. It is off by default: on the 2-core
    machines we measure on it gave no speed-up (docs/performance.md). With ``own_progress=False`` the caller has
    started ``progress`` (one bar over several plans) and finishes it.

    With ``lazy`` (the sink takes :class:`~nemo_convert.tensors.pieces.Pieces` as well as
    tensors), tasks that only rearrange rows run their deferred form on deferred inputs
    (``TensorSource.load_lazy`` where a source has it, e.g. merged TP ranks): their outputs
    reach the sink as pieces, never copied together. Off while counting NaN/Inf.
    """
    progress = progress or NoProgress()
    stats = RunStats()
    t0 = time.perf_counter()
    if own_progress:
        progress.start(description, plan.total_bytes, sum(len(t.outputs) for t in plan.tasks))
    writer = _Writer(sink) if overlap else None
    if writer is not None:
        plan.pool.rotation = QUEUE_DEPTH + 2
        writer.start()
    put = writer.put if writer is not None else sink
    lazy = lazy and not plan.check_finite and writer is None
    load_lazy = getattr(source, "load_lazy", None) or source.load
    streamed = 0
    release_heap()  # what planning built and dropped is not carried through the write
    try:
        for task in plan.tasks:
            deferred = lazy and task.lazy_fn is not None
            inputs: list[Any] = [(load_lazy if deferred else source.load)(k) for k in task.inputs]
            if task.check_equal:
                a, b = inputs
                if not same_bits(a, b):
                    raise InputError(f"{task.inputs[0]} differs from {task.inputs[1]}, but {task.why_equal}")
                continue
            outputs = task.lazy_fn(inputs) if deferred and task.lazy_fn is not None else task.fn(inputs)
            for info, out in zip(task.infos, outputs):
                if isinstance(out, Pieces) and out.dtype != info.dtype:
                    out = materialize(out)
                if not isinstance(out, Pieces):
                    out = cast_for_output(out, info.dtype)
                if tuple(out.shape) != info.shape or out.dtype != info.dtype:
                    raise InputError(f"internal error: {info.name} came out as {list(out.shape)} {out.dtype}, "
                                     f"planned {list(info.shape)} {info.dtype}")
                if plan.check_finite and out.dtype.is_floating_point:
                    whole = materialize(out) if isinstance(out, Pieces) else out
                    bad = int(whole.numel() - torch.isfinite(whole).sum())
                    if bad:
                        stats.non_finite[info.name] = bad
                put(info.name, out)
                stats.tensors += 1
                stats.bytes += info.nbytes
            progress.advance(task.out_bytes, len(task.outputs))
            del inputs, outputs
            streamed += task.out_bytes
            if streamed >= RELEASE_BYTES:
                release_pages(touched_only=True)
                streamed = 0
        if writer is not None:
            writer.finish()
            writer = None
        release_pages(touched_only=True)  # what the writers do next (metadata, closing) reads no input
        release_heap()
    finally:
        if writer is not None:  # failing: stop the writer without waiting for the queue
            writer.error = writer.error or InputError("conversion stopped")
            try:
                writer.queue.put_nowait(None)
            except queue.Full:
                pass
        if own_progress:
            progress.finish()
    stats.seconds = time.perf_counter() - t0
    return stats


def merge_stats(parts: list[RunStats], *, sequential: bool = True) -> RunStats:
    """Totals of several runs: times add up when they ran one after another, else the
    longest counts (parallel processes)."""
    out = RunStats()
    for s in parts:
        out.tensors += s.tensors
        out.bytes += s.bytes
        out.seconds = out.seconds + s.seconds if sequential else max(out.seconds, s.seconds)
        out.warnings += s.warnings
        out.non_finite.update(s.non_finite)
    return out
