"""``release_heap``: the C heap's free pages go back to the operating system (glibc's
``malloc_trim``), which is what keeps a conversion's planning garbage out of its peak
resident set (docs/performance.md, "Memory, third round")."""

from __future__ import annotations

import os

import pytest

from nemo_convert.tensors.heap import _malloc_trim, release_heap

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.mark.skipif(not os.path.exists("/proc/self/statm") or _malloc_trim() is None,
                    reason="needs Linux and a C library with malloc_trim (glibc)")
def test_freed_heap_memory_is_returned_only_when_asked() -> None:
    """64 MiB of 1 KiB buffers (``malloc``, under glibc's mmap threshold), freed while a
    buffer allocated after them is kept, so that glibc cannot return them by trimming the
    top of the heap: freed, they stay resident (the control); ``release_heap`` returns them."""
    release_heap()
    many = [bytearray(1024) for _ in range(64 * 1024)]
    for b in many:
        b[0] = 1  # touched: resident
    kept = bytearray(1024)
    alive = _rss()
    del many
    freed = _rss()
    assert alive - freed < 8 << 20, (alive, freed)  # free alone keeps the pages resident
    assert release_heap() is True
    trimmed = _rss()
    assert freed - trimmed > 32 << 20, (freed, trimmed)
    del kept
