"""The lazy-tensor contract every reader implements.

A :class:`TensorSource` is a read-only, lazy mapping from tensor names to tensors. It
knows every name, shape and dtype up front (from file headers), and reads bytes only
when :meth:`TensorSource.load` is called. Loaded tensors are views on a memory map
wherever the format allows: they cost page cache, not private memory. Callers must not
modify them in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, runtime_checkable

import torch

from nemo_convert.errors import InputError
from nemo_convert.tensors.file_map import FileMap  # noqa: F401  (re-exported: part of the contract)

# safetensors dtype strings <-> torch dtypes (also used for our own headers).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
DTYPE_TO_SAFETENSORS: dict[torch.dtype, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (``torch.dtype.itemsize``, torch ≥ 2.1: equal to
    ``element_size()`` of a tensor of every dtype, without building one — this runs per
    tensor of a checkpoint)."""
    return dtype.itemsize


@dataclass(frozen=True)
class TensorInfo:
    """What is known about a tensor without reading it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_size(self.dtype)


@dataclass(frozen=True)
class ByteRegion:
    """A contiguous byte range of a file: a whole file, or a member of an uncompressed tar."""

    path: str
    offset: int
    length: int

    def open(self) -> "RegionReader":
        return RegionReader(self)

    def read(self, start: int = 0, size: int | None = None) -> bytes:
        if size is None:
            size = self.length - start
        if start < 0 or size < 0 or start + size > self.length:
            raise ValueError("read outside the region")
        with open(self.path, "rb") as f:
            f.seek(self.offset + start)
            data = f.read(size)
        if len(data) != size:
            raise InputError(f"{self.path}: file is truncated (wanted {size} bytes at {self.offset + start})")
        return data


class RegionReader:
    """A seekable, read-only binary file object over a :class:`ByteRegion`."""

    def __init__(self, region: ByteRegion) -> None:
        self._region = region
        self._f = open(region.path, "rb")
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        remaining = self._region.length - self._pos
        if size is None or size < 0 or size > remaining:
            size = remaining
        self._f.seek(self._region.offset + self._pos)
        data = self._f.read(size)
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0:
            new = pos
        elif whence == 1:
            new = self._pos + pos
        else:
            new = self._region.length + pos
        if new < 0:
            raise ValueError("negative seek position")
        self._pos = new
        return new

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __enter__(self) -> "RegionReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class TensorSource(Protocol):
    """A lazy, read-only collection of named tensors.

    Implementations: safetensors files (one or sharded), torch zip pickles read through
    the safe unpickler (``.bin``, ``.ckpt``, ``model_weights.ckpt``), distributed
    checkpoints, and views composed of those (prefix-stripped, merged ranks, …).
    """

    def keys(self) -> list[str]:
        """Every tensor name, in a stable order (file order where there is one)."""
        ...

    def info(self, key: str) -> TensorInfo:
        """Name, shape and dtype of ``key`` without reading it. Raises ``KeyError``."""
        ...

    def load(self, key: str) -> torch.Tensor:
        """The tensor ``key``; a memory-mapped view where possible. Do not modify it."""
        ...

    def group(self, key: str) -> str:
        """A label of where ``key`` lives (its file); the engine orders reads by it."""
        ...

    def close(self) -> None:
        """Release files and maps."""
        ...


def iter_infos(source: TensorSource) -> Iterator[TensorInfo]:
    for k in source.keys():
        yield source.info(k)
