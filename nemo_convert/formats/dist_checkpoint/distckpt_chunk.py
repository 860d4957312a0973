"""Reading one chunk of a ``torch_dist`` checkpoint: the ``torch.save`` of one tensor.

Only the chunk's small headers are parsed (by our own zip and pickle readers, no
``torch.load``); its storage is then memory-mapped in place when aligned, or just the
needed rows are read otherwise; anything unusual is a plain ``torch.load(weights_only=True)``.
:class:`~nemo_convert.formats.dist_checkpoint.distckpt_read.DistCheckpointSource` decides which chunks
make a tensor.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from typing import IO, TYPE_CHECKING, cast

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import ByteRegion, FileMap, dtype_size
from nemo_convert.tensors.torch_zip import LazyTensor, read_tensor_archive

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """Where a chunk's storage bytes lie and how the saved tensor views them."""

    data_offset: int  # absolute, in the region's file
    storage_bytes: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    crc32: int | None = None  # the record's stored CRC-32, when the storage is the whole record


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def read_layout(region: ByteRegion, mapped: memoryview | None = None) -> ChunkLayout | None:
    """The storage layout of the ``torch.save`` bytes in ``region`` (``mapped``: those bytes,
    where the file is mapped already), or None when they are not what we map (then load
    them plainly). ``OSError`` propagates.

    Mapped chunks are first compared with the archives read before (:class:`_Template`):
    one that differs from an earlier one only in its tensor's bytes and their CRC-32 has
    that one's layout, moved, without its zip directory and index being parsed again."""
    if mapped is not None:
        for template in _TEMPLATES.get(len(mapped), ()):
            layout = template.layout_of(region, mapped)
            if layout is not None:
                return layout
    try:
        saved = read_tensor_archive(region, mapped)
        if isinstance(saved, LazyTensor) and not saved.metadata:
            offset, nbytes, crc = saved.storage.archive.stored_range(saved.storage)
            layout = ChunkLayout(offset, nbytes, saved.shape, saved.stride, saved.storage_offset, saved.dtype, crc)
            if mapped is not None:
                _remember(region, mapped, layout)
            return layout
    except InputError:
        pass
    return None


_LOCAL_SIG, _CENTRAL_SIG = b"PK\x03\x04", b"PK\x01\x02"
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a zip local header, before its name
#: Templates per archive length (a few: two shapes may give archives of one length).
_TEMPLATES: dict[int, list[_Template]] = {}
_TEMPLATES_PER_LENGTH = 4


@dataclass(frozen=True)
class _Template:
    """A chunk archive read in full, cut around its storage's bytes (a STORED record that is
    exactly the storage): ``head`` before them, ``tail`` after, the record's CRC-32 at
    ``local_crc`` in ``head`` (its local header) and ``central_crc`` in ``tail`` (its
    directory entry). The reader's parse (:func:`read_tensor_archive`) depends on no byte
    of the record's data nor on those CRC fields but for passing the directory's CRC on:
    an archive equal to this one everywhere else has the same layout at its own offset."""

    head: bytes
    tail: bytes
    local_crc: int
    central_crc: int
    layout: ChunkLayout

    def layout_of(self, region: ByteRegion, buf: memoryview) -> ChunkLayout | None:
        head, tail, lc, cc = self.head, self.tail, self.local_crc, self.central_crc
        start = len(buf) - len(tail)
        crc = buf[start + cc:start + cc + 4]
        if (buf[lc:lc + 4] != crc or buf[:lc] != head[:lc] or buf[lc + 4:len(head)] != head[lc + 4:]
                or buf[start:start + cc] != tail[:cc] or buf[start + cc + 4:] != tail[cc + 4:]):
            return None
        t = self.layout
        return ChunkLayout(region.offset + len(head), t.storage_bytes, t.shape, t.stride, t.storage_offset,
                           t.dtype, int.from_bytes(crc, "little"))


def _remember(region: ByteRegion, buf: memoryview, layout: ChunkLayout) -> None:
    """Keep ``layout``'s archive as a :class:`_Template` when its storage is one whole
    STORED record whose local header and single directory entry can be told apart (else
    nothing: such chunks are read in full each time)."""
    if layout.crc32 is None:
        return
    begin = layout.data_offset - region.offset
    end = begin + layout.storage_bytes
    crc = layout.crc32.to_bytes(4, "little")
    head, tail = bytes(buf[:begin]), bytes(buf[end:])
    local = [i for i in range(len(head) - _LOCAL.size + 1) if head.startswith(_LOCAL_SIG, i)]
    local = [i for i in local if head[i + 14:i + 18] == crc and
             i + _LOCAL.size + sum(_LOCAL.unpack_from(head, i)[-2:]) == begin]
    central = [i + 16 for i in range(len(tail)) if tail.startswith(_CENTRAL_SIG, i) and tail[i + 16:i + 20] == crc
               and int.from_bytes(tail[i + 42:i + 46], "little") in local]
    if len(local) != 1 or len(central) != 1:
        return
    held = _TEMPLATES.setdefault(len(buf), [])
    if len(held) >= _TEMPLATES_PER_LENGTH:
        held.pop(0)
    held.append(_Template(head, tail, local[0] + 14, central[0], layout))
    if len(_TEMPLATES) > 4096:
        _TEMPLATES.clear()


def load_chunk(region: ByteRegion, where: str, raw: str) -> torch.Tensor:
    """``torch.load(weights_only=True)`` of the chunk in ``region`` (of tensor ``raw``)."""
    import torch
    try:
        with region.open() as f:
            t = torch.load(cast(IO[bytes], f), map_location="cpu", weights_only=True)  # a read-only file object
    except Exception as exc:
        raise InputError(f"{where}: cannot read a chunk of {raw} "
                         f"({type(exc).__name__}: {exc}); the data file may be truncated") from exc
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{where}: a chunk of {raw} is not a tensor")
    return t


def layout_tensor(region: ByteRegion, layout: ChunkLayout, lo: int, hi: int,
                  maps: dict[str, FileMap]) -> tuple[torch.Tensor, bool]:
    """The chunk as ``layout`` says: a view of the mapped file where the storage is aligned
    (``maps`` holds one :class:`FileMap` per file), else read — only rows ``[lo, hi)``
    (dim 0) when the storage is contiguous. Returns ``(tensor, whether it is only those rows)``."""
    import torch
    dtype = layout.dtype
    esize = dtype_size(dtype)
    if layout.data_offset % esize == 0:
        fmap = maps.get(region.path)
        if fmap is None:
            fmap = maps[region.path] = FileMap(region.path)
        if layout.crc32 is not None:
            fmap.note_checksum(layout.data_offset, layout.storage_bytes, layout.crc32)
        flat = fmap.tensor(layout.data_offset, (layout.storage_bytes // esize,), dtype)
        return flat.as_strided(layout.shape, layout.stride, flat.storage_offset() + layout.storage_offset), False
    if layout.stride == contiguous_strides(layout.shape) and layout.shape:
        row = math.prod(layout.shape[1:])
        first = layout.storage_offset + lo * row
        data = bytearray(ByteRegion(region.path, layout.data_offset, layout.storage_bytes)
                         .read(first * esize, (hi - lo) * row * esize))
        rows = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        return rows.view((hi - lo,) + layout.shape[1:]), True
    data = bytearray(ByteRegion(region.path, layout.data_offset, layout.storage_bytes).read())
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.as_strided(layout.shape, layout.stride, layout.storage_offset), False
