"""Megatron-Core distributed checkpoints (``torch_dist`` backend): the shared format facts.

A dist checkpoint is a folder (``model_weights/`` in a NeMo 1 ``.nemo``, ``weights/`` in
NeMo 2) holding:

- ``__<rank>_<i>.distcp`` data files: a sequence of items, each the ``torch.save`` bytes of
  one tensor chunk, or of one Python object (a "BYTE_IO" item, e.g. ``[None]`` for a
  Transformer-Engine ``_extra_state``);
- ``.metadata``: a pickled ``torch.distributed.checkpoint.metadata.Metadata`` naming, for
  every key, its global shape, dtype and chunks, and for every chunk/object where its
  bytes are (file, offset, length);
- ``common.pt`` (``torch.save({})`` for model weights) and ``metadata.json`` (the backend
  config), which is written last and is what marks the folder as a dist checkpoint.

This module holds what the writer (:mod:`.distckpt_write`) and the reader
(:mod:`.distckpt_read`) share: the records a writer produces, turning records into torch's
``Metadata``, the tiling check, and reading ``.metadata`` through a restricted
unpickler. The writer and reader classes are re-exported here lazily, so
``from nemo_convert.formats.distckpt import DistCheckpointWriter`` works.
"""

from __future__ import annotations

import bisect
import collections
import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint import filesystem as _dcp_fs
from torch.distributed.checkpoint import metadata as _dcp_md
from torch.distributed.checkpoint import planner as _dcp_planner

from nemo_convert.errors import InputError, NemoConvertError, UnsafePickleError

METADATA_JSON = "metadata.json"
DCP_METADATA = ".metadata"
COMMON_PT = "common.pt"
# The Megatron-Core 0.16 layout: both 0.16 and 0.19 read it (megatron-compat.md §2).
TORCH_DIST_CONFIG: dict[str, Any] = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
DCP_VERSION: str = getattr(_dcp_fs, "CURRENT_DCP_VERSION", "1.0.0")

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


@dataclass(frozen=True)
class ChunkRecord:
    """Where one chunk of a global tensor was written."""

    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    relative_path: str
    offset: int
    length: int


@dataclass(frozen=True)
class ObjectRecord:
    """Where one BYTE_IO item (a ``torch.save``-d Python object) was written."""

    key: str
    relative_path: str
    offset: int
    length: int


@dataclass
class DistRecords:
    """Everything one writer (one process) wrote; rank 0 merges these into ``.metadata``.

    Plain data (tuples, strings, dtypes), so it pickles across processes.
    """

    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    chunks: list[ChunkRecord] = field(default_factory=list)
    objects: list[ObjectRecord] = field(default_factory=list)


_MAX_GRID_CELLS = 1 << 24


def _volume(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def format_box(offsets: Sequence[int], sizes: Sequence[int]) -> str:
    """``[0:1, 0:24, 0:16]`` for a box given by offsets and sizes."""
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(offsets, sizes)) + "]"


def tiling_problems(shape: tuple[int, ...], boxes: Sequence[Box],
                    limit: int = 8) -> tuple[list[str], list[str]]:
    """The gaps and the overlaps left when ``boxes`` are laid over a tensor of ``shape``.

    Works on the grid spanned by every box edge, so its cost is the number of grid cells
    (a few thousand for per-layer × TP chunking). Returns at most ``limit`` entries each,
    as :func:`format_box` strings.
    """
    if not shape:
        n = len(boxes)
        return (["[]"] if n == 0 else []), (["[]"] if n > 1 else [])
    edges: list[list[int]] = []
    for d, extent in enumerate(shape):
        cuts = {0, extent}
        for off, size in boxes:
            cuts.add(off[d])
            cuts.add(off[d] + size[d])
        edges.append(sorted(cuts))
    ncells = 1
    for e in edges:
        ncells *= len(e) - 1
    if ncells > _MAX_GRID_CELLS:  # pathological chunking: fall back to counting volume
        total = sum(_volume(size) for _, size in boxes)
        want = _volume(shape)
        return ([f"{want - total} elements"] if total < want else []), (
            [f"{total - want} elements"] if total > want else [])
    grid = torch.zeros([len(e) - 1 for e in edges], dtype=torch.int32)
    for off, size in boxes:
        if any(s == 0 for s in size):
            continue
        idx = tuple(slice(bisect.bisect_left(e, o), bisect.bisect_left(e, o + s))
                    for e, o, s in zip(edges, off, size))
        grid[idx] += 1

    def cells(mask: torch.Tensor) -> list[str]:
        # Greedily merge marked grid cells into boxes, growing the last axis first.
        mask = mask.clone()
        out: list[str] = []
        while len(out) < limit:
            nz = mask.nonzero()
            if not len(nz):
                return out
            start = nz[0].tolist()
            end = [c + 1 for c in start]
            for d in reversed(range(mask.dim())):
                while end[d] < mask.shape[d] and bool(mask[tuple(
                        slice(end[i], end[i] + 1) if i == d else slice(start[i], end[i])
                        for i in range(mask.dim()))].all()):
                    end[d] += 1
            mask[tuple(slice(a, b) for a, b in zip(start, end))] = False
            offs = [edges[d][a] for d, a in enumerate(start)]
            out.append(format_box(offs, [edges[d][b] - o for d, (b, o) in enumerate(zip(end, offs))]))
        if bool(mask.any()):
            out.append("…")
        return out

    return cells(grid == 0), cells(grid > 1)


