"""CRC-32 for zip records: zlib-ng's (≈ 9 GB/s here, SIMD) when installed, else zlib's
(≈ 2 GB/s). Same polynomial and results; the checksum is a large share of writing a
``torch.save``-format file."""

from __future__ import annotations

from typing import Callable, Optional

crc32_combine: Optional[Callable[[int, int, int], int]]
try:
    from zlib_ng.zlib_ng import crc32
    from zlib_ng.zlib_ng import crc32_combine
except ImportError:  # pragma: no cover - platforms without a zlib-ng wheel
    from zlib import crc32

    crc32_combine = None  # the standard zlib module does not offer it

__all__ = ["crc32", "crc32_combine"]
