"""Hugging Face model folders: ``config.json`` + safetensors (or ``pytorch_model*.bin``)
+ tokenizer files. Read lazily; written as streamed, sharded safetensors."""

from __future__ import annotations

import glob
import json
import os
from json.encoder import encode_basestring_ascii
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


from nemo_convert.errors import InputError
from nemo_convert.formats.hf.safetensors_writer import SafetensorsStreamWriter
from nemo_convert.hf_config import read_config_json
from nemo_convert.tensors.pieces import Lazy
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.safetensors_source import SafetensorsFile, ShardedSafetensors
from nemo_convert.tensors.torch_zip_source import open_torch_file
from nemo_convert.tensors.views import MultiSource

SAFE_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def is_hf_folder(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def _bin_source(folder: str, trust_pickle: bool) -> TensorSource:
    index = os.path.join(folder, BIN_INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"{index}: not a valid weight index") from None
        bad = [f for f in files if not isinstance(f, str) or os.path.basename(f) != f or f in (".", "..")]
        if bad:
            raise InputError(f"{index}: shard names must be plain file names in the folder, not {bad[0]!r}")
        missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            raise InputError(f"{index}: names shard files that do not exist: {', '.join(missing)}")
    else:
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "pytorch_model*.bin")))
    return MultiSource([open_torch_file(os.path.join(folder, f), trust_pickle=trust_pickle) for f in files], folder)


def open_hf_weights(folder: str, *, trust_pickle: bool = False) -> TensorSource:
    """The weights of an HF folder as a lazy source (safetensors preferred)."""
    if os.path.isfile(os.path.join(folder, SAFE_INDEX)):
        return ShardedSafetensors(os.path.join(folder, SAFE_INDEX))
    singles = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if len(singles) == 1:
        return SafetensorsFile(singles[0])
    if len(singles) > 1:
        raise InputError(f"{folder}: several .safetensors files but no {SAFE_INDEX}")
    if glob.glob(os.path.join(folder, "pytorch_model*.bin")):
        return _bin_source(folder, trust_pickle)
    raise InputError(f"{folder}: no weights found (*.safetensors or pytorch_model*.bin)")


@dataclass
class HFCheckpoint:
    """An HF model folder opened lazily."""

    folder: str
    config: dict[str, Any]
    source: TensorSource
    generation_config: dict[str, Any] | None = None
    extra_files: dict[str, str] = field(default_factory=dict)  # name -> path (tokenizer files …)

    def close(self) -> None:
        self.source.close()


def open_hf(folder: str, *, tokenizer_files: Sequence[str] = (), trust_pickle: bool = False) -> HFCheckpoint:
    if not os.path.isdir(folder):
        raise InputError(f"{folder}: no such folder")
    config = read_config_json(folder)
    gen = None
    gen_path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(gen_path):
        try:
            with open(gen_path, encoding="utf-8") as f:
                gen = json.load(f)
        except (OSError, ValueError):
            raise InputError(f"{gen_path}: not valid JSON") from None
    extras = {n: os.path.join(folder, n) for n in tokenizer_files if os.path.isfile(os.path.join(folder, n))}
    return HFCheckpoint(folder, config, open_hf_weights(folder, trust_pickle=trust_pickle), gen, extras)


def assign_shards(infos: Sequence[TensorInfo], max_shard_bytes: int) -> list[list[TensorInfo]]:
    """Consecutive tensors grouped into shards of at most ``max_shard_bytes`` (a tensor
    larger than that gets a shard of its own)."""
    shards: list[list[TensorInfo]] = [[]]
    size = 0
    for info in infos:
        if shards[-1] and size + info.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(info)
        size += info.nbytes
    return [s for s in shards if s] or [[]]


class HFWeightsWriter:
    """Streams tensors, in plan order, into ``model-0000i-of-0000N.safetensors`` files
    plus ``model.safetensors.index.json``.

    Shards are fixed by the tensor list alone. With ``owned`` a process writes only the
    shards it owns (tensors of other shards are ignored) and ``write_index`` says whether
    it writes the index; several processes then produce exactly the one-process files.
    """

    def __init__(self, folder: str, infos: Sequence[TensorInfo], *,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                 owned: Callable[[int], bool] = lambda i: True, write_index: bool = True) -> None:
        self.folder = folder
        self._shards = assign_shards(infos, max_shard_bytes)
        n = len(self._shards)
        self._names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self._shard_of = {info.name: i for i, shard in enumerate(self._shards) for info in shard}
        self._owned = {i for i in range(n) if owned(i)}
        self._writers: dict[int, SafetensorsStreamWriter] = {}
        if write_index:
            _write_index(os.path.join(folder, SAFE_INDEX), sum(i.nbytes for i in infos),
                         {name: self._names[i] for name, i in self._shard_of.items()})
        if not infos and 0 in self._owned:
            SafetensorsStreamWriter(os.path.join(folder, self._names[0]), [], {"format": "pt"}).close()

    def wants(self, name: str) -> bool:
        """Whether this writer writes tensor ``name`` (its shard is owned)."""
        return self._shard_of.get(name, -1) in self._owned

    def write(self, name: str, tensor: Lazy) -> None:
        i = self._shard_of[name]
        if i not in self._owned:
            return
        w = self._writers.get(i)
        if w is None:
            w = self._writers[i] = SafetensorsStreamWriter(os.path.join(self.folder, self._names[i]),
                                                           self._shards[i], {"format": "pt"})
        w.write(name, tensor)

    def close(self) -> None:
        unfinished = [i for i in self._owned if not (i in self._writers and self._writers[i].done)
                      and self._shards[i]]
        for w in self._writers.values():
            w.close()
        if unfinished:
            raise InputError("internal error: HF writer closed before every tensor was written "
                             f"(shards {', '.join(self._names[i] for i in unfinished)})")


def _write_index(path: str, total: int, weight_map: dict[str, str]) -> None:
    """``model.safetensors.index.json``: ``json.dump({"metadata": {"total_size": total},
    "weight_map": <sorted by name>}, indent=2)`` and a newline, written entry by entry (the
    sorted copy of the map and the encoder's pieces were ~0.2 KiB per tensor at the set-up's
    peak of an export; docs/performance.md, "Memory, third round")."""
    quote = encode_basestring_ascii  # what json.dump escapes strings with (ensure_ascii)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'{{\n  "metadata": {{\n    "total_size": {int(total)}\n  }},\n  "weight_map": ')
        if not weight_map:
            f.write("{}")
        else:
            lines = []
            for k, name in enumerate(sorted(weight_map)):
                lines.append(f"{',' if k else '{'}\n    {quote(name)}: {quote(weight_map[name])}")
                if len(lines) == 1024:
                    f.write("".join(lines))
                    lines.clear()
            f.write("".join(lines) + "\n  }")
        f.write("\n}\n")


def json_bytes(obj: Any) -> bytes:
    """``obj`` as an HF-style JSON file (2-space indent, keys in order, final newline)."""
    return (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8")


def write_json(path: str, obj: Any) -> None:
    with open(path, "wb") as f:
        f.write(json_bytes(obj))
