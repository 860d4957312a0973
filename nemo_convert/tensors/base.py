"""The lazy-tensor contract every reader implements.

A :class:`TensorSource` is a read-only, lazy mapping from tensor names to tensors. It
knows every name, shape and dtype up front (from file headers), and reads bytes only
when :meth:`TensorSource.load` is called. Loaded tensors are views on a memory map
wherever the format allows: they cost page cache, not private memory. Callers must not
modify them in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol, Union, runtime_checkable

from nemo_convert.errors import InputError
from nemo_convert.tensors.file_map import FileMap  # noqa: F401  (re-exported: part of the contract)

if TYPE_CHECKING:
    import torch

#: Bytes per element of the dtypes a checkpoint header can name, by torch's name for each
#: (``str(torch.bfloat16)`` without ``torch.``). Readers describe tensors by these names
#: (:attr:`TensorInfo.dtype_name`), so that opening a checkpoint and listing its tensors
#: never imports torch; torch's dtype objects are made when a tensor is read or computed.
DTYPE_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}

#: safetensors' dtype strings → torch's names (also used for our own headers).
SAFETENSORS_DTYPE_NAMES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
NAME_TO_SAFETENSORS: dict[str, str] = {v: k for k, v in SAFETENSORS_DTYPE_NAMES.items()}

DType = Union["torch.dtype", str]  # a torch dtype, or torch's name for it


def dtype_name(dtype: DType) -> str:
    """torch's name of ``dtype`` (``"bfloat16"`` for ``torch.bfloat16``); a name as it is."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype ``dtype`` names. Imports torch: call it where a tensor is made."""
    if not isinstance(dtype, str):
        return dtype
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        import torch

        found = getattr(torch, dtype, None)
        if not isinstance(found, torch.dtype):
            raise InputError(f"unknown dtype {dtype!r}")
        _TORCH_DTYPES[dtype] = found
    return found


def is_dtype_name(name: str) -> bool:
    """Is ``name`` one of torch's dtypes? Known names are answered without torch; another
    (a dtype newer than :data:`DTYPE_SIZES`) is looked up in torch."""
    if name in DTYPE_SIZES:
        return True
    try:
        torch_dtype(name)
    except InputError:
        return False
    return True


def dtype_size(dtype: DType) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or its name). A torch dtype answers
    with ``torch.dtype.itemsize`` (torch ≥ 2.1), without building a tensor or a name: this
    runs per tensor of a checkpoint."""
    if not isinstance(dtype, str):
        return dtype.itemsize
    size = DTYPE_SIZES.get(dtype)
    return size if size is not None else torch_dtype(dtype).itemsize


@dataclass(frozen=True, init=False, slots=True)
class TensorInfo:
    """What is known about a tensor without reading it. The dtype is kept by name
    (``dtype_name``, what headers say); :attr:`dtype` is the torch dtype."""

    name: str
    shape: tuple[int, ...]
    dtype_name: str

    def __init__(self, name: str, shape: tuple[int, ...], dtype: DType | None = None, *,
                 dtype_name: str | None = None) -> None:
        # (``dtype_name=`` is what dataclasses.replace passes; a ``dtype`` given with it wins)
        given = dtype if dtype is not None else dtype_name
        if given is None:
            raise TypeError("TensorInfo needs a dtype")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype_name", _name_of(given))

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_name)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_size(self.dtype_name)


_name_of = dtype_name  # (the parameter of TensorInfo.__init__ hides the function)


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

    def readline(self, size: int = -1) -> bytes:
        """Up to and including the next ``\n`` (at most ``size`` bytes; the pickle readers
        ask for lines only for text opcodes, so a plain loop)."""
        out = bytearray()
        while size < 0 or len(out) < size:
            chunk = self.read(256 if size < 0 else min(256, size - len(out)))
            if not chunk:
                break
            end = chunk.find(b"\n")
            if end >= 0:
                out += chunk[:end + 1]
                self._pos -= len(chunk) - end - 1
                break
            out += chunk
        return bytes(out)

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
