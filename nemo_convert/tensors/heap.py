"""Give the C heap's free memory back to the operating system at a conversion's phase
boundaries.

CPython allocates every object larger than 512 bytes (dict and list tables, long strings,
JSON text) with the C library's ``malloc``. Freed, that memory stays in the process's
heap, and counts in its resident set, until ``malloc`` itself returns it; glibc does so
only at the top of the heap unless asked with ``malloc_trim(0)``, which also releases the
free pages inside it (``malloc_trim(3)``; glibc ≥ 2.8). Planning a conversion builds and
drops large temporary structures (source headers, name lists, the coverage proof), so
that freed memory would otherwise be carried through the whole write, into the peak the
tensor-count benchmark measures (docs/performance.md, "Memory, third round").

:func:`release_heap` is cheap (one walk of the free lists), so it runs only at phase
boundaries: when a plan starts to stream and when it ends (:func:`nemo_convert.engine.run_plan`).
On a C library without ``malloc_trim`` (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

_TRIM: list[Callable[[int], int] | None] = []


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once; None where the C library has none."""
    if not _TRIM:
        fn = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = getattr(libc, "malloc_trim", None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except OSError:
            fn = None
        _TRIM.append(fn)
    return _TRIM[0]


def release_heap() -> bool:
    """Return the C heap's free pages to the operating system; True where the C library
    could (glibc), False where this is a no-op."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


__all__ = ["release_heap"]