def check_tiling(key: str, shape: tuple[int, ...], boxes: Sequence[Box],
                 error: type[NemoConvertError]) -> None:
    """Raise ``error`` unless ``boxes`` cover ``shape`` exactly once, naming the gaps."""
    for off, size in boxes:
        if len(off) != len(shape) or any(o < 0 or o + s > e for o, s, e in zip(off, size, shape)):
            raise error(f"{key}: chunk {format_box(off, size)} lies outside the global shape {list(shape)}")
    gaps, overlaps = tiling_problems(shape, boxes)
    parts = []
    if gaps:
        parts.append("missing " + ", ".join(gaps))
    if overlaps:
        parts.append("written more than once " + ", ".join(overlaps))
    if parts:
        raise error(f"{key}: the chunks do not tile the global shape {list(shape)}: " + "; ".join(parts))


def merge_records(records_list: Sequence[DistRecords], error: type[NemoConvertError]) -> DistRecords:
    """One :class:`DistRecords` from several writers' records; checks they agree."""
    merged = DistRecords()
    seen_objects: set[str] = set()
    for records in records_list:
        for key, decl in records.tensors.items():
            prev = merged.tensors.setdefault(key, decl)
            if prev != decl:
                raise error(f"{key}: declared as {list(prev[0])} {prev[1]} and as {list(decl[0])} {decl[1]}")
        merged.chunks.extend(records.chunks)
        for obj in records.objects:
            if obj.key in seen_objects:
                raise error(f"object {obj.key} was written more than once")
            seen_objects.add(obj.key)
            merged.objects.append(obj)
    clash = seen_objects & set(merged.tensors)
    if clash:
        raise error(f"keys written both as tensor and object: {sorted(clash)}")
    return merged


def build_metadata(records: DistRecords, error: type[NemoConvertError]) -> Any:
    """torch's ``Metadata`` for merged records, after checking every tensor is tiled exactly."""
    by_key: dict[str, list[ChunkRecord]] = {k: [] for k in records.tensors}
    for chunk in records.chunks:
        if chunk.key not in by_key:
            raise error(f"chunk of undeclared tensor {chunk.key}")
        by_key[chunk.key].append(chunk)
    state_dict_md: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for key, (shape, dtype) in records.tensors.items():
        chunks = sorted(by_key[key], key=lambda c: c.offsets)
        check_tiling(key, shape, [(c.offsets, c.sizes) for c in chunks], error)
        state_dict_md[key] = _dcp_md.TensorStorageMetadata(
            properties=_dcp_md.TensorProperties(dtype=dtype),
            size=torch.Size(shape),
            chunks=[_dcp_md.ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes))
                    for c in chunks],
        )
        for i, c in enumerate(chunks):
            index = _dcp_md.MetadataIndex(key, c.offsets, i)
            storage[index] = _dcp_fs._StorageInfo(c.relative_path, c.offset, c.length)
    for obj in records.objects:
        state_dict_md[obj.key] = _dcp_md.BytesStorageMetadata()
        storage[_dcp_md.MetadataIndex(obj.key)] = _dcp_fs._StorageInfo(obj.relative_path, obj.offset, obj.length)
    # storage_meta stays None: older torch has no StorageMeta class to unpickle, and
    # torch's reader fills one in when it is missing.
    return _dcp_md.Metadata(
        state_dict_metadata=state_dict_md,
        planner_data={k: (k,) for k in state_dict_md},
        storage_data=storage,
        storage_meta=None,
        version=DCP_VERSION,
    )


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
    if not isinstance(md, _dcp_md.Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise InputError(f"{where}: .metadata is not a torch distributed-checkpoint Metadata")
    storage = getattr(md, "storage_data", None)
    if not isinstance(storage, dict):
        raise InputError(f"{where}: .metadata has no storage records")
    for index, info in storage.items():
        if not isinstance(index, _dcp_md.MetadataIndex) or not isinstance(info, _dcp_fs._StorageInfo):
            raise InputError(f"{where}: .metadata has a malformed storage record {index!r}")
    for key, item in md.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(
                item, (_dcp_md.TensorStorageMetadata, _dcp_md.BytesStorageMetadata)):
            raise InputError(f"{where}: .metadata has a malformed entry {key!r}")
    return md


_LAZY = {
    "DistCheckpointWriter": "nemo_convert.formats.distckpt_write",
    "write_dist_metadata": "nemo_convert.formats.distckpt_write",
    "DistCheckpointSource": "nemo_convert.formats.distckpt_read",
}


def __getattr__(name: str) -> Any:
    """Re-export the writer and reader without an import cycle (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
