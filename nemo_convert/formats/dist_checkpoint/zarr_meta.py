"""What a ``zarr`` dist checkpoint holds, read from its names and ``.zarray`` files (no torch).

Megatron-Core's zarr strategy (``megatron/core/dist_checkpointing/strategies/zarr.py`` at
``core_v0.13.1``, the last release with it; the format is unchanged since the library's first
copy in 2023) writes, beside ``metadata.json`` (``"sharded_backend": "zarr"``) and
``common.pt``:

- one zarr v2 array per ShardedTensor key, in a folder named by the key (``store=
  checkpoint_dir / key``, L170-178): a ``.zarray`` JSON and one file per chunk;
- ``zarr.create(..., chunks=sharded_tensor.max_allowed_chunks(), compressor=None,
  fill_value=None, write_empty_chunks=True)`` (L170-178): the chunk grid is the sharding
  grid (global shape ÷ axis fragmentations, mapping.py L225-237), so a stacked ``[L, …]``
  key has one chunk per layer and rank; every chunk is written, uncompressed;
- bf16 as the dtype string ``"bfloat16"`` patched in place of numpy's ``"<V2"``
  (L185-188), the values being ml_dtypes' bfloat16 (``x.float().numpy().astype("bfloat16")``,
  L154-157: a lossless round trip) — the same two little-endian bytes as torch's bfloat16;
- ShardedObjects (Transformer-Engine ``_extra_state``) through the common strategy as
  ``<unique_key>.pt`` = ``<key>/shard_<offsets>_<shape>.pt`` (strategies/common.py L50-64).

zarr v2's own rules (its spec, and zarr 2.18 as checked when the fixtures were made): the
``.zarray`` fields ``zarr_format`` (2), ``shape``, ``chunks``, ``dtype`` (a numpy type
string), ``fill_value``, ``order``, ``compressor``, ``filters`` and an optional
``dimension_separator`` (``"."`` when absent); a chunk's file is named by its grid index
joined by the separator (``"0"`` for a 0-dim array), holds the *whole* chunk shape even at
the array's edges (the overhang is padding), in C order when uncompressed; a missing chunk
reads as ``fill_value``.

:func:`index_zarr` checks all of that against the file sizes before anything is read, and
refuses — one line, naming the member — whatever Megatron-Core does not write: a compressor
or filter, Fortran order, big-endian or unknown dtypes, a chunk file of the wrong size, a
missing chunk with no fill value, stray files in an array folder, chunk files without a
``.zarray``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nemo_convert.errors import InputError

ZARRAY = ".zarray"
ZATTRS = ".zattrs"
ZGROUP = ".zgroup"
METADATA_JSON = "metadata.json"
COMMON_PT = "common.pt"

#: zarr v2 dtype strings Megatron-Core can write (its numpy↔torch table, zarr.py L38-61) →
#: (torch dtype name, bytes per element). ``"bfloat16"`` is its patched spelling (L185-188).
DTYPES: dict[str, tuple[str, int]] = {
    "bfloat16": ("bfloat16", 2),
    "<f2": ("float16", 2), "<f4": ("float32", 4), "<f8": ("float64", 8),
    "|i1": ("int8", 1), "<i2": ("int16", 2), "<i4": ("int32", 4), "<i8": ("int64", 8),
    "|u1": ("uint8", 1), "|b1": ("bool", 1),
    "<c8": ("complex64", 8), "<c16": ("complex128", 16),
}
_FILL_STRINGS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_INDEX = re.compile(r"0|[1-9][0-9]*")
_CHUNKISH = re.compile(r"[0-9]+([./][0-9]+)*")


@dataclass(frozen=True)
class ZarrArray:
    """One array of the checkpoint: its ``.zarray`` facts and its chunk files."""

    key: str  # the folder, relative to the checkpoint root: the ShardedTensor key
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str  # a torch dtype name (``DTYPES``)
    itemsize: int
    fill_value: bool | int | float | None  # None: every chunk must be present
    files: dict[tuple[int, ...], str]  # grid index -> member name (relative to the root)

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * self.itemsize

    def box(self, index: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(offsets, sizes)`` of chunk ``index`` in the array (sizes clipped at the edges)."""
        offsets = tuple(i * c for i, c in zip(index, self.chunks))
        return offsets, tuple(min(c, s - o) for c, s, o in zip(self.chunks, self.shape, offsets))


