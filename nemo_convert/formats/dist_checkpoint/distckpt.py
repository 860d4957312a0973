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
unpickler. The writer is :class:`.distckpt_write.DistCheckpointWriter`, the reader
:class:`.distckpt_read.DistCheckpointSource`; both import this module, never the reverse.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import NemoConvertError

if TYPE_CHECKING:
    import torch

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
# torch's CURRENT_DCP_VERSION (a test checks it); a constant, so that writing never
# imports torch.distributed.checkpoint.
DCP_VERSION: str = "1.0.0"

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """Where one chunk of a global tensor was written."""

    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    relative_path: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
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


def _tiles_along_one_dim(shape: tuple[int, ...], boxes: Sequence[Box]) -> bool:
    """True when ``boxes`` tile ``shape`` exactly, each spanning every dimension but one
    (the same one) in full, and their spans on that one follow each other from 0 to the
    end: the chunks of a stacked layer or expert axis, or of one TP split. False says
    nothing (the grid of :func:`tiling_problems` decides, and names the problems); this
    answers the common case without a grid, since every key of a checkpoint is checked."""
    if not boxes or any(e <= 0 for e in shape):
        return False
    dim = -1
    for off, size in boxes:
        for d, (o, s, e) in enumerate(zip(off, size, shape)):
            if o != 0 or s != e:
                if dim not in (-1, d):
                    return False
                dim = d
    dim = max(dim, 0)
    at = 0
    for o, s in sorted((off[dim], size[dim]) for off, size in boxes):
        if o != at or s <= 0:
            return False
        at += s
    return at == shape[dim]


def tiling_problems(shape: tuple[int, ...], boxes: Sequence[Box],
                    limit: int = 8) -> tuple[list[str], list[str]]:
    """The gaps and the overlaps left when ``boxes`` are laid over a tensor of ``shape``.

    Works on the grid spanned by every box edge, so its cost is the number of grid cells
    (a few thousand for per-layer × TP chunking). Returns at most ``limit`` entries each,
    as :func:`format_box` strings.
    """
    import torch
    if not shape:
        n = len(boxes)
        return (["[]"] if n == 0 else []), (["[]"] if n > 1 else [])
    if _tiles_along_one_dim(shape, boxes):
        return [], []
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


def metadata_entries(records: DistRecords, error: type[NemoConvertError]
                     ) -> tuple[list[tuple[str, tuple[int, ...], Any, Sequence[tuple[Any, ...]]]],
                                list[tuple[Any, ...]]]:
    """The tensors (with their sorted chunks) and objects of merged records, after checking
    that every tensor is tiled exactly by its chunks."""
    by_key: dict[str, list[ChunkRecord]] = {k: [] for k in records.tensors}
    for chunk in records.chunks:
        if chunk.key not in by_key:
            raise error(f"chunk of undeclared tensor {chunk.key}")
        by_key[chunk.key].append(chunk)
    tensors: list[tuple[str, tuple[int, ...], Any, Sequence[tuple[Any, ...]]]] = []
    for key, (shape, dtype) in records.tensors.items():
        chunks = by_key[key]
        chunks.sort(key=lambda c: c.offsets)
        check_tiling(key, shape, [(c.offsets, c.sizes) for c in chunks], error)
        tensors.append((key, tuple(shape), dtype, ChunkEntries(chunks)))
    objects = [(o.key, o.relative_path, o.offset, o.length) for o in records.objects]
    return tensors, objects


class ChunkEntries(Sequence[tuple[Any, ...]]):
    """A tensor's chunk records seen as ``(offsets, sizes, relative_path, offset, length)``
    tuples, each built when it is read: the ``.metadata`` writers read them a few times,
    and a tuple held per chunk was ~0.1 KiB per tensor at the metadata's peak."""

    __slots__ = ("_records",)

    def __init__(self, records: list[ChunkRecord]) -> None:
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [(c.offsets, c.sizes, c.relative_path, c.offset, c.length) for c in self._records[i]]
        c = self._records[i]
        return (c.offsets, c.sizes, c.relative_path, c.offset, c.length)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for c in self._records:
            yield (c.offsets, c.sizes, c.relative_path, c.offset, c.length)
