"""A streaming writer of the ``torch.save`` zip format.

``torch.save`` needs the whole state dict in memory; this writer takes tensors one at a
time and writes each storage as its own zip record straight to the output stream (a file,
or a member of a ``.nemo`` tar being written), then the pickled index (``data.pkl``)
and the zip directory at :meth:`TorchSaveWriter.close`. The result loads with
``torch.load(..., weights_only=True)`` (and with ``mmap=True``): records are STORED,
CRC-checked and 64-byte aligned like torch's own.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, BinaryIO

from nemo_convert.formats.io.output_file import PIECE, Chunk, checksum, tensor_chunks, write_chunks
from nemo_convert.tensors.base import dtype_name
from nemo_convert.tensors.pieces import Lazy

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    import torch

ALIGN = 64
#: Record bytes from memory up to this size are collected with their header and written
#: in one call; larger ones, and ranges of an input file, go to the stream as they are.
_SMALL = 64 << 10
_PENDING_MAX = 1 << 20
#: Where a (non-zip64) central directory entry holds its record's offset.
_CENTRAL_OFFSET = struct.calcsize("<IHHHHHHIIIHHHHHI")
#: ``(name, bytes)`` of a small record → (local header + bytes, central entry before and
#: after the offset): see :meth:`TorchSaveWriter._record`.
_RECORDS: dict[tuple[str, bytes], tuple[bytes, bytes, bytes]] = {}
_CACHED_RECORD = 4096  # the largest record kept there
_ARCHIVE = "archive"
#: One-tensor archives up to this many bytes of data are written from a template
#: (:func:`_one_tensor_archive`); larger ones are checksummed while written.
_TEMPLATE_MAX = PIECE
#: torch's name of a dtype → its typed storage class
_STORAGE_TYPES = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage",
    "bfloat16": "BFloat16Storage", "int64": "LongStorage", "int32": "IntStorage",
    "int16": "ShortStorage", "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage",
    "float8_e4m3fn": "Float8_e4m3fnStorage", "float8_e5m2": "Float8_e5m2Storage",
}


class _StorageRef:
    def __init__(self, key: str, dtype: torch.dtype, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _TensorRef:
    """Pickles as torch's ``_rebuild_tensor_v2(storage, 0, size, stride, False, {})``."""

    def __init__(self, storage: _StorageRef, shape: tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape

    def __reduce__(self) -> tuple[Any, ...]:
        import torch
        stride, acc = [], 1
        for s in reversed(self.shape):
            stride.append(acc)
            acc *= s
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, torch.Size(self.shape), tuple(reversed(stride)), False, OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        import torch
        if isinstance(obj, _StorageRef):
            storage_type = getattr(torch, _STORAGE_TYPES[dtype_name(obj.dtype)])
            return ("storage", storage_type, obj.key, "cpu", obj.numel)
        return None


_CHECKSUMS: tuple[int, ThreadPoolExecutor] | None = None


def _checksum_thread() -> ThreadPoolExecutor:
    """The one thread (per process: a forked child makes its own) that checksums a record
    while its bytes are written."""
    global _CHECKSUMS
    if _CHECKSUMS is None or _CHECKSUMS[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor  # when a file is written: readers import this module

        _CHECKSUMS = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="nemo-convert-crc"))
    return _CHECKSUMS[1]


