"""Reading a ``.qnemo`` folder (a TensorRT-LLM checkpoint): its ``config.json`` and rank
files, lazily, for ``inspect``. Tensors are named ``rank{i}/<TensorRT-LLM name>``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.detect import RANK_FILE
from nemo_convert.hf_config import read_json_object
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.safetensors_source import SafetensorsFile
from nemo_convert.tensors.views import MultiSource

if TYPE_CHECKING:
    import torch


class _Prefixed:
    """``inner``'s tensors under ``prefix + name``."""

    def __init__(self, inner: TensorSource, prefix: str) -> None:
        self._inner, self._prefix = inner, prefix

    def keys(self) -> list[str]:
        return [self._prefix + k for k in self._inner.keys()]

    def _inner_key(self, key: str) -> str:
        return key[len(self._prefix):]

    def info(self, key: str) -> TensorInfo:
        i = self._inner.info(self._inner_key(key))
        return TensorInfo(key, i.shape, i.dtype_name)

    def load(self, key: str) -> torch.Tensor:
        return self._inner.load(self._inner_key(key))

    def group(self, key: str) -> str:
        return self._inner.group(self._inner_key(key))

    def close(self) -> None:
        self._inner.close()


@dataclass
class QnemoCheckpoint:
    path: str
    config: dict[str, Any]
    source: TensorSource
    ranks: list[dict[str, Any]] = field(default_factory=list)  # file, tensors, bytes

    def close(self) -> None:
        self.source.close()


def open_qnemo(path: str) -> QnemoCheckpoint:
    """Open a ``.qnemo`` folder lazily (no tensor bytes read)."""
    if not os.path.isdir(path):
        raise UnsupportedError(f"{path}: a .qnemo tar (quantize --compress) is read as a folder only; "
                               "extract it first (tar -xf)")
    cfg_path = os.path.join(path, "config.json")
    config = read_json_object(cfg_path)
    names = sorted((n for n in os.listdir(path) if RANK_FILE.fullmatch(n)), key=lambda n: int(n[4:-12]))
    files = [SafetensorsFile(os.path.join(path, n)) for n in names]
    ranks = []
    for n, f in zip(names, files):
        infos = [f.info(k) for k in f.keys()]
        ranks.append({"file": n, "tensors": len(infos), "bytes": sum(i.nbytes for i in infos)})
    source = MultiSource([_Prefixed(f, n.removesuffix(".safetensors") + "/") for n, f in zip(names, files)], path)
    return QnemoCheckpoint(path, config, source, ranks)
