"""Memory maps of input files, and where a mapped tensor's bytes lie in its file.

Every tensor a reader hands out is a view on a :class:`FileMap` where the format allows.
Because a writer can ask which file and byte range a contiguous tensor views
(:func:`file_origin`), an output tensor that is just a range of an input — a renamed
weight, a dim-0 tensor-parallel slice, a dist-checkpoint tensor passed through — is
copied file to file in the kernel (``copy_file_range``) instead of through user memory,
which on our benchmark VM is ~1.5–2× faster than writing from the map
(docs/performance.md). Readers that know a stored record's CRC-32 (zip archives) note it
with :meth:`FileMap.note_checksum`, so a whole record written again needs no new pass.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
import weakref
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from nemo_convert.crc import crc32_combine
from nemo_convert.errors import InputError

#: The live maps by address: ``(start, end, map)`` sorted by ``start``, and the starts
#: alone (for :mod:`bisect`). Live maps never overlap, so :func:`file_origin` finds a
#: tensor's map with one search instead of asking every open map (a sharded checkpoint
#: has hundreds, and it is asked once per tensor). A map collected without
#: :meth:`FileMap.close` leaves a dead reference, dropped when a new map takes its
#: addresses or when a search meets it.
_BY_ADDRESS: list[tuple[int, int, "weakref.ref[FileMap]"]] = []
_STARTS: list[int] = []

if TYPE_CHECKING:
    import torch

_LOCK = threading.Lock()
#: ``MADV_DONTNEED`` where ``mmap.madvise`` exists (Python ≥ 3.8 on Linux and macOS), else None.
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None) if hasattr(mmap.mmap, "madvise") else None


def _index_add(fmap: FileMap, start: int, end: int) -> None:
    with _LOCK:
        i = bisect.bisect_left(_STARTS, start)
        j = i
        while j < len(_BY_ADDRESS) and _BY_ADDRESS[j][0] < end:  # dead maps whose addresses were reused
            j += 1
        while i > 0 and _BY_ADDRESS[i - 1][1] > start:
            i -= 1
        _BY_ADDRESS[i:j] = [(start, end, weakref.ref(fmap))]
        _STARTS[i:j] = [start]


def _index_remove(fmap: FileMap) -> None:
    with _LOCK:
        i = bisect.bisect_left(_STARTS, fmap.address)
        while i < len(_BY_ADDRESS) and _BY_ADDRESS[i][0] == fmap.address:
            if _BY_ADDRESS[i][2]() in (fmap, None):
                del _BY_ADDRESS[i], _STARTS[i]
            else:
                i += 1


def _index_find(address: int) -> FileMap | None:
    with _LOCK:
        i = bisect.bisect_right(_STARTS, address) - 1
        if i < 0 or address >= _BY_ADDRESS[i][1]:
            return None
        fmap = _BY_ADDRESS[i][2]()
        if fmap is None:
            del _BY_ADDRESS[i], _STARTS[i]
        return fmap


@dataclass(frozen=True)
class FileOrigin:
    """A contiguous byte range of an open input file that holds a tensor's bytes."""

    fileno: int
    offset: int
    length: int
    path: str
    source: "FileMap" = field(repr=False, compare=False)

    @property
    def crc32(self) -> int | None:
        """The CRC-32 of these bytes if it is known without reading them (see
        :meth:`FileMap.checksum_of`)."""
        return self.source.checksum_of(self.offset, self.length)

    def remember(self, crc32: int) -> None:
        """Record the CRC-32 computed for these bytes (for later ranges to derive from)."""
        self.source.remember(self.offset, self.length, crc32)


