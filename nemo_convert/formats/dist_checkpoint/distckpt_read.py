"""A lazy :class:`~nemo_convert.tensors.base.TensorSource` over a ``torch_dist`` checkpoint.

Works on any member accessor (a folder, or the members of an uncompressed ``.nemo`` tar
read in place). Stacked keys (``…decoder.layers.<module>…`` with a leading ``[L]`` axis)
are presented per layer (``…decoder.layers.<i>.<module>…``) and each layer reads only the
chunks that overlap it; an expert axis (``…mlp.experts.experts.<module>…``, ``[L, E, …]`` or
one layer's ``[E, …]``) is presented per expert (``…mlp.experts.local_experts.<e>.<module>…``,
Megatron's module names). Megatron ≥ 0.15's per-layer layout passes through, with its gated
``weight_w``/``weight_v`` halves presented as one ``weight`` (``cat([w, v], 0)``).

A chunk's bytes are the ``torch.save`` of one tensor, read by
:mod:`~nemo_convert.formats.dist_checkpoint.distckpt_chunk`: its small headers parsed, then its storage
memory-mapped in place when aligned, or just the needed rows read otherwise; anything
unusual falls back to a plain ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, cast

from nemo_convert.errors import InputError
from nemo_convert.formats.dist_checkpoint.distckpt import DCP_METADATA, METADATA_JSON
from nemo_convert.formats.dist_checkpoint.distckpt_chunk import ChunkLayout, layout_tensor, load_chunk, read_layout
from nemo_convert.formats.dist_checkpoint.distckpt_meta import (
    BytesStorageMetadata,
    Metadata,
    load_metadata,
)
from nemo_convert.tensors.base import ByteRegion, FileMap, TensorInfo, torch_dtype
from nemo_convert.tensors.pieces import Lazy, rows

if TYPE_CHECKING:
    import torch

_STACKED = re.compile(r"(^|\.)layers\.(?!\d+(\.|$))")
_EXPERTS = re.compile(r"(^|\.)experts\.experts\.(?!\d+(\.|$))")  # Megatron's [E, …] expert key


@dataclass(frozen=True, slots=True)
class _Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    path: str  # relative data file name
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class _Part:
    raw: str
    index: tuple[int, ...] = ()  # fixed indices on the leading stacked axes; (): the whole raw tensor


@dataclass(frozen=True, slots=True)
class _View:
    parts: tuple[_Part, ...]
    shape: tuple[int, ...]
    dtype: str  # torch's name


class DistCheckpointSource:
    """The tensors of a ``torch_dist`` checkpoint, read lazily.

    ``open_region(name)`` returns the :class:`ByteRegion` of member ``name`` of the
    checkpoint folder (``metadata.json``, ``.metadata``, ``__0_0.distcp``, …) and raises
    ``FileNotFoundError`` or ``KeyError`` when there is none. ``strip_prefix`` (e.g.
    ``"model."`` or ``"module."``) is removed from names that start with it. With
    ``unstack=False`` stacked tensors keep their ``[L, …]`` shape (and load whole).

    Another backend's reader (:class:`~.zarr_read.ZarrCheckpointSource`) subclasses it: it
    sets :attr:`BACKEND` and overrides :meth:`_index_storage` and :meth:`_chunk_rows`; the
    views (unstacked layers, experts, gated halves) and the assembly of chunks are this class's.
    """

    BACKEND = "torch_dist"

    def __init__(self, open_region: Callable[[str], ByteRegion], *, strip_prefix: str | None = None,
                 unstack: bool = True, name: str = "dist checkpoint", mmap: bool = True) -> None:
        self._open_region = open_region
        self._where = name
        self._mmap = mmap
        self._regions: dict[str, ByteRegion] = {}
        self._maps: dict[str, FileMap] = {}
        # Caches of the chunks read lately (least recently used dropped first): every chunk
        # and key of a checkpoint cached to the end was a tensor-count cost (~0.2 KiB a chunk).
        self._layouts: OrderedDict[_Chunk, ChunkLayout | None] = OrderedDict()
        self._by_start: OrderedDict[str, tuple[list[int], list[tuple[int, _Chunk]], int]] = OrderedDict()
        self.config = self._read_config()
        self._raw: dict[str, tuple[tuple[int, ...], str, list[_Chunk]]] = {}  # dtype by name
        self._objects: dict[str, _Chunk] = {}
        self._metadata: Metadata | None = None
        self._index_storage()
        self._check_sizes()
        self._views = self._build_views(strip_prefix, unstack)
        self.object_keys: list[str] = list(self._objects)
        self.extra_state_keys: list[str] = [k for k in self._objects if "_extra_state" in k]

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str], **kwargs: Any) -> DistCheckpointSource:
        """A source over an unpacked checkpoint folder."""
        root = os.fspath(path)

        def open_region(name: str) -> ByteRegion:
            full = os.path.join(root, name)
            return ByteRegion(full, 0, os.path.getsize(full))

        kwargs.setdefault("name", root)
        return cls(open_region, **kwargs)

    # ------------------------------------------------------------------ TensorSource

    def keys(self) -> list[str]:
        return list(self._views)

    def info(self, key: str) -> TensorInfo:
        view = self._views[key]
        return TensorInfo(key, view.shape, view.dtype)

    def group(self, key: str) -> str:
        part = self._views[key].parts[0]
        chunks = self._overlapping(part)
        return chunks[0].path if chunks else self._where

    def load(self, key: str) -> torch.Tensor:
        import torch
        view = self._views[key]
        tensors = [self._load_part(p) for p in view.parts]
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors, 0)

    def load_lazy(self, key: str) -> Lazy:
        """:meth:`load`, deferred where the tensor's chunks split only its rows (dim 0): the
        :class:`~nemo_convert.tensors.pieces.Pieces` of the mapped chunk views, so that a
        writer copies them file to file (Megatron's gate/up halves of ``linear_fc1``, its
        vocabulary-parallel rows). Any other chunking is assembled as :meth:`load` does."""
        parts = [self._lazy_part(p) for p in self._views[key].parts]
        return parts[0] if len(parts) == 1 else rows(parts)

    def close(self) -> None:
        for fmap in self._maps.values():
            fmap.close()
        self._maps.clear()

    # ------------------------------------------------------------------ objects

    def raw_keys(self) -> list[str]:
        """The checkpoint's own tensor keys (stacked, with prefix)."""
        return list(self._raw)

    def load_object_bytes(self, key: str) -> bytes:
        """The raw ``torch.save`` bytes of BYTE_IO item ``key``."""
        chunk = self._objects[key]
        return self._item_region(key, chunk).read()

    def load_object(self, key: str) -> Any:
        """BYTE_IO item ``key`` unpickled with ``torch.load(weights_only=True)``."""
        import torch
        try:
            return torch.load(io.BytesIO(self.load_object_bytes(key)), map_location="cpu", weights_only=True)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{self._where}: cannot read object {key} ({type(exc).__name__}: {exc})") from exc

    # ------------------------------------------------------------------ set-up

    def _member(self, name: str, required: bool) -> ByteRegion | None:
        try:
            return self._open_region(name)
        except (FileNotFoundError, KeyError):
            if not required:
                return None
            raise InputError(f"{self._where}: dist checkpoint has no {name}") from None

    def _read_config(self) -> dict[str, Any]:
        region = self._member(METADATA_JSON, required=False)
        if region is None:
            raise InputError(f"{self._where} is not a distributed checkpoint (no metadata.json)")
        try:
            config = json.loads(region.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{self._where}: metadata.json is not valid JSON ({exc})") from exc
        backend = config.get("sharded_backend") if isinstance(config, dict) else None
        if backend != self.BACKEND:
            raise InputError(self._wrong_backend(backend))
        return config

    def _wrong_backend(self, backend: Any) -> str:
        if backend == "zarr":  # zarr_read.ZarrCheckpointSource reads it, where a .nemo opens it
            return (f"{self._where} uses the zarr backend, which nemo-convert reads inside a .nemo (its "
                    "model_weights/) only; pack this folder as a .nemo's model_weights/, or save it as torch_dist")
        return f"{self._where}: unsupported sharded_backend {backend!r} (only torch_dist and zarr are supported)"

    def _index_storage(self) -> None:
        """Fill ``_raw`` (every tensor's global shape, dtype and chunks) and ``_objects``."""
        # Not kept: the unpickled graph is ~10 objects per chunk (50-60 MiB for DeepSeek-V3's
        # 92k), and once indexed the reader needs only ``_raw`` and ``_objects``
        # (:attr:`metadata` reads it again for the callers that ask).
        with self._region(DCP_METADATA).open() as f:  # read a frame at a time, not whole (~0.2 KiB a chunk)
            md = load_metadata(cast(IO[bytes], f), self._where)
        # Looked up by (fqn, offset), what a MetadataIndex is equal and hashed on, without
        # building one per chunk (a tensor-count cost: DeepSeek-V3 has ~90k chunks). The
        # graph is taken apart as it is indexed (each record freed once read), so that it
        # and the index are never both whole: the set-up's peak was their sum.
        records, entries, storage = md.storage_data, md.state_dict_metadata, {}
        del md
        while records:
            index, info = records.popitem()
            storage[index._key()] = info
        for key in list(entries):
            item = entries.pop(key)
            if isinstance(item, BytesStorageMetadata):
                info = storage.pop((key, None), None)
                if info is None:
                    raise InputError(f"{self._where}: .metadata has no storage record for object {key}")
                self._objects[key] = _Chunk((), (), self._check_path(info.relative_path), info.offset, info.length)
                continue
            shape = tuple(int(s) for s in item.size)
            chunks = []
            seen: dict[tuple[int, ...], Any] = {}  # this tensor's records taken (two chunks may name one)
            for c in item.chunks:
                offs, sizes = tuple(int(x) for x in c.offsets), tuple(int(x) for x in c.sizes)
                info = storage.pop((key, offs), None) or seen.get(offs)
                seen[offs] = info
                if info is None:
                    raise InputError(f"{self._where}: .metadata has no storage record for {key} chunk {list(offs)}")
                if len(offs) != len(shape) or any(o < 0 or o + s > g for o, s, g in zip(offs, sizes, shape)):
                    raise InputError(f"{self._where}: {key} has a chunk outside its shape {list(shape)}")
                chunks.append(_Chunk(offs, sizes, self._check_path(info.relative_path), info.offset, info.length))
            self._raw[key] = (shape, item.properties.dtype_name, chunks)

    @property
    def metadata(self) -> Metadata:
        """The checkpoint's unpickled ``.metadata`` (read and checked again on first use,
        then kept): the conversions themselves never ask for it, so they do not hold it."""
        if self._metadata is None:
            self._metadata = load_metadata(self._region(DCP_METADATA).read(), self._where)
        return self._metadata

    def _check_sizes(self) -> None:
        """Every item's bytes lie inside its data file, as ``.metadata`` records them: a
        truncated ``.distcp`` is named when the checkpoint is opened (``inspect`` too, which
        reads no tensor), not when a tensor is read. One size per data file; nothing read."""
        for key, (_, _, chunks) in self._raw.items():
            for c in chunks:
                self._item_region(key, c)
        for key, c in self._objects.items():
            self._item_region(key, c)

    def _check_path(self, rel: str) -> str:
        if not isinstance(rel, str) or rel in ("", ".", "..") or "/" in rel or "\\" in rel:
            raise InputError(f"{self._where}: .metadata names a bad data file {rel!r}")
        return rel

    def _build_views(self, strip_prefix: str | None, unstack: bool) -> dict[str, _View]:
        views: dict[str, _View] = {}

        def put(name: str, view: _View) -> None:
            if name in views:
                raise InputError(f"{self._where}: two tensors are both presented as {name}")
            views[name] = view

        # An entry's shape and index tuples are shared by the views of every stacked key
        # (each layer's and expert's view): one object each, not one per view.
        one: dict[tuple[int, ...], tuple[int, ...]] = {}

        def tup(t: tuple[int, ...]) -> tuple[int, ...]:
            return one.setdefault(t, t)

        for raw, (shape, dtype, _) in self._raw.items():
            name = raw[len(strip_prefix):] if strip_prefix and raw.startswith(strip_prefix) else raw
            m = _STACKED.search(name)
            layers = [(f"{name[:m.end()]}{i}.{name[m.end():]}", (i,)) for i in range(shape[0])] if (
                unstack and m is not None and shape) else [(name, ())]
            for lname, index in layers:
                x = _EXPERTS.search(lname)
                k = len(index)
                if unstack and x is not None and len(shape) > k:
                    for e in range(shape[k]):
                        put(f"{lname[:x.start()]}{x[1]}experts.local_experts.{e}.{lname[x.end():]}",
                            _View((_Part(raw, tup(index + (e,))),), tup(shape[k + 1:]), dtype))
                else:
                    put(lname, _View((_Part(raw, tup(index)),), tup(shape[k:]), dtype))
        return self._fuse_gated(views)

    def _fuse_gated(self, views: dict[str, _View]) -> dict[str, _View]:
        out: dict[str, _View] = {}
        for name, view in views.items():
            base = name[:-2]
            if name.endswith(("weight_v", "bias_v")) and base + "_w" in views and base not in views:
                continue  # folded into the _w entry
            if name.endswith(("weight_w", "bias_w")) and base + "_v" in views and base not in views:
                other = views[base + "_v"]
                if other.dtype != view.dtype or other.shape[1:] != view.shape[1:] or not view.shape:
                    raise InputError(f"{self._where}: {name} and {base}_v do not fit together")
                out[base] = _View(view.parts + other.parts, (view.shape[0] + other.shape[0],) + view.shape[1:],
                                  view.dtype)
            else:
                out[name] = view
        return out

    # ------------------------------------------------------------------ reading

    def _box(self, part: _Part) -> tuple[tuple[int, ...], tuple[int, ...]]:
        shape = self._raw[part.raw][0]
        k = len(part.index)
        return part.index + (0,) * (len(shape) - k), (1,) * k + shape[k:]

    def _overlapping(self, part: _Part) -> list[_Chunk]:
        """The chunks of ``part.raw`` that overlap the part's box, in ``.metadata`` order.
        Found through the chunks sorted by their dim-0 offset (:meth:`_chunks_by_start`):
        a key stacking many layers or experts has a chunk per entry, and every entry asks."""
        starts, sizes = self._box(part)
        chunks = self._raw[part.raw][2]
        if not starts:
            return list(chunks)
        keys, ordered, longest = self._chunks_by_start(part.raw)
        # a chunk overlaps on dim 0 iff start - longest < its offset < start + size
        lo = bisect.bisect_right(keys, starts[0] - longest)
        hi = bisect.bisect_left(keys, starts[0] + sizes[0])
        found = sorted((i, c) for i, c in ordered[lo:hi]
                       if all(co < s + n and s < co + cn for co, cn, s, n in zip(c.offsets, c.sizes, starts, sizes)))
        return [c for _, c in found]

    def _chunks_by_start(self, raw: str) -> tuple[list[int], list[tuple[int, _Chunk]], int]:
        """``raw``'s chunks (with their ``.metadata`` index) sorted by dim-0 offset, those
        offsets, and the longest dim-0 size (cached)."""
        got = self._by_start.get(raw)
        if got is None:
            chunks = self._raw[raw][2]
            ordered = sorted(enumerate(chunks), key=lambda ic: ic[1].offsets[0])
            got = ([c.offsets[0] for _, c in ordered], ordered, max((c.sizes[0] for _, c in ordered), default=0))
            if len(chunks) > _SORT_AGAIN:  # a few chunks are sorted again when asked
                self._by_start[raw] = got
                if len(self._by_start) > _KEYS_KEPT:
                    self._by_start.popitem(last=False)
        else:
            self._by_start.move_to_end(raw)
        return got

    def _lazy_part(self, part: _Part) -> Lazy:
        shape = self._raw[part.raw][0]
        starts, sizes = self._box(part)
        k = len(part.index)
        rd = k  # the raw dim that is the part's rows
        chunks = self._overlapping(part)
        if len(chunks) < 2 or len(shape) <= rd or not all(
                c.offsets[d] == 0 and c.sizes[d] == shape[d] for c in chunks for d in range(rd + 1, len(shape))):
            return self._load_part(part)
        chunks.sort(key=lambda c: c.offsets[rd])
        at = 0
        for c in chunks:
            if c.offsets[rd] != at:
                return self._load_part(part)  # a gap or an overlap: load() reports it
            at += c.sizes[rd]
        if at != shape[rd]:
            return self._load_part(part)
        pieces = []
        for c in chunks:
            lo = starts[0] - c.offsets[0] if k else 0
            t = self._chunk_rows(part.raw, c, lo, lo + sizes[0] if k else c.sizes[0])
            for d in range(1, k):
                t = t.narrow(d, starts[d] - c.offsets[d], 1)
            pieces.append(t[(0,) * k] if k else t)
        return rows(pieces)

    def _load_part(self, part: _Part) -> torch.Tensor:
        import torch
        shape, dtype, _ = self._raw[part.raw]
        starts, sizes = self._box(part)
        chunks = self._overlapping(part)
        pieces: list[tuple[_Chunk, torch.Tensor]] = []
        for c in chunks:
            lo = max(starts[0], c.offsets[0]) - c.offsets[0] if shape else 0
            hi = min(starts[0] + sizes[0], c.offsets[0] + c.sizes[0]) - c.offsets[0] if shape else 0
            pieces.append((c, self._chunk_rows(part.raw, c, lo, hi)))
        if len(pieces) == 1 and pieces[0][0].offsets == starts and pieces[0][0].sizes == sizes:
            out = pieces[0][1]
        elif len(pieces) == 1 and shape and _covers(pieces[0][0], starts, sizes):
            c, t = pieces[0]
            for d in range(1, len(shape)):
                t = t.narrow(d, starts[d] - c.offsets[d], sizes[d])
            out = t
        else:
            out = torch.empty(sizes, dtype=torch_dtype(dtype))
            covered = 0
            for c, t in pieces:
                src, dst = t, out
                for d in range(len(shape)):
                    a = max(starts[d], c.offsets[d])
                    b = min(starts[d] + sizes[d], c.offsets[d] + c.sizes[d])
                    if d > 0:
                        src = src.narrow(d, a - c.offsets[d], b - a)
                    dst = dst.narrow(d, a - starts[d], b - a)
                dst.copy_(src)
                covered += dst.numel()
            if covered != out.numel():
                raise InputError(f"{self._where}: the chunks of {part.raw} do not cover "
                                 f"{'entry ' + str(list(part.index)) if part.index else 'it'} exactly")
        return out[(0,) * len(part.index)] if part.index else out

    def _region(self, rel: str) -> ByteRegion:
        region = self._regions.get(rel)
        if region is None:
            region = self._member(rel, required=True)
            assert region is not None
            self._regions[rel] = region
        return region

    def _item_region(self, what: str, c: _Chunk) -> ByteRegion:
        region = self._region(c.path)
        if c.offset < 0 or c.length < 0 or c.offset + c.length > region.length:
            raise InputError(f"{self._where}: data file {c.path} is truncated: {what} needs bytes "
                             f"[{c.offset}, {c.offset + c.length}) but it has {region.length}")
        return ByteRegion(region.path, region.offset + c.offset, c.length)

    def _chunk_rows(self, raw: str, c: _Chunk, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` (dim 0) of chunk ``c``: a mapped view, a partial read, or a load."""
        region = self._item_region(raw, c)
        dtype = torch_dtype(self._raw[raw][1])
        layout = self._layout(raw, c, region) if self._mmap else None
        if layout is None:
            t = load_chunk(region, self._where, raw)
        else:
            if layout.dtype != dtype:
                raise InputError(f"{self._where}: a chunk of {raw} holds {layout.dtype}, .metadata says {dtype}")
            t, only_rows = layout_tensor(region, layout, lo, hi, self._maps)
            if only_rows:
                return t
        if tuple(t.shape) != c.sizes or t.dtype != dtype:
            raise InputError(f"{self._where}: a chunk of {raw} holds {list(t.shape)} {t.dtype}, "
                             f".metadata says {list(c.sizes)} {dtype}")
        return t.narrow(0, lo, hi - lo) if t.dim() else t

    def _layout(self, raw: str, c: _Chunk, region: ByteRegion) -> ChunkLayout | None:
        """The storage layout of a chunk (cached), or None to fall back to a plain load."""
        if c in self._layouts:
            self._layouts.move_to_end(c)
            return self._layouts[c]
        try:
            fmap = self._maps.get(region.path)
            if fmap is None:  # the chunk's storage is viewed on this map too (layout_tensor)
                fmap = self._maps[region.path] = FileMap(region.path)
            layout = self._layouts[c] = read_layout(region, fmap.view(region.offset, region.length))
        except OSError as exc:
            raise InputError(f"{self._where}: cannot read a chunk of {raw} ({exc})") from exc
        if len(self._layouts) > _CHUNKS_KEPT:
            self._layouts.popitem(last=False)
        return layout


#: The chunk layouts kept (a chunk holding several tensors' rows is read once for each,
#: one after another in plan order), the keys whose sorted chunks are kept, and the
#: chunk count up to which a key's chunks are sorted again rather than kept.
_CHUNKS_KEPT = 1024
_KEYS_KEPT = 64
_SORT_AGAIN = 8


def _covers(c: _Chunk, starts: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    return all(co <= s and s + n <= co + cn for co, cn, s, n in zip(c.offsets, c.sizes, starts, sizes))
