"""The parts of the dist-checkpoint support that need ``torch.distributed.checkpoint``
(slow to import): building torch's ``Metadata`` objects and reading ``.metadata`` safely.
Writing never needs this module (see :mod:`nemo_convert.formats.dcp_pickle`)."""

from __future__ import annotations

import collections
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import filesystem as _dcp_fs
from torch.distributed.checkpoint import metadata as _dcp_md
from torch.distributed.checkpoint import planner as _dcp_planner

from nemo_convert.errors import InputError, NemoConvertError, UnsafePickleError
from nemo_convert.formats.distckpt import DCP_VERSION, DistRecords, metadata_entries


def build_metadata(records: DistRecords, error: type[NemoConvertError]) -> Any:
    """torch's ``Metadata`` for merged records (tests compare our pickle against it)."""
    tensors, objects = metadata_entries(records, error)
    state_dict_md: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for key, shape, dtype, chunks in tensors:
        state_dict_md[key] = _dcp_md.TensorStorageMetadata(
            properties=_dcp_md.TensorProperties(dtype=dtype), size=torch.Size(shape),
            chunks=[_dcp_md.ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(siz))
                    for off, siz, _, _, _ in chunks])
        for i, (off, _, path, offset, length) in enumerate(chunks):
            storage[_dcp_md.MetadataIndex(key, off, i)] = _dcp_fs._StorageInfo(path, offset, length)
    for key, path, offset, length in objects:
        state_dict_md[key] = _dcp_md.BytesStorageMetadata()
        storage[_dcp_md.MetadataIndex(key)] = _dcp_fs._StorageInfo(path, offset, length)
    return _dcp_md.Metadata(state_dict_metadata=state_dict_md, planner_data={k: (k,) for k in state_dict_md},
                            storage_data=storage, storage_meta=None, version=DCP_VERSION)


# --------------------------------------------------------------------------- reading


def _pure_posix(*parts: str) -> str:
    import pathlib

    return str(pathlib.PurePosixPath(*parts))


def _pure_windows(*parts: str) -> str:
    import pathlib

    return str(pathlib.PureWindowsPath(*parts))


_MD = "torch.distributed.checkpoint.metadata"
_OLD_MD = "torch.distributed._shard.sharded_tensor.metadata"
_PLANNER = "torch.distributed.checkpoint.planner"
_ALLOWED: dict[tuple[str, str], Any] = {
    **{(_MD, n): getattr(_dcp_md, n) for n in (
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
       if hasattr(_dcp_md, n)},
    # torch < 2.2 pickled TensorProperties from its old home; the state is the same.
    (_OLD_MD, "TensorProperties"): _dcp_md.TensorProperties,
    (_OLD_MD, "MEM_FORMAT_ENCODING"): _dcp_md._MEM_FORMAT_ENCODING,
    (_OLD_MD, "_MEM_FORMAT_ENCODING"): _dcp_md._MEM_FORMAT_ENCODING,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _dcp_fs._StorageInfo,
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"): _dcp_fs._StoragePrefix,
    # Megatron-Core 0.16 also pickles every rank's save plan (``all_local_plans``).
    **{(_PLANNER, n): getattr(_dcp_planner, n) for n in (
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData") if hasattr(_dcp_planner, n)},
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
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
    """Resolves only the globals a DCP ``.metadata`` pickle needs."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is not None:
            return found
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise UnsafePickleError(f"the .metadata pickle asks for {module}.{name}, which is not allowed")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("the .metadata pickle holds a persistent id, which is not allowed")


def load_metadata(data: bytes, where: str) -> Any:
    """Unpickle and sanity-check a DCP ``.metadata`` without running arbitrary code."""
    try:
        md = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # truncated / corrupted pickle
        raise InputError(f"{where}: cannot read .metadata ({type(exc).__name__}: {exc})") from exc
    if not isinstance(md, _dcp_md.Metadata) or not isinstance(getattr(md, "state_dict_metadata", None), dict):
        raise InputError(f"{where}: .metadata is not a torch distributed-checkpoint Metadata")
    storage = getattr(md, "storage_data", None)
    if not isinstance(storage, dict):
        raise InputError(f"{where}: .metadata has no storage records")
    for index, info in storage.items():
        if (not isinstance(index, _dcp_md.MetadataIndex) or not isinstance(info, _dcp_fs._StorageInfo)
                or not isinstance(getattr(index, "fqn", None), str)
                or not _is_ints(getattr(index, "offset", None), allow_none=True)
                or not isinstance(getattr(info, "relative_path", None), str)
                or not _is_ints((getattr(info, "offset", None), getattr(info, "length", None)))):
            raise InputError(f"{where}: .metadata has a malformed storage record {index!r}")
    for key, item in md.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(
                item, (_dcp_md.TensorStorageMetadata, _dcp_md.BytesStorageMetadata)):
            raise InputError(f"{where}: .metadata has a malformed entry {key!r}")
        if isinstance(item, _dcp_md.TensorStorageMetadata):
            props = getattr(item, "properties", None)
            chunks = getattr(item, "chunks", None)
            if (not isinstance(getattr(props, "dtype", None), torch.dtype) or not _is_ints(getattr(item, "size", None))
                    or not isinstance(chunks, list)
                    or not all(_is_ints(getattr(c, "offsets", None)) and _is_ints(getattr(c, "sizes", None))
                               for c in chunks)):
                raise InputError(f"{where}: .metadata has a malformed tensor entry {key!r}")
    return md


def _is_ints(value: Any, *, allow_none: bool = False) -> bool:
    if value is None:
        return allow_none
    return isinstance(value, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in value)


