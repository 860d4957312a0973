"""What every ``.nemo`` reader shares: the opened checkpoint (:class:`NemoCheckpoint`),
the config YAML, the vocabulary-padding trim, and how a family's tensor kinds are asked
for (:data:`KindsFor`). Both :mod:`.nemo` (NeMo 1) and :mod:`~nemo_convert.formats.nemo2.nemo2` (NeMo 2.0) build on
it, so neither imports the other's module for these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import yaml

from nemo_convert.errors import InputError
from nemo_convert.formats.io.tar_archive import Container
from nemo_convert.mapping.rules import Kind
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.pieces import Lazy

if TYPE_CHECKING:
    import torch

CONFIG_MEMBER = "model_config.yaml"


#: PyYAML's safe loader, in libyaml's C implementation where PyYAML has it (the pure-Python
#: one takes a fifth of a second for a NeMo config: most of ``inspect``'s time).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(data: bytes, where: str) -> dict[str, Any]:
    try:
        cfg = yaml.load(data.decode("utf-8"), Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader
    except (UnicodeDecodeError, yaml.YAMLError, ValueError, TypeError, AttributeError, KeyError,
            OverflowError, RecursionError) as exc:  # PyYAML's constructors raise plain errors too
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{where}: not a valid YAML config ({first})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: the config is not a mapping")
    if isinstance(cfg.get("model"), dict) and len(cfg) == 1:
        cfg = cfg["model"]
    for section in ("nemo_convert", "tokenizer"):
        if cfg.get(section) is not None and not isinstance(cfg[section], dict):
            raise InputError(f"{where}: the {section!r} section is not a mapping")
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
    backend: str | None = None  # the dist layout's Megatron-Core backend: "torch_dist" or "zarr"
    notes: list[str] = field(default_factory=list)  # how it was read (shown by inspect and in reports)

    def artifact(self, ref: str) -> bytes:
        """The bytes of an artifact referenced as ``nemo:<name>`` (or a bare member name)."""
        name = ref[5:] if ref.startswith("nemo:") else ref
        if not self.container.exists(self.prefix + name):
            raise InputError(f"{self.path}: config references artifact {ref!r}, which the archive lacks")
        return self.container.read_bytes(self.prefix + name)

    def close(self) -> None:
        self.source.close()
        self.container.close()


KindsFor = Callable[[dict[str, Any]], dict[str, Kind]]


class VocabTrimView:
    """Presents vocab-parallel tensors trimmed to the true vocabulary (drops padding rows)."""

    def __init__(self, inner: TensorSource, names: set[str], vocab: int) -> None:
        self._inner, self._names, self._vocab = inner, names, vocab

    def _trims(self, key: str) -> bool:
        return key in self._names and self._inner.info(key).shape[0] > self._vocab

    def keys(self) -> list[str]:
        return self._inner.keys()

    def info(self, key: str) -> TensorInfo:
        i = self._inner.info(key)
        return TensorInfo(key, (self._vocab, *i.shape[1:]), i.dtype_name) if self._trims(key) else i

    def load(self, key: str) -> torch.Tensor:
        t = self._inner.load(key)
        return t[: self._vocab] if self._trims(key) else t

    def load_lazy(self, key: str) -> Lazy:
        """:meth:`load`, deferred where the source below defers (merged TP ranks)."""
        t = getattr(self._inner, "load_lazy", self._inner.load)(key)
        return t.narrow(0, 0, self._vocab) if self._trims(key) else t

    def group(self, key: str) -> str:
        return self._inner.group(key)

    def close(self) -> None:
        self._inner.close()