@dataclass(frozen=True)
class ZarrIndex:
    """Everything in a zarr checkpoint folder, by kind."""

    arrays: dict[str, ZarrArray]
    objects: dict[str, str]  # ShardedObject unique key (``<key>/shard_…``) -> member name of its .pt
    ignored: list[str]  # members that are neither (nothing of the weights)


def parse_zarray(data: bytes, where: str) -> dict[str, Any]:
    """The fields of a ``.zarray``, checked: ``shape``, ``chunks``, ``dtype`` (torch name),
    ``itemsize``, ``fill_value``, ``separator``. ``where`` names the file in errors."""
    try:
        meta = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{where}: not a valid .zarray (not JSON: {exc})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{where}: not a valid .zarray (not a JSON object)")
    if meta.get("zarr_format") != 2:
        raise InputError(f"{where}: zarr_format {meta.get('zarr_format')!r}; only zarr v2 (what Megatron-Core "
                         "writes) is read")
    shape: Any = meta.get("shape")
    chunks: Any = meta.get("chunks")
    if not _ints(shape, 0) or not _ints(chunks, 1) or len(shape) != len(chunks):
        raise InputError(f"{where}: bad shape {shape!r} or chunks {chunks!r} (lists of non-negative and "
                         "positive integers of one length)")
    dtype = meta.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        hint = (" (big-endian)" if isinstance(dtype, str) and dtype.startswith(">") else
                " (a raw void type: bfloat16 saved without its patched name?)" if dtype in ("<V2", "|V2") else "")
        raise InputError(f"{where}: unsupported dtype {dtype!r}{hint}; Megatron-Core writes one of "
                         f"{', '.join(DTYPES)}")
    compressor = meta.get("compressor")
    if compressor is not None:
        cid = compressor.get("id") if isinstance(compressor, dict) else compressor
        raise InputError(f"{where}: compressor {cid!r} is not supported; Megatron-Core writes compressor null")
    if meta.get("filters") not in (None, []):
        raise InputError(f"{where}: filters {meta.get('filters')!r} are not supported; Megatron-Core writes none")
    if meta.get("order", "C") != "C":
        raise InputError(f"{where}: order {meta.get('order')!r} is not supported; Megatron-Core writes C order")
    sep = meta.get("dimension_separator", ".")
    if sep not in (".", "/"):
        raise InputError(f"{where}: bad dimension_separator {sep!r}")
    name, itemsize = DTYPES[dtype]
    return {"shape": tuple(shape), "chunks": tuple(chunks), "dtype": name, "itemsize": itemsize,
            "fill_value": _fill(meta.get("fill_value"), name, where), "separator": sep}


def _ints(value: Any, least: int) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                                           for v in value)


def _fill(value: Any, dtype: str, where: str) -> bool | int | float | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    if isinstance(value, bool) and dtype == "bool":
        return value
    if isinstance(value, str) and value in _FILL_STRINGS and dtype.startswith(("float", "bfloat")):
        return _FILL_STRINGS[value]
    raise InputError(f"{where}: unsupported fill_value {value!r} for dtype {dtype}")


