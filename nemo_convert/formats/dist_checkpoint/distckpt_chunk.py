"""Reading one chunk of a ``torch_dist`` checkpoint: the ``torch.save`` of one tensor.

Only the chunk's small headers are parsed (by our own zip and pickle readers, no
``torch.load``); its storage is then memory-mapped in place when aligned, or just the
needed rows are read otherwise; anything unusual is a plain ``torch.load(weights_only=True)``.
:class:`~nemo_convert.formats.dist_checkpoint.distckpt_read.DistCheckpointSource` decides which chunks
make a tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import ByteRegion, FileMap, dtype_size
from nemo_convert.tensors.torch_zip import LazyTensor, read_tensor_archive

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
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
    them plainly). ``OSError`` propagates."""
    try:
        saved = read_tensor_archive(region, mapped)
        if isinstance(saved, LazyTensor) and not saved.metadata:
            offset, nbytes, crc = saved.storage.archive.stored_range(saved.storage)
            return ChunkLayout(offset, nbytes, saved.shape, saved.stride, saved.storage_offset, saved.dtype, crc)
    except InputError:
        pass
    return None


def load_chunk(region: ByteRegion, where: str, raw: str) -> torch.Tensor:
    """``torch.load(weights_only=True)`` of the chunk in ``region`` (of tensor ``raw``)."""
    import torch
    try:
        with region.open() as f:
            t = torch.load(f, map_location="cpu", weights_only=True)
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
