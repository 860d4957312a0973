"""Reading a DCP ``.metadata`` pickle safely, without importing ``torch.distributed.checkpoint``.

That package costs ~0.9 s to import (it pulls in the compiler stack) — more than a third
of resharding a 1.5 GB model. The pickle only *names* torch's dataclasses, so an
allow-listing unpickler resolves those names to the small stand-ins below, which hold
the same fields. Nothing else can be constructed. Writing has its own stand-ins
(:mod:`nemo_convert.formats.dist_checkpoint.dcp_pickle`).
"""

from __future__ import annotations

import collections
import io
import pickle
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from nemo_convert.errors import InputError, UnsafePickleError
from nemo_convert.tensors.base import is_dtype_name, torch_dtype

if TYPE_CHECKING:
    import torch


class DcpRecord:
    """One of torch's DCP dataclasses, as its pickled fields (``NEWOBJ`` + ``BUILD``)."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise UnsafePickleError(f"unexpected pickled state for {type(self).__name__}")
        # The pickle's own state dict becomes the instance's, not copied: the unpickler's
        # memo holds it to the end of the load, so a copy was a second dict per record
        # (three records per chunk; ~4.5 MiB at 64 experts of DeepSeek-V3).
        self.__dict__ = state

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({fields})"


class Metadata(DcpRecord):
    state_dict_metadata: Any = None
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Any = None
    version: Any = None


class TensorStorageMetadata(DcpRecord):
    properties: Any = None
    size: Any = None
    chunks: Any = None


class ChunkStorageMetadata(DcpRecord):
    offsets: Any = None
    sizes: Any = None


class BytesStorageMetadata(DcpRecord):
    pass


class StorageInfo(DcpRecord):
    """torch's ``filesystem._StorageInfo``: where one item's bytes are."""

    relative_path: Any = None
    offset: Any = None
    length: Any = None


class GenericRecord(DcpRecord):
    """Records we only need to tolerate (``StorageMeta``, save plans, …)."""


class MCoreMetadata(Metadata):
    """Megatron-Core 0.15's ``Metadata`` subclass, which adds ``mcore_data`` (read as a
    plain ``Metadata``: ``mcore_data`` only matters for optimizer states)."""


class TorchName(str):
    """A torch object the pickle names (a dtype, layout or memory format), kept as its name
    (``"bfloat16"``, ``"strided"``): reading ``.metadata`` needs no torch."""


class PickledDtype(TorchName):
    """A torch dtype the pickle names (``torch.bfloat16`` → ``"bfloat16"``)."""


class TensorProperties(DcpRecord):
    """Pickled as a tuple ``(dtype, layout, requires_grad, memory format code, pin_memory)``.
    The dtype is kept by name (``dtype_name``); :attr:`dtype` is torch's."""

    dtype_name: Any = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) != 5:
            raise UnsafePickleError("unexpected pickled state for TensorProperties")
        dtype, self.layout, self.requires_grad, self.memory_format, self.pin_memory = state
        self.dtype_name = str(dtype) if isinstance(dtype, PickledDtype) else None

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_name)


class EnumMember:
    """A member of one of torch's DCP enums, rebuilt as ``Enum(value)``."""

    def __init__(self, value: Any) -> None:
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            raise UnsafePickleError("unexpected enum value in the .metadata pickle")
        self.value = value


class MetadataIndex:
    """torch's ``MetadataIndex``: equal and hashed on ``(fqn, offset)`` like the original
    (``index`` is only a search hint), so it looks up ``storage_data`` keys."""

    fqn: Any = None
    offset: Any = None
    index: Any = None

    def __init__(self, fqn: str, offset: Sequence[int] | None = None, index: int | None = None) -> None:
        self.fqn, self.index = fqn, index
        self.offset = None if offset is None else tuple(offset)

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict) or not set(state) <= {"fqn", "offset", "index"}:
            raise UnsafePickleError("unexpected pickled state for MetadataIndex")
        self.__dict__ = state  # not copied (DcpRecord.__setstate__)

    def _key(self) -> tuple[Any, Any]:
        return self.fqn, None if self.offset is None else tuple(self.offset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetadataIndex) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"MetadataIndex(fqn={self.fqn!r}, offset={self.offset!r}, index={self.index!r})"


def _pure_posix(*parts: str) -> str:
    import pathlib

    return str(pathlib.PurePosixPath(*parts))


def _pure_windows(*parts: str) -> str:
    import pathlib

    return str(pathlib.PureWindowsPath(*parts))


#: torch's layouts and memory formats (``torch.layout`` / ``torch.memory_format`` objects)
_LAYOUTS = frozenset(("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn",
                      "jagged"))
_MEMORY_FORMATS = frozenset(("contiguous_format", "channels_last", "channels_last_3d", "preserve_format"))


def _size(dims: Any = ()) -> tuple[int, ...]:
    if not _is_ints(dims):
        raise UnsafePickleError("the .metadata pickle builds torch.Size from something other than sizes")
    return tuple(dims)


def _get_layout(name: Any) -> TorchName:
    """``torch.serialization._get_layout("torch.strided")``, as the layout's name."""
    if not (isinstance(name, str) and name.startswith("torch.") and name[len("torch."):] in _LAYOUTS):
        raise UnsafePickleError(f"the .metadata pickle asks for layout {name!r}, which is not allowed")
    return TorchName(name[len("torch."):])


def _enum(name: str) -> type[EnumMember]:
    return type(name, (EnumMember,), {})