def index_zarr(names: Iterable[str], read: Callable[[str], bytes], size: Callable[[str], int],
               where: str) -> ZarrIndex:
    """Classify the members of a zarr checkpoint folder (``/``-separated, relative to it,
    already checked for ``..`` and absolute paths by the container) and check every array
    against its files: ``read(name)`` gives a member's bytes (only ``.zarray`` files are
    read), ``size(name)`` its length. ``where`` names the folder in errors."""
    names = list(names)
    if ZARRAY in names:
        raise InputError(f"{where}: a .zarray at the checkpoint root (an array needs a key folder)")
    folders = sorted((n[: -len(ZARRAY) - 1] for n in names if n.endswith("/" + ZARRAY)), key=len)
    metas: dict[str, dict[str, Any]] = {}
    for folder in folders:
        outer = _owner(folder, metas)
        if outer is not None:
            raise InputError(f"{where}: array {folder} lies inside array {outer}")
        metas[folder] = parse_zarray(read(f"{folder}/{ZARRAY}"), f"{where}/{folder}/{ZARRAY}")
    files: dict[str, dict[tuple[int, ...], str]] = {f: {} for f in metas}
    objects: dict[str, str] = {}
    ignored: list[str] = []
    loose: dict[str, str] = {}  # folder -> a chunk-like file in it that no .zarray owns
    for name in names:
        owner = _owner(name, metas)
        if owner is not None:
            rest = name[len(owner) + 1:]
            if rest in (ZARRAY, ZATTRS):
                continue
            index = _chunk_index(rest, metas[owner])
            if index is None:
                raise InputError(f"{where}/{name}: not a chunk of array {owner} (.zarray shape "
                                 f"{list(metas[owner]['shape'])}, chunks {list(metas[owner]['chunks'])})")
            files[owner][index] = name
        elif name.endswith(".pt") and name != COMMON_PT:
            objects[name[:-3]] = name
        elif name in (METADATA_JSON, COMMON_PT, ZGROUP, ZATTRS):
            continue
        elif "/" in name and _CHUNKISH.fullmatch(name.rsplit("/", 1)[1]):
            loose.setdefault(name.rsplit("/", 1)[0], name)
        else:
            ignored.append(name)
    for folder, name in loose.items():
        raise InputError(f"{where}/{name}: a chunk file in {folder}/, which has no .zarray (the array's "
                         "metadata is missing)")
    arrays = {f: _check_array(f, metas[f], files[f], size, where) for f in metas}
    return ZarrIndex(arrays, objects, ignored)


def _owner(name: str, arrays: dict[str, Any]) -> str | None:
    """The array folder ``name`` lies in (the deepest one), if any."""
    parts = name.split("/")
    for i in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:i])
        if folder in arrays:
            return folder
    return None


def _chunk_index(rest: str, meta: dict[str, Any]) -> tuple[int, ...] | None:
    """The grid index a chunk file name spells, or None when it is not one of the grid's."""
    ndim = len(meta["shape"])
    if meta["separator"] == "." and "/" in rest:
        return None  # a sub-folder: not a chunk of a "."-separated array
    parts = rest.split(meta["separator"])
    if ndim == 0:
        return () if parts == ["0"] else None
    if len(parts) != ndim or not all(_INDEX.fullmatch(p) for p in parts):
        return None
    index = tuple(int(p) for p in parts)
    grid = tuple(-(-s // c) for s, c in zip(meta["shape"], meta["chunks"]))
    return index if all(i < g for i, g in zip(index, grid)) else None


def _check_array(folder: str, meta: dict[str, Any], files: dict[tuple[int, ...], str],
                 size: Callable[[str], int], where: str) -> ZarrArray:
    arr = ZarrArray(folder, meta["shape"], meta["chunks"], meta["dtype"], meta["itemsize"], meta["fill_value"],
                    dict(sorted(files.items())))
    want = arr.chunk_bytes
    for index, name in arr.files.items():
        got = size(name)
        if got != want:
            what = "truncated" if got < want else "too long"
            raise InputError(f"{where}/{name}: {got} bytes, but .zarray's chunks {list(arr.chunks)} of {arr.dtype} "
                             f"take {want} ({what}: a damaged chunk, or a .zarray that lies about shape or dtype)")
    total = math.prod(arr.grid)
    if len(arr.files) < total and arr.fill_value is None:
        missing = next(i for i in grid_indices(arr.grid) if i not in arr.files)
        sep = meta["separator"]
        label = sep.join(str(i) for i in missing) if missing else "0"
        raise InputError(f"{where}/{folder}: chunk {label} is missing ({len(arr.files)} of {total} present) and "
                         ".zarray has no fill_value")
    return arr


def grid_indices(grid: tuple[int, ...]) -> Iterable[tuple[int, ...]]:
    """Every index of a chunk grid, in C order."""
    if not grid:
        yield ()
        return
    for head in range(grid[0]):
        for tail in grid_indices(grid[1:]):
            yield (head,) + tail
