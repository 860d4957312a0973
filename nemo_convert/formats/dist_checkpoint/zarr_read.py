"""A lazy :class:`~nemo_convert.tensors.base.TensorSource` over a ``zarr`` dist checkpoint.

The checkpoints NeMo saved until August 2024 (its default ``dist_ckpt_format`` until NeMo PR
10291) and NVIDIA published — Nemotron-3/4, Minitron, Mistral-NeMo, … — keep their weights in
Megatron-Core's zarr backend. :mod:`.zarr_meta` says what its files are and checks them;
this module reads them: each chunk is the raw C-order bytes of the chunk shape
(``compressor: null``), so a chunk is a view on a memory map of its file — or of the
``.nemo`` tar it lies in, read in place — and nothing is decoded, copied or held whole.

:class:`ZarrCheckpointSource` is a :class:`~.distckpt_read.DistCheckpointSource` whose
chunks come from zarr arrays instead of ``.metadata``: the same names, the same per-layer
views of stacked ``[L, …]`` keys (a layer reads only its own chunks), experts and gated
halves, the same lazy row pieces for writers that copy file ranges. No zarr, tensorstore or
numpy is needed: bf16 is read from its raw bytes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import InputError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource, _Chunk
from nemo_convert.formats.dist_checkpoint.zarr_meta import METADATA_JSON, ZarrArray, grid_indices, index_zarr
from nemo_convert.formats.io.tar_archive import DirectoryContainer
from nemo_convert.tensors.base import ByteRegion, FileMap, torch_dtype

if TYPE_CHECKING:
    import torch

#: At most this many chunk files mapped at once. An unpacked folder has one file per chunk
#: (Nemotron-4-340B: thousands), and a map holds its file open; the least recently opened
#: map is closed first. Tensors already handed out stay valid (they keep their pages); a
#: writer then copies them from memory instead of file to file.
MAX_OPEN_MAPS = 64

#: At most this many chunks per array when missing ones are filled from ``fill_value``
#: (Megatron-Core writes every chunk and no fill value; a huge grid is a ``.zarray`` lying).
MAX_FILLED_GRID = 1 << 20


class ZarrCheckpointSource(DistCheckpointSource):
    """The tensors of a ``zarr`` dist checkpoint, read lazily.

    ``open_region(name)`` gives the :class:`ByteRegion` of member ``name`` of the checkpoint
    folder; ``names`` lists every member (``/``-separated, relative, already checked for
    ``..``, absolute paths and escaping links, as :class:`~nemo_convert.formats.io.
    tar_archive.Container` does). The keyword arguments are
    :class:`~.distckpt_read.DistCheckpointSource`'s. ``ignored`` lists members that are
    neither arrays, objects, ``metadata.json`` nor ``common.pt``.
    """

    BACKEND = "zarr"
    max_open_maps = MAX_OPEN_MAPS

    def __init__(self, open_region: Callable[[str], ByteRegion], names: Iterable[str], **kwargs: Any) -> None:
        self._names = list(names)
        self._arrays: dict[str, ZarrArray] = {}
        self.ignored: list[str] = []
        super().__init__(open_region, **kwargs)

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str], **kwargs: Any) -> ZarrCheckpointSource:
        """A source over an unpacked checkpoint folder (links leaving it are refused)."""
        container = DirectoryContainer(os.fspath(path))
        kwargs.setdefault("name", os.fspath(path))
        return cls(container.region, container.names(), **kwargs)

    # ------------------------------------------------------------------ set-up

    def _check_sizes(self) -> None:
        """Nothing more to check: :func:`index_zarr` compared every chunk file's size with its
        ``.zarray`` (a chunk left out reads as the fill value)."""

    def _index_storage(self) -> None:
        index = index_zarr(self._names, lambda n: self._region(n).read(), lambda n: self._region(n).length,
                           self._where)
        for key, arr in index.arrays.items():
            chunks = []
            if len(arr.files) == math.prod(arr.grid):
                for grid_index, name in arr.files.items():
                    chunks.append(_Chunk(*arr.box(grid_index), name, 0, arr.chunk_bytes))
            else:  # some chunks are fill_value (index_zarr refused this without one)
                if math.prod(arr.grid) > MAX_FILLED_GRID:
                    raise InputError(f"{self._where}/{key}: {math.prod(arr.grid)} chunks, {len(arr.files)} on disk: "
                                     ".zarray's shape cannot be right")
                for grid_index in grid_indices(arr.grid):
                    name = arr.files.get(grid_index, "")
                    chunks.append(_Chunk(*arr.box(grid_index), name, 0, arr.chunk_bytes if name else 0))
            self._raw[key] = (arr.shape, arr.dtype, chunks)  # dtype by name
            self._arrays[key] = arr
        for key, name in index.objects.items():
            self._objects[key] = _Chunk((), (), name, 0, self._region(name).length)
        self.ignored = index.ignored

    # ------------------------------------------------------------------ reading

    def _chunk_rows(self, raw: str, c: _Chunk, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` (dim 0) of chunk ``c``, clipped to the array at its edges: a view
        on the mapped file, or just those rows read."""
        import torch

        arr = self._arrays[raw]
        dtype = torch_dtype(self._raw[raw][1])
        if not c.path:
            t = torch.full(c.sizes, arr.fill_value, dtype=dtype)  # type: ignore[arg-type]
            return t.narrow(0, lo, hi - lo) if t.dim() else t
        region = self._item_region(raw, c)
        stored = arr.chunks
        if not stored:
            return self._bytes(region, 0, arr.itemsize, (), dtype)
        row = math.prod(stored[1:]) * arr.itemsize
        if self._mmap and region.offset % arr.itemsize == 0:
            t = self._map(region.path).tensor(region.offset + lo * row, (hi - lo,) + stored[1:], dtype)
        else:
            t = self._bytes(region, lo * row, (hi - lo) * row, (hi - lo,) + stored[1:], dtype)
        for d in range(1, len(stored)):
            if c.sizes[d] != stored[d]:
                t = t.narrow(d, 0, c.sizes[d])  # the padding of an edge chunk
        return t

    def _map(self, path: str) -> FileMap:
        fmap = self._maps.pop(path, None)
        if fmap is None:
            while len(self._maps) >= self.max_open_maps:
                self._maps.pop(next(iter(self._maps))).close()
            fmap = FileMap(path)
        self._maps[path] = fmap  # most recently used last
        return fmap

    @staticmethod
    def _bytes(region: ByteRegion, start: int, size: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        import torch

        data = bytearray(region.read(start, size))
        flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        return flat.view(shape)


def sharded_backend(open_region: Callable[[str], ByteRegion]) -> Any:
    """``metadata.json``'s ``sharded_backend``, or None when it cannot be read (the reader
    then says why)."""
    try:
        config = json.loads(open_region(METADATA_JSON).read().decode("utf-8"))
    except (FileNotFoundError, KeyError, UnicodeDecodeError, json.JSONDecodeError, InputError):
        return None
    return config.get("sharded_backend") if isinstance(config, dict) else None


def open_dist_checkpoint(open_region: Callable[[str], ByteRegion], names: Callable[[], Iterable[str]],
                         **kwargs: Any) -> DistCheckpointSource:
    """The reader of a dist checkpoint for the backend its ``metadata.json`` names: zarr
    (which needs the member ``names``) or ``torch_dist`` (which any other answer reaches, to
    be refused there with the reason)."""
    if sharded_backend(open_region) == "zarr":
        return ZarrCheckpointSource(open_region, names(), **kwargs)
    return DistCheckpointSource(open_region, **kwargs)