class FileMap:
    """A private (copy-on-write) memory map of a whole file, shared by the tensors on it.

    Mapping with ``ACCESS_COPY`` lets :func:`torch.frombuffer` build tensors without a
    read-only warning, while pages that are only read stay clean and file-backed: they
    are page cache, not private memory. Tensors on the map must never be modified (the
    :class:`~nemo_convert.tensors.base.TensorSource` contract): a writer may copy their
    bytes from the file rather than from memory.
    """

    def __init__(self, path: str) -> None:
        import torch
        self.path = path
        self.size = os.path.getsize(path)
        self._file = open(path, "rb")
        self._mmap: mmap.mmap | None = (
            mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY) if self.size else None
        )
        # Stored records (one per chunk read: a tensor-count cost) as one int each, end ->
        # ``start << 32 | CRC``; not also in the two tables of computed ranges, which their
        # lookups would not need: a record's own range is found here, and records never
        # overlap, so none is a step of another's chain (:meth:`_chain`).
        self._records: dict[int, int] = {}
        self._checksums: dict[tuple[int, int], int] = {}  # exact computed ranges
        self._from: dict[int, list[tuple[int, int]]] = {}  # start -> [(end, CRC)] of computed ranges
        # The byte range handed out (tensors, views) since the last release: what
        # ``release(touched_only=True)`` gives back.
        self._lo: int | None = None
        self._hi = 0
        self.address = 0
        if self._mmap is not None:
            probe = torch.frombuffer(self._mmap, dtype=torch.uint8, count=1)
            self.address = probe.data_ptr()
            del probe
            _index_add(self, self.address, self.address + self.size)

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor viewing ``numel(shape)`` elements at byte ``offset`` of the file."""
        import torch
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        if offset < 0 or offset + nbytes > self.size:
            raise InputError(f"{self.path}: tensor bytes [{offset}, {offset + nbytes}) lie outside the file")
        if numel == 0 or self._mmap is None:
            return torch.empty(shape, dtype=dtype)
        self._touch(offset, offset + nbytes)
        return torch.frombuffer(self._mmap, dtype=dtype, count=numel, offset=offset).view(shape)

    def view(self, offset: int, length: int) -> memoryview | None:
        """The file's bytes ``[offset, offset + length)`` in memory (no copy), or None when
        there is no map (an empty file) or the range lies outside the file."""
        if self._mmap is None or offset < 0 or length < 0 or offset + length > self.size:
            return None
        self._touch(offset, offset + length)
        return memoryview(self._mmap)[offset:offset + length]

    def _touch(self, lo: int, hi: int) -> None:
        if self._lo is None or lo < self._lo:
            self._lo = lo
        if hi > self._hi:
            self._hi = hi

    def note_checksum(self, offset: int, length: int, crc32: int) -> None:
        """Record the stored CRC-32 of bytes ``[offset, offset + length)`` (a zip record)."""
        self._records[offset + length] = offset << 32 | (crc32 & 0xFFFFFFFF)

    def remember(self, offset: int, length: int, crc32: int) -> None:
        """Record a CRC-32 computed for bytes ``[offset, offset + length)``."""
        if (offset, length) not in self._checksums:
            self._checksums[(offset, length)] = crc32 & 0xFFFFFFFF
            self._from.setdefault(offset, []).append((offset + length, crc32 & 0xFFFFFFFF))

    def checksum_of(self, offset: int, length: int) -> int | None:
        """The CRC-32 of ``[offset, offset + length)`` without reading it, or None: a range
        known as such, or the tail of a stored record whose head is covered by known
        ranges — CRCs are linear, so ``crc(tail) = crc(record) ^ shift(crc(head), len(tail))``.
        (Slices of a tensor-parallel split: every rank's CRC but the first is derived.)"""
        record = self._records.get(offset + length)
        if record is not None and record >> 32 == offset:
            return record & 0xFFFFFFFF
        known = self._checksums.get((offset, length))
        if known is not None or crc32_combine is None:
            return known
        if record is None or record >> 32 >= offset:
            return None
        head = self._chain(record >> 32, offset)
        return None if head is None else (record & 0xFFFFFFFF) ^ crc32_combine(head, 0, length)

    def _chain(self, start: int, end: int) -> int | None:
        """CRC-32 of ``[start, end)`` combined from known ranges that tile it, if they do."""
        assert crc32_combine is not None
        crc, at = 0, start
        while at < end:
            steps = [(e, c) for e, c in self._from.get(at, ()) if e <= end]
            if not steps:
                return None
            e, c = max(steps)
            crc, at = crc32_combine(crc, c, e - at), e
        return crc

    def origin(self, address: int, length: int) -> FileOrigin | None:
        """Where ``length`` bytes at memory ``address`` lie in the file, if on this map."""
        if self._mmap is None or self._file.closed or not self.address:
            return None
        offset = address - self.address
        if offset < 0 or offset + length > self.size:
            return None
        return FileOrigin(self._file.fileno(), offset, length, self.path, self)

    def release(self, *, touched_only: bool = False) -> bool:
        """Drop the map's resident pages from this process (``madvise(MADV_DONTNEED)``);
        with ``touched_only``, only those of the byte range handed out (:meth:`tensor`,
        :meth:`view`) since the last release, and nothing when there was none. Returns
        whether it advised the kernel.

        The map is private and only ever read, so its pages are clean copies of the file's
        page cache: dropping them frees nothing the file does not hold, and a tensor still
        viewing the map reads the same bytes again on its next access (a minor fault from
        the page cache). What it saves is the resident set — ``ru_maxrss`` counts mapped file
        pages — which otherwise grows with every input byte read (docs/performance.md,
        "Memory round"). The range kept is what keeps a frequent release cheap: the kernel
        walks only the pages of that range, not a whole shard's."""
        lo, hi = self._lo, self._hi
        self._lo, self._hi = None, 0
        if self._mmap is None or _DONTNEED is None or (touched_only and lo is None):
            return False
        start = 0 if lo is None or not touched_only else lo - lo % mmap.PAGESIZE
        length = self.size - start if not touched_only else min(hi, self.size) - start
        try:
            self._mmap.madvise(_DONTNEED, start, length)
        except (OSError, ValueError):  # advice is best effort
            return False
        return True

    def close(self) -> None:
        # Tensors may still view the map; dropping our reference lets the GC unmap it
        # once the last tensor is gone.
        if self._mmap is not None:
            _index_remove(self)
        self._mmap = None
        self._file.close()


def release_pages(*, touched_only: bool = False) -> int:
    """:meth:`FileMap.release` every live map (``touched_only``: the range of each that was
    handed out since its last release); returns how many were advised. The engine calls
    this every few MiB streamed and when a plan ends, so mapped inputs already read stop
    counting in the resident set (they stay in the page cache)."""
    with _LOCK:
        maps = [ref() for _, _, ref in _BY_ADDRESS]
    n = 0
    for fmap in maps:
        if fmap is not None and fmap.release(touched_only=touched_only):
            n += 1
    return n


def file_origin(t: torch.Tensor) -> FileOrigin | None:
    """The input file range holding ``t``'s bytes, when ``t`` is a contiguous CPU view on
    a live :class:`FileMap`; else None (computed tensors, copies, GPU tensors)."""
    if t.device.type != "cpu" or t.numel() == 0 or not t.is_contiguous() or t.requires_grad:
        return None
    address = t.data_ptr()
    fmap = _index_find(address)
    return None if fmap is None else fmap.origin(address, t.numel() * t.element_size())
