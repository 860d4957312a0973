"""NeMo 1 ``.nemo`` checkpoints: open any layout lazily; write config and artifacts.

Reading: a plain tar read in place, a gzipped tar (old NeMo), or the unpacked folder;
weights in the ``dist`` layout (``model_weights/``) or the ``legacy`` one
(``model_weights.ckpt``). Tensors come out under their *logical* names (per layer, no
``model.`` prefix), whatever the layout.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml

from nemo_convert.errors import InputError, UnsupportedError
from nemo_convert.formats.sink import MemberSink
from nemo_convert.formats.tar_archive import Container, find_member, open_nemo_container
from nemo_convert.tensors.base import TensorInfo, TensorSource

CONFIG_MEMBER = "model_config.yaml"


class PrefixView:
    """A source whose keys lose a leading prefix (``model.``); keys without it are kept
    under ``extra_keys`` and not presented as tensors."""

    def __init__(self, inner: TensorSource, prefix: str) -> None:
        self._inner = inner
        self._map = {k[len(prefix):]: k for k in inner.keys() if k.startswith(prefix)}
        self.extra_keys = [k for k in inner.keys() if not k.startswith(prefix)]

    def keys(self) -> list[str]:
        return list(self._map)

    def info(self, key: str) -> TensorInfo:
        i = self._inner.info(self._map[key])
        return TensorInfo(key, i.shape, i.dtype)

    def load(self, key: str) -> torch.Tensor:
        return self._inner.load(self._map[key])

    def group(self, key: str) -> str:
        return self._inner.group(self._map[key])

    def close(self) -> None:
        self._inner.close()


def load_yaml(data: bytes, where: str) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{where}: not a valid YAML config ({first})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: the config is not a mapping")
    if isinstance(cfg.get("model"), dict) and len(cfg) == 1:
        cfg = cfg["model"]
    return cfg


def dump_yaml(cfg: dict[str, Any]) -> bytes:
    return yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True).encode("utf-8")


@dataclass
class NemoCheckpoint:
    """A ``.nemo`` opened lazily."""

    path: str
    container: Container
    prefix: str  # member prefix before model_config.yaml ("" normally)
    config: dict[str, Any]
    layout: str
    source: TensorSource
    extra_state_keys: list[str] = field(default_factory=list)

    def artifact(self, ref: str) -> bytes:
        """The bytes of an artifact referenced as ``nemo:<name>`` (or a bare member name)."""
        name = ref[5:] if ref.startswith("nemo:") else ref
        if not self.container.exists(self.prefix + name):
            raise InputError(f"{self.path}: config references artifact {ref!r}, which the archive lacks")
        return self.container.read_bytes(self.prefix + name)

    def close(self) -> None:
        self.source.close()
        self.container.close()


def _per_rank_dirs(container: Container, prefix: str) -> list[str]:
    return sorted({n[len(prefix):].split("/", 1)[0] for n in container.names()
                   if n.startswith(prefix) and (n[len(prefix):].startswith("mp_rank_")
                                                or n[len(prefix):].startswith("tp_rank_"))})


def open_nemo(path: str, *, trust_pickle: bool = False) -> NemoCheckpoint:
    """Open a ``.nemo`` (tar, gzipped tar, or folder) without extracting it."""
    container = open_nemo_container(path)
    try:
        cfg_name = find_member(container, CONFIG_MEMBER)
        prefix = cfg_name[: -len(CONFIG_MEMBER)]
        config = load_yaml(container.read_bytes(cfg_name), f"{path}:{cfg_name}")
        if container.exists(prefix + "model_weights/metadata.json"):
            from nemo_convert.formats.distckpt import DistCheckpointSource

            dist = DistCheckpointSource(lambda n: container.region(prefix + "model_weights/" + n),
                                        name=f"{path}:model_weights")
            source: TensorSource = PrefixView(dist, "model.")
            layout = "dist"
            extra = list(getattr(dist, "extra_state_keys", []))
        elif container.exists(prefix + "model_weights.ckpt"):
            from nemo_convert.tensors.torch_zip import TorchZipSource

            zs = TorchZipSource(container.region(prefix + "model_weights.ckpt"), trust_pickle=trust_pickle)
            view = PrefixView(zs, "model.")
            source, layout = view, "legacy"
            extra = [k for k in zs.keys() if k.endswith("_extra_state")]
        elif _per_rank_dirs(container, prefix):
            raise UnsupportedError(f"{path}: per-rank (mp_rank_*/tp_rank_*) weights are read by the "
                                   "parallelism support")
        else:
            raise InputError(f"{path}: has {CONFIG_MEMBER} but no weights (model_weights/ or model_weights.ckpt)")
        return NemoCheckpoint(path, container, prefix, config, layout, source, extra)
    except BaseException:
        container.close()
        raise


def artifact_name(data: bytes, basename: str) -> str:
    """NeMo's artifact naming ``<32 hex>_<basename>``; our hex is the content's MD5, so
    the same input always gives the same archive."""
    return f"{hashlib.md5(data).hexdigest()}_{basename}"


def add_artifact_bytes(sink: MemberSink, data: bytes, basename: str) -> str:
    """Store ``data`` in the archive root as an artifact; returns its ``nemo:`` reference."""
    name = artifact_name(data, basename)
    sink.add_bytes(name, data)
    return "nemo:" + name
