"""A :class:`~nemo_convert.tensors.base.TensorSource` over the tensors of a ``torch.save``
zip archive (``.bin``, ``.pt``, Lightning ``.ckpt``, ``model_weights.ckpt``), read in place
by :mod:`nemo_convert.tensors.torch_zip`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import ByteRegion, TensorInfo
from nemo_convert.tensors.torch_zip import LazyTensor, load_archive

if TYPE_CHECKING:
    import torch


class TorchZipSource:
    """A :class:`~nemo_convert.tensors.base.TensorSource` over the tensors of a torch
    archive. ``select`` names the top-level key to descend into; by default
    ``state_dict`` when present (Lightning ``.ckpt``), else the whole top-level dict.
    Nested dicts and lists are flattened with ``.`` joins; other values are skipped but
    stay reachable in :attr:`tree` (the whole object tree).
    """

    def __init__(self, region: ByteRegion, *, trust_pickle: bool = False,
                 select: str | None = None) -> None:
        self.region = region
        self.tree, self._archive = load_archive(region, trust_pickle)
        where = self._archive.where
        if select is not None:
            if not isinstance(self.tree, dict) or select not in self.tree:
                keys = sorted(map(str, self.tree)) if isinstance(self.tree, dict) else []
                raise InputError(f"{where}: no top-level key {select!r} (keys: {keys})")
            root = self.tree[select]
        elif isinstance(self.tree, dict) and isinstance(self.tree.get("state_dict"), dict):
            root = self.tree["state_dict"]
        else:
            root = self.tree
        if not isinstance(root, (dict, list, tuple)):
            raise InputError(f"{where}: holds a {type(root).__name__}, not a dict of tensors")
        self._tensors: dict[str, LazyTensor] = {}
        self._flatten(root, "", where)

    def _flatten(self, node: Any, prefix: str, where: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            name = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, LazyTensor):
                if name in self._tensors:
                    raise InputError(f"{where}: two tensors flatten to the name {name!r}")
                self._tensors[name] = v
            elif isinstance(v, (dict, list, tuple)):
                self._flatten(v, name, where)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def lazy(self, key: str) -> LazyTensor:
        """The :class:`LazyTensor` record of ``key`` (storage, offset, stride)."""
        return self._tensors[key]

    def info(self, key: str) -> TensorInfo:
        return self._tensors[key].info(key)

    def load(self, key: str) -> torch.Tensor:
        return self._tensors[key].load()

    def group(self, key: str) -> str:
        self._tensors[key]  # KeyError for unknown names
        return self.region.path

    def close(self) -> None:
        self._archive.close()

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, key: object) -> bool:
        return key in self._tensors

    def __enter__(self) -> TorchZipSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_torch_file(path: str, **kw: Any) -> TorchZipSource:
    """A :class:`TorchZipSource` over the whole file at ``path``."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    return TorchZipSource(ByteRegion(path, 0, os.path.getsize(path)), **kw)


__all__ = ["TorchZipSource", "open_torch_file"]