class TorchSaveWriter:
    """Writes a ``torch.save``-compatible zip of a flat ``{name: tensor}`` dict, streamed."""

    def __init__(self, stream: BinaryIO) -> None:
        self._out = stream
        self._pos = 0  # bytes written by this writer: zip offsets are relative to its start
        self._pending = bytearray()  # small writes not yet handed to the stream (one write for many)
        try:
            self._seekable = bool(stream.seekable())
        except (AttributeError, OSError):
            self._seekable = False
        self._central: list[bytes] = []
        self._entries: "OrderedDict[str, _TensorRef]" = OrderedDict()
        self._closed = False

    def _write(self, data: Any) -> None:
        """Append bytes: collected, and handed to the stream by :meth:`_drain` (a chunk
        of a dist checkpoint is ~15 small writes through three stream layers otherwise)."""
        self._pending += data
        self._pos += memoryview(data).nbytes

    def _drain(self) -> None:
        if self._pending:
            self._out.write(self._pending)
            self._pending = bytearray()

    def _record(self, name: str, data: bytes) -> None:
        """A small record held in memory (the index, the version records). Its local
        header and bytes, and its central entry but for the offset, depend on its name and
        bytes alone: built once per process for each (a dist checkpoint writes the same
        few per chunk), then copied — the bytes :meth:`_record_chunks` would write."""
        offset = self._pos
        if offset >= 0xFFFFFFFF or len(data) > _CACHED_RECORD:
            self._record_chunks(name, [Chunk(memoryview(data).cast("B"), None)])
            return
        key = (name, data)
        got = _RECORDS.get(key)
        if got is None:
            saved = self._pos, self._pending, self._central
            self._pos, self._pending, self._central = 0, bytearray(), []
            try:
                self._record_chunks(name, [Chunk(memoryview(data).cast("B"), None)])
                local, central = bytes(self._pending), self._central[0]
            finally:
                self._pos, self._pending, self._central = saved
            if len(_RECORDS) >= 4096:
                _RECORDS.clear()
            got = _RECORDS[key] = (local, central[:_CENTRAL_OFFSET], central[_CENTRAL_OFFSET + 4:])
        local, head, tail = got
        self._write(local)
        self._central.append(head + struct.pack("<I", offset) + tail)

    def _record_chunks(self, name: str, chunks: list[Chunk]) -> None:
        """Write one STORED zip record whose bytes are ``chunks`` in order (see below)."""
        full = f"{_ARCHIVE}/{name}".encode()
        size = sum(c.data.nbytes for c in chunks)
        offset = self._pos
        zip64 = size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF
        base = 30 + len(full)
        z64_local = struct.pack("<HHQQ", 0x0001, 16, size, size) if zip64 else b""
        pad = -(base + len(z64_local) + 4) % ALIGN
        extra = z64_local + struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # torch's "FB" padding field
        s32 = 0xFFFFFFFF if zip64 else size
        version = 45 if zip64 else 20

        def header(crc: int) -> bytes:
            return struct.pack("<IHHHHHIIIHH", 0x04034B50, version, 0, 0, 0, 0, crc, s32, s32,
                               len(full), len(extra)) + full + extra

        # A large record on a seekable stream is checksummed by another thread while its
        # bytes are written (both release the GIL), and the CRC patched into the header
        # after; otherwise the CRC comes first. Chunks that are ranges of an input file go
        # file to file where the stream can copy_range.
        pending = _checksum_thread().submit(checksum, chunks) if self._seekable and size > PIECE else None
        if pending is not None:
            self._drain()
        header_at = self._out.tell() if pending is not None else 0
        crc = 0 if pending is not None else checksum(chunks)
        self._write(header(crc))
        try:
            if all(c.origin is None and c.data.nbytes <= _SMALL for c in chunks):
                for c in chunks:  # small bytes from memory: collected with the header
                    self._pending += c.data
                if len(self._pending) >= _PENDING_MAX:
                    self._drain()
            else:
                self._drain()
                write_chunks(self._out, chunks)
            self._pos += size
        finally:
            if pending is not None:
                crc = pending.result()  # also on failure: the thread must be done with the chunks
        if pending is not None:
            self._drain()
            end = self._out.tell()
            self._out.seek(header_at + 14)
            self._out.write(struct.pack("<I", crc))
            self._out.seek(end)
        c_extra = struct.pack("<HHQQQ", 0x0001, 24, size, size, offset) if zip64 else b""
        o32 = 0xFFFFFFFF if zip64 else offset
        self._central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, version, version, 0, 0, 0, 0, crc,
                                         s32, s32, len(full), len(c_extra), 0, 0, 0, 0, o32) + full + c_extra)

    def add(self, name: str, tensor: Lazy) -> None:
        """Append one tensor (written immediately; nothing is kept but its name and shape)."""
        if name in self._entries:
            raise ValueError(f"duplicate tensor name {name!r}")
        key = str(len(self._entries))
        ref = _StorageRef(key, tensor.dtype, tensor.numel())
        self._record_chunks(f"data/{key}", tensor_chunks(tensor))
        self._entries[name] = _TensorRef(ref, tuple(tensor.shape))

    def save_tensor(self, tensor: Lazy, *, flush: bool = True) -> None:
        """Write ``tensor`` itself (not a dict) as the archive's object, like
        ``torch.save(tensor, f)``; then :meth:`close` (``flush``: and flush the stream).

        A fresh writer and a tensor of at most :data:`_TEMPLATE_MAX` bytes (every chunk of a dist
        checkpoint but the largest) take :func:`_one_tensor_archive`: the same bytes from a
        template of the archive, with only the CRC and the tensor's bytes filled in."""
        if self._entries:
            raise ValueError("save_tensor writes a one-tensor archive")
        if self._pos == 0 and not self._closed:
            chunks = tensor_chunks(tensor)
            size = sum(c.data.nbytes for c in chunks)
            if size <= _TEMPLATE_MAX:
                self._pos = _one_tensor_archive(self._out, tensor.dtype, tensor.numel(), tuple(tensor.shape),
                                                chunks, size)
                self._closed = True
                if flush:
                    self._out.flush()
                return
        ref = _StorageRef("0", tensor.dtype, tensor.numel())
        self._record_chunks("data/0", tensor_chunks(tensor))
        self._single = _TensorRef(ref, tuple(tensor.shape))
        self.close(flush=flush)

    def close(self, *, flush: bool = True) -> None:
        """Write the index and the zip directory; ``flush`` the stream (a caller writing
        more into the same stream may leave that to its own end)."""
        if self._closed:
            return
        self._closed = True
        single = getattr(self, "_single", None)
        self._record("data.pkl", _single_pickle(single) if single is not None else _pickle(self._entries))
        self._record("byteorder", b"little")
        self._record("version", b"3\n")
        self._record(".data/version", b"3\n")
        cd_offset = self._pos
        for entry in self._central:
            self._write(entry)
        cd_size = self._pos - cd_offset
        n = len(self._central)
        if n >= 0xFFFF or cd_offset >= 0xFFFFFFFF or cd_size >= 0xFFFFFFFF:
            z64_end = self._pos
            self._write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_offset))
            self._write(struct.pack("<IIQI", 0x07064B50, 0, z64_end, 1))
            self._write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))
        else:
            self._write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, cd_size, cd_offset, 0))
        self._drain()
        if flush:
            self._out.flush()


