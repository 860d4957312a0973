"""Sources made of other sources: renamed (any names; prefix removed, filtered) and united."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.pieces import Lazy

if TYPE_CHECKING:
    import torch


class RenamedView:
    """The tensors of ``inner`` named by ``names`` (``{new name: inner name}``), under the new
    names, in that order; everything else is delegated."""

    def __init__(self, inner: TensorSource, names: dict[str, str]) -> None:
        self._inner = inner
        self._map = names

    def keys(self) -> list[str]:
        return list(self._map)

    def info(self, key: str) -> TensorInfo:
        i = self._inner.info(self._map[key])
        return TensorInfo(key, i.shape, i.dtype_name)

    def load(self, key: str) -> torch.Tensor:
        return self._inner.load(self._map[key])

    def load_lazy(self, key: str) -> Lazy:
        """:meth:`load`, deferred where the source below defers."""
        return getattr(self._inner, "load_lazy", self._inner.load)(self._map[key])

    def group(self, key: str) -> str:
        return self._inner.group(self._map[key])

    def close(self) -> None:
        self._inner.close()


class PrefixView(RenamedView):
    """The keys of ``inner`` that start with ``prefix`` (and pass ``keep``), with the prefix
    removed; the other keys are listed in ``extra_keys`` and not presented as tensors."""

    def __init__(self, inner: TensorSource, prefix: str, keep: Callable[[str], bool] | None = None) -> None:
        super().__init__(inner, {k[len(prefix):]: k for k in inner.keys()
                                 if k.startswith(prefix) and (keep is None or keep(k))})
        taken = set(self._map.values())
        self.extra_keys = [k for k in inner.keys() if k not in taken]


class MultiSource:
    """Several sources seen as one (shard files, rank files); a name in two is an error."""

    def __init__(self, sources: Sequence[TensorSource], where: str = "checkpoint") -> None:
        self._sources = list(sources)
        self._where: dict[str, TensorSource] = {}
        for s in self._sources:
            for k in s.keys():
                if k in self._where:
                    raise InputError(f"{where}: tensor {k!r} is stored in more than one file")
                self._where[k] = s

    def keys(self) -> list[str]:
        return [k for s in self._sources for k in s.keys()]

    def info(self, key: str) -> TensorInfo:
        return self._where[key].info(key)

    def load(self, key: str) -> torch.Tensor:
        return self._where[key].load(key)

    def group(self, key: str) -> str:
        return self._where[key].group(key)

    def close(self) -> None:
        for s in self._sources:
            s.close()
