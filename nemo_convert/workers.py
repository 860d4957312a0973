"""Several processes on one conversion (``torchrun … -m nemo_convert``).

The work of a conversion is a list of *output parts* (safetensors shards, dist-checkpoint
data files, per-rank weight files). Part ``i`` belongs to process ``i mod world``; each
process reads only the source tensors its parts need and writes its own files; process 0
writes the metadata once every part is done. Parts are defined by the plan alone, never
by the number of processes, so the output is byte-identical to a one-process run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

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
                from nemo_convert.errors import NemoConvertError

                return NemoConvertError(f"process {r} failed: {e}")
        return None


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
    bounds, acc, start = [], 0, 0
    for i, s in enumerate(sizes):
        acc += s
        if len(bounds) < parts - 1 and acc >= total * (len(bounds) + 1) / parts and i + 1 < n:
            bounds.append(range(start, i + 1))
            start = i + 1
    bounds.append(range(start, n))
    return [b for b in bounds if len(b)]