def _pickle(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


_SINGLE_PICKLES: dict[tuple[torch.dtype, int, tuple[int, ...]], bytes] = {}


def _single_pickle(ref: _TensorRef) -> bytes:
    """``data.pkl`` of a one-tensor archive: a function of the storage's dtype and size
    and the shape alone, so pickled once per (dtype, numel, shape) — a dist checkpoint
    writes one such archive per chunk, most of them of a few shapes."""
    key = (ref.storage.dtype, ref.storage.numel, ref.shape)
    data = _SINGLE_PICKLES.get(key)
    if data is None:
        if len(_SINGLE_PICKLES) >= 4096:
            _SINGLE_PICKLES.clear()
        data = _SINGLE_PICKLES[key] = _pickle(ref)
    return data


#: Where a local header and a central directory entry hold the CRC-32 of their record.
_LOCAL_CRC = 14
_CENTRAL_CRC = 16
#: (dtype, numel, shape) → the bytes of a one-tensor archive before and after the tensor's
#: bytes, and where the data record's CRC goes in each (see :func:`_one_tensor_archive`).
_TEMPLATES: dict[tuple[Any, int, tuple[int, ...]], tuple[bytes, bytes, int]] = {}


def _template(dtype: torch.dtype, numel: int, shape: tuple[int, ...], size: int) -> tuple[bytes, bytes, int]:
    """The one-tensor archive of (``dtype``, ``numel``, ``shape``), ``size`` bytes of data,
    written once by the general path (:meth:`TorchSaveWriter.save_tensor`) over zero bytes,
    and cut around the data: every byte of it but the tensor's bytes and the data record's
    CRC (in its local header and its central entry) is a function of these alone — the
    records' offsets count from the archive's start, the index pickle is
    :func:`_single_pickle`'s."""
    key = (dtype, numel, shape)
    got = _TEMPLATES.get(key)
    if got is None:
        out = io.BytesIO()
        writer = TorchSaveWriter(out)
        ref = _StorageRef("0", dtype, numel)
        writer._record_chunks("data/0", [Chunk(memoryview(bytes(size)), None)])
        head = len(out.getvalue()) + len(writer._pending) - size
        writer._single = _TensorRef(ref, shape)
        writer.close(flush=False)
        data = out.getvalue()
        # The data record's central entry is the directory's first: its offset is in the
        # end record (the last 22 bytes; a one-tensor archive this small is never zip64).
        cd_offset = struct.unpack_from("<I", data, len(data) - 6)[0]
        if len(_TEMPLATES) >= 4096:
            _TEMPLATES.clear()
        got = _TEMPLATES[key] = (data[:head], data[head + size:], cd_offset - head - size + _CENTRAL_CRC)
    return got


def _one_tensor_archive(stream: BinaryIO, dtype: torch.dtype, numel: int, shape: tuple[int, ...],
                        chunks: list[Chunk], size: int) -> int:
    """Append ``torch.save(tensor)``'s archive of a tensor whose bytes are ``chunks``
    (``size`` ≤ :data:`_TEMPLATE_MAX` in all) to ``stream``, byte for byte what the general path of
    :meth:`TorchSaveWriter.save_tensor` writes, from :func:`_template`; returns its length."""
    head, tail, tail_crc = _template(dtype, numel, shape, size)
    crc = struct.pack("<I", checksum(chunks))
    head = head[:_LOCAL_CRC] + crc + head[_LOCAL_CRC + 4:]
    tail = tail[:tail_crc] + crc + tail[tail_crc + 4:]
    if all(c.origin is None for c in chunks):
        stream.write(b"".join((head, *(c.data for c in chunks), tail)))
    else:
        stream.write(head)
        write_chunks(stream, chunks)
        stream.write(tail)
    return len(head) + size + len(tail)
