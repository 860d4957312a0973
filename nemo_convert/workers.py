"""Several processes on one conversion (``torchrun … -m nemo_convert``).

The work of a conversion is a list of *output parts* (safetensors shards, dist-checkpoint
data files, per-rank weight files). Part ``i`` belongs to process ``i mod world``; each
process reads only the source tensors its parts need and writes its own files; process 0
writes the metadata once every part is done. Parts are defined by the plan alone, never
by the number of processes, so the output is byte-identical to a one-process run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.io.sink import DirectorySink, MemberSink
from nemo_convert.formats.io.staging import staged_output
from nemo_convert.formats.io.tar_writer import TarWriter

T = TypeVar("T")


@dataclass
class Workers:
    """This process's place in the group, and the few collectives a conversion needs."""

    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def owns(self, part: int) -> bool:
        return part % self.world == self.rank

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, obj: T) -> list[T]:
        """Every process's ``obj`` (in rank order), on every process."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Process 0's ``obj`` on every process."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, error: BaseException | None) -> BaseException | None:
        """Share failures: every process learns the first error any process had."""
        errors = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            return error
        for r, e in enumerate(errors):
            if e is not None:
                return NemoConvertError(f"process {r} failed: {e}")
        return None

    def run_all(self, fn: Callable[[], T], undo: Callable[[T], None] | None = None) -> T:
        """``fn()`` in every process; if it raised in any, every process raises (the first
        error, see :meth:`agree`), after ``undo(result)`` where it had succeeded."""
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn()
        except Exception as exc:  # shared below so that every process stops
            error = exc
        failure = self.agree(error)
        if failure is not None:
            if error is None and undo is not None:
                undo(result)
            raise failure
        return result

    def run_on_main(self, fn: Callable[[], T]) -> T:
        """``fn()`` in process 0 only; its result (pickled, so keep it on the CPU) on
        every process. If it raised, every process raises."""
        if self.world == 1:
            return fn()
        error: BaseException | None = None
        result: Any = None
        if self.is_main:
            try:
                result = fn()
            except Exception as exc:  # shared below so that every process stops
                error = exc
        message, result = self.broadcast((None if error is None else f"{type(error).__name__}: {error}", result))
        if error is not None:
            raise error
        if message is not None:
            raise NemoConvertError(f"process 0 failed: {message}")
        return result


SINGLE = Workers()


def from_env() -> Workers:
    """The group torchrun started (``WORLD_SIZE`` > 1), with a gloo process group; else
    the single-process group."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return SINGLE
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    return Workers(dist.get_rank(), dist.get_world_size())


def shutdown(workers: Workers) -> None:
    if workers.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def split_balanced(sizes: Sequence[int], parts: int) -> list[range]:
    """Consecutive index ranges of about equal total size (``parts`` of them at most)."""
    n = len(sizes)
    parts = max(1, min(parts, n))
    total = sum(sizes) or 1
    bounds: list[range] = []
    acc, start = 0, 0
    for i, s in enumerate(sizes):
        acc += s
        if len(bounds) < parts - 1 and acc >= total * (len(bounds) + 1) / parts and i + 1 < n:
            bounds.append(range(start, i + 1))
            start = i + 1
    bounds.append(range(start, n))
    return [b for b in bounds if len(b)]


def write_together(out: str, members: Sequence[str], write_mine: Callable[[DirectorySink], T], *,
                   workers: Workers, overwrite: bool, packed: bool, kind: str,
                   head: Callable[[MemberSink], None] | None = None,
                   tail: Callable[[MemberSink, list[T]], None] | None = None) -> list[T]:
    """Several processes write one output (a folder, or a tar when ``packed``), atomically.

    1. Process 0 opens the staging entry beside ``out`` (:func:`staged_output`) and shares
       its path. Parts go into the staging folder itself, or for a tar into a folder
       ``<staging>.parts`` beside it.
    2. Every process runs ``write_mine(sink)``, writing the parts it owns as files there.
    3. Process 0 writes ``head(sink)``, then (tar) copies ``members`` (every part, in
       archive order) into the tar, deleting each, then ``tail(sink, results)``.
    4. Process 0 renames the output into place.

    A failure in any step of any process is shared (:meth:`Workers.agree`): every process
    raises, the staging entry and the parts folder are removed (before any process
    returns), nothing is installed.
    Returns every process's ``write_mine`` result, in process order.
    """
    done = False
    error: BaseException | None = None
    try:
        with contextlib.ExitStack() as stack:
            def open_stage() -> str | None:
                if not workers.is_main:
                    return None
                stage = stack.enter_context(staged_output(out, overwrite=overwrite, is_dir=not packed, kind=kind))
                if packed:
                    os.mkdir(stage + ".parts")
                    stack.callback(shutil.rmtree, stage + ".parts", True)
                return stage

            stage = workers.broadcast(workers.run_all(open_stage))
            assert stage is not None
            parts_dir = stage + ".parts" if packed else stage
            results = workers.gather(workers.run_all(lambda: write_mine(DirectorySink(parts_dir))))

            def finish() -> None:
                if not workers.is_main:
                    return
                with (TarWriter(stage) if packed else contextlib.nullcontext(DirectorySink(stage))) as final:
                    if head is not None:
                        head(final)
                    for name in members if packed else ():
                        path = os.path.join(parts_dir, *name.split("/"))
                        final.add_file(name, path)
                        os.unlink(path)
                    if tail is not None:
                        tail(final, results)

            workers.run_all(finish)
            done = True
    except Exception as exc:
        if not done:  # already shared: every process raised at the same step. Leave together,
            workers.barrier()  # once process 0 has removed the staging (torchrun stops the
            raise              # others as soon as one process exits)
        error = exc  # installing failed (process 0)
    failure = workers.agree(error)
    if failure is not None:
        raise failure
    return results
