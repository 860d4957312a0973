"""Output files that start writing their finished bytes to disk while the conversion goes on.

Every output is fsynced before it is renamed into place (:mod:`~nemo_convert.formats.io.staging`).
Left alone, the kernel starts writing dirty pages back late, so that final fsync waits for
most of the output — ~0.7 s per 1.5 GB on our benchmark machine, half an import. Every
:data:`WRITEBACK_CHUNK` bytes, :class:`OutputFile` asks Linux to *start* writing the range
completed so far (``sync_file_range(SYNC_FILE_RANGE_WRITE)``: asynchronous, no waiting, no
durability promise — the fsync still gives that), so the disk works while we convert and
the fsync finds little left. Where the call does not exist (not Linux) or fails (a file
system without it, a pipe) it is silently skipped: it only changes timing, never bytes.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from nemo_convert.crc import crc32, crc32_combine
from nemo_convert.tensors import hugepages
from nemo_convert.tensors.file_map import FileOrigin, file_origin
from nemo_convert.tensors.pieces import Lazy, Pieces

if TYPE_CHECKING:
    import torch

#: Completed bytes between two writeback requests.
WRITEBACK_CHUNK = 32 << 20
_SYNC_FILE_RANGE_WRITE = 2
_BUFFER = 1 << 20
#: Bytes checksummed (and written) at a time: one pass over each piece while it is in cache.
PIECE = 4 << 20
#: ``copy_file_range`` errors that mean "not here" (other file system, old kernel, …).
NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_SYNC_FILE_RANGE = _load_sync_file_range() if os.name == "posix" else None


class OutputFile(io.BufferedWriter):
    """A buffered, write-only binary file (``open(path, "wb")``) that starts writeback of
    every completed :data:`WRITEBACK_CHUNK` (see the module docstring). Seeking back (a
    tar header patched in place) is fine: requests only ever move forward."""

    def __init__(self, path: str, *, chunk: int | None = None) -> None:
        super().__init__(io.FileIO(path, "wb"), buffer_size=_BUFFER)
        self._chunk = chunk or WRITEBACK_CHUNK
        self._requested = 0  # bytes [0, _requested) were handed to writeback
        self._enabled = _SYNC_FILE_RANGE is not None

    def write(self, data) -> int:  # type: ignore[no-untyped-def,override]
        n = super().write(data)
        if self._enabled:
            pos = self.tell()
            if pos - self._requested >= self._chunk:
                self._start_writeback(pos - pos % self._chunk)
        return n

    def copy_range(self, fileno: int, offset: int, size: int) -> bool:
        """Append ``size`` bytes of the open file ``fileno`` from byte ``offset``, in the
        kernel (``copy_file_range``: no pass through user memory). False, with nothing
        written, where the call is not available (then the caller writes the bytes)."""
        copy = getattr(os, "copy_file_range", None)
        if copy is None or size <= 0:
            return False
        self.flush()
        here = self.tell()
        done = 0
        try:
            while done < size:
                n = copy(fileno, self.fileno(), size - done, offset + done, here + done)
                if n == 0:
                    raise OSError(f"input ended after {done} of {size} bytes")
                done += n
        except OSError as exc:
            if done == 0 and exc.errno in NO_COPY_RANGE:
                return False
            raise
        self.seek(here + size)
        if self._enabled and here + size - self._requested >= self._chunk:
            self._start_writeback(here + size - (here + size) % self._chunk)
        return True

    def _start_writeback(self, end: int) -> None:
        assert _SYNC_FILE_RANGE is not None
        if _SYNC_FILE_RANGE(self.fileno(), self._requested, end - self._requested, _SYNC_FILE_RANGE_WRITE) != 0:
            self._enabled = False  # not supported here: plain writes from now on
            return
        self._requested = end

    @property
    def writeback_requested(self) -> int:
        """How many leading bytes were handed to writeback so far (for tests)."""
        return self._requested


def open_output(path: str) -> OutputFile:
    """Create (truncate) ``path`` for writing an output, with early writeback."""
    return OutputFile(path)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of ``t`` (contiguous copy only when needed)."""
    import torch
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():  # e.g. a row-parallel slice: one copy, on huge pages
        t = hugepages.empty(t.shape, t.dtype).copy_(t)
    if t.numel() == 0:
        return memoryview(b"")
    return t.reshape(-1).view(torch.uint8).numpy().data  # the array's own memoryview (it keeps the array)


@dataclass(frozen=True)
class Chunk:
    """Some bytes of an output tensor, and the input file range holding them, if any."""

    data: memoryview
    origin: FileOrigin | None


def tensor_chunks(t: Lazy) -> list[Chunk]:
    """The bytes of ``t`` in order: one chunk for a tensor, one per piece for
    :class:`~nemo_convert.tensors.pieces.Pieces`; each with its input file range."""
    parts = t.parts if isinstance(t, Pieces) else (t,)
    return [Chunk(tensor_bytes(p), file_origin(p)) for p in parts]


def checksum(chunks: list[Chunk]) -> int:
    """CRC-32 of the chunks' bytes in order. A chunk of an input file whose CRC is known or
    derivable (:meth:`~nemo_convert.tensors.file_map.FileMap.checksum_of`) is not read; a
    chunk that is read has its CRC remembered for later ones to derive from."""
    if crc32_combine is None:  # plain zlib: one running CRC over every byte
        crc = 0
        for c in chunks:
            for start in range(0, c.data.nbytes, PIECE):
                crc = crc32(c.data[start:start + PIECE], crc)
        return crc & 0xFFFFFFFF
    crc = 0
    for c in chunks:
        part = c.origin.crc32 if c.origin is not None else None
        if part is None:
            part = 0
            for start in range(0, c.data.nbytes, PIECE):
                part = crc32(c.data[start:start + PIECE], part)
            if c.origin is not None:
                c.origin.remember(part)
        crc = crc32_combine(crc, part, c.data.nbytes)
    return crc & 0xFFFFFFFF


def write_chunks(stream: Any, chunks: list[Chunk]) -> None:
    """Append the chunks' bytes to ``stream``: file to file for those that are ranges of an
    input file when the stream can ``copy_range``, else from memory, :data:`PIECE` at a time
    (so that early writeback keeps up)."""
    copy = getattr(stream, "copy_range", None)
    for c in chunks:
        if c.origin is not None and copy is not None and copy(c.origin.fileno, c.origin.offset, c.data.nbytes):
            continue
        for start in range(0, c.data.nbytes, PIECE):
            stream.write(c.data[start:start + PIECE])


def write_tensor(stream: Any, t: Lazy) -> None:
    """Append the bytes of ``t`` to ``stream`` (:func:`write_chunks`)."""
    write_chunks(stream, tensor_chunks(t))
