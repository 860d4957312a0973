"""Fresh tensor memory for the large buffers a conversion fills once (TP merges, fused
outputs, contiguous copies of strided slices): its own anonymous memory map, backed by
transparent huge pages on Linux.

- **Huge pages.** A 125 MiB buffer is 32 000 page faults of 4 KiB, each zeroing a page in
  the kernel — about a quarter of a legacy TP2 → TP1 reshard's system time on our
  benchmark machine. Advised with ``madvise(MADV_HUGEPAGE)`` before its first touch, it
  faults in 2 MiB pages instead (64× fewer). Most distributions ship transparent huge
  pages in ``madvise`` mode, where nothing happens without this advice;
  ``NEMO_CONVERT_NO_HUGEPAGES=1`` leaves it out.
- **Returned when freed.** A map of its own is unmapped as soon as the tensor is freed.
  Buffers of a few tens of MiB from the C allocator instead come from its heap above the
  adaptive mmap threshold, and freed ones stayed there: a TP2 → TP1 reshard's private
  memory grew with the number of layers (61 → 133 MiB from 5 to 14 layers).

Values never depend on any of this.
"""

from __future__ import annotations

import mmap
import os

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_HUGE = 2 << 20  # x86-64 / arm64 (4 KiB base pages) transparent huge page size
#: Buffers smaller than this come from torch's allocator as usual.
MIN_BYTES = 4 * _HUGE
#: The advice, where this system has it and it is not turned off.
ADVICE: int | None = (getattr(mmap, "MADV_HUGEPAGE", None)
                      if hasattr(mmap.mmap, "madvise") and not os.environ.get("NEMO_CONVERT_NO_HUGEPAGES") else None)


def empty(shape: tuple[int, ...] | list[int] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)`` on the CPU; from :data:`MIN_BYTES` on, on an
    anonymous map of its own advised as huge pages (unmapped when the tensor is freed)."""
    import torch
    shape = tuple(shape)
    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * dtype.itemsize
    if nbytes < MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is None:  # not a POSIX system: no advice to give either
        return torch.empty(shape, dtype=dtype)
    # private (the default for -1 is shared memory: shmem, without huge pages), unmapped on free
    buf = mmap.mmap(-1, nbytes, flags=private | mmap.MAP_ANONYMOUS)
    if ADVICE is not None:
        try:
            buf.madvise(ADVICE)
        except OSError:  # advice only: a kernel without it changes nothing
            pass
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)
