"""safetensors files read lazily through a memory map (one file, or sharded with an index).

We parse the header ourselves: it is 8 bytes of length and a JSON table, and owning the
parser lets us reject hostile headers (absurd sizes, overlapping or out-of-file offsets)
with a clear error, and hand out tensors that *view* the mapped file instead of copies.
"""

from __future__ import annotations

import array
import json
import os
import struct
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import DTYPE_SIZES, SAFETENSORS_DTYPE_NAMES, FileMap, TensorInfo

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 100 * 1024 * 1024
_COUNT_LIMIT = 2**62  # the largest size or offset accepted, plus one


class SafetensorsFile:
    """One ``.safetensors`` file as a :class:`~nemo_convert.tensors.base.TensorSource`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.metadata: dict[str, str] = {}
        # name -> position in the header; the infos and absolute data offsets by position
        # (a list and an array('q'), not a second dict with an int object per tensor)
        self._at: dict[str, int] = {}
        self._infos: list[TensorInfo] = []
        self._offsets = array.array("q")
        self._map: FileMap | None = None
        self._keys: list[str] | None = None
        # One tuple per distinct shape (every expert's tensors share a few), not per tensor.
        self._shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._parse()
        del self._shapes

    def _parse(self) -> None:
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise InputError(f"{self.path}: not a safetensors file (shorter than 8 bytes)")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER_BYTES or 8 + n > size:
                    raise InputError(f"{self.path}: corrupted safetensors header (claims {n} header bytes, "
                                     f"file has {size})")
                raw = f.read(n)
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise InputError(f"{self.path}: corrupted safetensors header ({exc.__class__.__name__})") from None
        if not isinstance(header, dict):
            raise InputError(f"{self.path}: corrupted safetensors header (not a JSON object)")
        data_start = 8 + n
        data_len = size - data_start
        spans: list[tuple[int, int, str]] = []
        for name, entry in header.items():
            if name == "__metadata__":
                if isinstance(entry, dict):
                    self.metadata = {str(k): str(v) for k, v in entry.items()}
                continue
            info, begin, end = self._entry(name, entry, data_len)
            self._at[name] = len(self._infos)  # (a JSON object's names are unique)
            self._infos.append(info)
            self._offsets.append(data_start + begin)
            spans.append((begin, end, name))
        spans.sort()
        prev_end, prev_name = 0, ""
        for begin, end, name in spans:
            if end == begin:
                continue  # an empty tensor occupies no bytes
            if begin < prev_end:
                raise InputError(f"{self.path}: corrupted safetensors header (tensors {prev_name!r} and "
                                 f"{name!r} overlap)")
            if end > prev_end:
                prev_end, prev_name = end, name

    def _entry(self, name: str, entry: Any, data_len: int) -> tuple[TensorInfo, int, int]:
        # Runs for every tensor of a checkpoint (92k in DeepSeek-V3): plain loops, no
        # generators, messages built only on failure. JSON gives exact ints, so
        # ``type(x) is int`` rejects bools too.
        if not isinstance(entry, dict):
            raise InputError(self._bad(name))
        raw_dtype = entry.get("dtype")
        dtype = SAFETENSORS_DTYPE_NAMES.get(raw_dtype) if isinstance(raw_dtype, str) else None
        shape = entry.get("shape")
        offs = entry.get("data_offsets")
        if dtype is None:
            raise InputError(f"{self._bad(name)}: unsupported dtype {entry.get('dtype')!r}")
        if not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2:
            raise InputError(self._bad(name))
        numel = 1
        for x in shape:
            if type(x) is not int or not 0 <= x < _COUNT_LIMIT:
                raise InputError(self._bad(name))
            numel *= x
        begin, end = offs
        if not (type(begin) is int and type(end) is int and 0 <= begin < _COUNT_LIMIT and 0 <= end < _COUNT_LIMIT):
            raise InputError(self._bad(name))
        if end < begin or end - begin != numel * DTYPE_SIZES[dtype]:
            raise InputError(f"{self._bad(name)}: {end - begin} bytes do not hold shape {shape} of {entry['dtype']}")
        if end > data_len:
            raise InputError(f"{self.path}: file is truncated ({name!r} ends at byte {end} of {data_len})")
        dims = tuple(shape)
        return TensorInfo(name, self._shapes.setdefault(dims, dims), dtype), begin, end

    def _bad(self, name: str) -> str:
        return f"{self.path}: corrupted safetensors header entry {name!r}"

    # -- TensorSource -------------------------------------------------------------------
    def keys(self) -> list[str]:
        if self._keys is None:  # asked several times per conversion, for every tensor
            self._keys = sorted(self._at, key=lambda k: self._offsets[self._at[k]])
        return list(self._keys)

    def info(self, key: str) -> TensorInfo:
        return self._infos[self._at[key]]

    def load(self, key: str) -> torch.Tensor:
        at = self._at[key]
        info = self._infos[at]
        if self._map is None:
            self._map = FileMap(self.path)
        return self._map.tensor(self._offsets[at], info.shape, info.dtype)

    def group(self, key: str) -> str:
        return self.path

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class ShardedSafetensors:
    """Several safetensors files named by a ``model.safetensors.index.json``."""

    def __init__(self, index_path: str) -> None:
        self.index_path = index_path
        folder = os.path.dirname(index_path)
        try:
            with open(index_path, encoding="utf-8") as f:
                index = json.load(f)
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            raise InputError(f"{index_path}: not a valid safetensors index (no weight_map)") from None
        files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, SafetensorsFile] = {}
        missing = sorted(f for f in set(weight_map.values()) if not os.path.isfile(os.path.join(folder, str(f))))
        if missing:
            raise InputError(f"{index_path}: names shard files that do not exist: {', '.join(missing)}")
        for name, fname in weight_map.items():
            if fname not in files:
                if os.path.basename(str(fname)) != str(fname):
                    raise InputError(f"{index_path}: shard name {fname!r} is not a plain file name")
                files[fname] = SafetensorsFile(os.path.join(folder, fname))
            sf = files[fname]
            at = sf._at.get(name)
            info = None if at is None else sf._infos[at]
            if info is None:
                raise InputError(f"{index_path}: {name!r} is not in {fname}")
            self._where[info.name] = sf  # the shard header's string: the index's copy is dropped
        self._files = files
        self._keys: list[str] | None = None
        extra = sorted(k for sf in files.values() for k in sf.keys() if k not in self._where)
        if extra:
            raise InputError(f"{index_path}: shards hold tensors the index does not name: {', '.join(extra[:5])}")

    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = [k for sf in self._files.values() for k in sf.keys()]
        return list(self._keys)

    def info(self, key: str) -> TensorInfo:
        return self._where[key].info(key)

    def load(self, key: str) -> torch.Tensor:
        return self._where[key].load(key)

    def group(self, key: str) -> str:
        return self._where[key].path

    def close(self) -> None:
        for sf in self._files.values():
            sf.close()