_MD = "torch.distributed.checkpoint.metadata"
_OLD_MD = "torch.distributed._shard.sharded_tensor.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
_PLANNER = "torch.distributed.checkpoint.planner"
# Megatron-Core's own records; 0.16 keeps them only as empty classes so that it can read
# what older versions wrote (strategies/torch.py L86-98 at core_v0.16.1).
_MCORE = "megatron.core.dist_checkpointing.strategies.torch"
_MEM_FORMAT = _enum("_MEM_FORMAT_ENCODING")
_ALLOWED: dict[tuple[str, str], Any] = {
    (_MD, "Metadata"): Metadata,
    (_MD, "TensorStorageMetadata"): TensorStorageMetadata,
    (_MD, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_MD, "BytesStorageMetadata"): BytesStorageMetadata,
    (_MD, "MetadataIndex"): MetadataIndex,
    (_MD, "TensorProperties"): TensorProperties,
    (_MD, "StorageMeta"): type("StorageMeta", (GenericRecord,), {}),
    (_MD, "_MEM_FORMAT_ENCODING"): _MEM_FORMAT,
    # torch < 2.2 pickled TensorProperties from its old home; the state is the same.
    (_OLD_MD, "TensorProperties"): TensorProperties,
    (_OLD_MD, "MEM_FORMAT_ENCODING"): _MEM_FORMAT,
    (_OLD_MD, "_MEM_FORMAT_ENCODING"): _MEM_FORMAT,
    (_FS, "_StorageInfo"): StorageInfo,
    (_FS, "_StoragePrefix"): type("_StoragePrefix", (GenericRecord,), {}),
    # Megatron-Core >= 0.11 also pickles every rank's save plan (``all_local_plans``,
    # strategies/state_dict_saver.py L141-144 at core_v0.16.1): torch's SavePlan in 0.16,
    # its subclass MCoreSavePlan (+ ``mcore_data``) in 0.8-0.15 (strategies/torch.py
    # L471-474 at core_v0.15.0); 0.8-0.14 set ``Metadata.mcore_data``, 0.15 pickles the
    # subclass MCoreMetadata (L462-467, L545). Their contents are never used.
    **{(_PLANNER, n): type(n, (GenericRecord,), {})
       for n in ("SavePlan", "WriteItem", "TensorWriteData", "BytesIOWriteData")},
    (_PLANNER, "WriteItemType"): _enum("WriteItemType"),
    (_MCORE, "MCoreSavePlan"): type("MCoreSavePlan", (GenericRecord,), {}),
    (_MCORE, "MCoreMetadata"): MCoreMetadata,
    ("torch", "Size"): _size,  # a tuple subclass: kept as the tuple
    ("torch.serialization", "_get_layout"): _get_layout,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "list"): list,
    ("builtins", "dict"): dict,
    ("builtins", "tuple"): tuple,
    # StorageMeta.checkpoint_id may be a path: keep it as a plain string.
    **{(m, n): _pure_posix for m in ("pathlib", "pathlib._local") for n in ("PosixPath", "PurePosixPath")},
    **{(m, n): _pure_windows for m in ("pathlib", "pathlib._local") for n in ("WindowsPath", "PureWindowsPath")},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals a DCP ``.metadata`` pickle needs, to stand-ins."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is not None:
            return found
        if module == "torch" and (name in _LAYOUTS or name in _MEMORY_FORMATS):
            return TorchName(name)
        if module == "torch" and is_dtype_name(name):
            return PickledDtype(name)
        raise UnsafePickleError(f"the .metadata pickle asks for {module}.{name}, which is not allowed")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("the .metadata pickle holds a persistent id, which is not allowed")


def load_metadata(data: bytes | IO[bytes], where: str) -> Metadata:
    """Unpickle and sanity-check a DCP ``.metadata`` (its bytes, or a binary file object
    positioned at its start) without running arbitrary code."""
    try:
        md = _MetadataUnpickler(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # truncated / corrupted pickle
        raise InputError(f"{where}: cannot read .metadata ({type(exc).__name__}: {exc})") from exc
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise InputError(f"{where}: .metadata is not a torch distributed-checkpoint Metadata")
    storage = md.storage_data
    if not isinstance(storage, dict):
        raise InputError(f"{where}: .metadata has no storage records")
    for index, info in storage.items():
        if (not isinstance(index, MetadataIndex) or not isinstance(info, StorageInfo)
                or not isinstance(index.fqn, str) or not _is_ints(index.offset, allow_none=True)
                or not isinstance(info.relative_path, str) or not _is_ints((info.offset, info.length))):
            raise InputError(f"{where}: .metadata has a malformed storage record {index!r}")
    for key, item in md.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(item, (TensorStorageMetadata, BytesStorageMetadata)):
            raise InputError(f"{where}: .metadata has a malformed entry {key!r}")
        if isinstance(item, TensorStorageMetadata):
            props, chunks = item.properties, item.chunks
            if (not isinstance(props, TensorProperties) or props.dtype_name is None
                    or not _is_ints(item.size) or not isinstance(chunks, list)
                    or not all(isinstance(c, ChunkStorageMetadata) and _is_ints(c.offsets) and _is_ints(c.sizes)
                               for c in chunks)):
                raise InputError(f"{where}: .metadata has a malformed tensor entry {key!r}")
    return md


def _is_ints(value: Any, *, allow_none: bool = False) -> bool:
    # Runs for every chunk and storage record (three times per chunk): a plain loop.
    if value is None:
        return allow_none
    if not isinstance(value, (tuple, list)):
        return False
    for v in value:
        if type(v) is not int and (not isinstance(v, int) or isinstance(v, bool)):
            return False
        if not 0 <= v < _INT_LIMIT:
            return False
    return True


_INT_LIMIT = 2**62
