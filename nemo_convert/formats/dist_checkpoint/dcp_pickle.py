"""The DCP ``.metadata`` pickle, written without importing ``torch.distributed.checkpoint``.

That package costs ~0.7 s to import (it pulls in the compiler stack), a third of a
1.5 GB import. The pickle only *names* its classes, so we emit the same opcodes from
stand-ins: ``tests/test_distckpt.py`` checks the bytes equal ``pickle.dumps`` of torch's
own ``Metadata`` for the same records.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

_MD = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"


class _Name:
    """A class or function pickled by reference, never imported."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class _Instance:
    """An object pickled as ``NEWOBJ(cls) + BUILD(state)`` (a plain dataclass)."""

    def __init__(self, cls: _Name, state: Any) -> None:
        self.cls, self.state = cls, state



class _Call:
    """An object pickled as ``REDUCE(func, args)`` (an enum member)."""

    def __init__(self, func: _Name, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args



class _Keyed(_Instance):
    """An instance used as a dict key (``MetadataIndex``): hashable by identity."""


class _StubPickler(pickle._Pickler):  # type: ignore[misc,name-defined]
    """The pure-Python pickler (same opcodes as the C one) that can name stand-ins."""

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if isinstance(obj, _Name):
            self.save(obj.module)
            self.save(obj.name)
            self.write(pickle.STACK_GLOBAL)
            self.memoize(obj)
            return
        super().save_global(obj, name)

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:  # noqa: FBT001
        if isinstance(obj, (_Instance, _Call)):
            self.framer.commit_frame()
            memo = self.memo.get(id(obj))
            if memo is not None:
                self.write(self.get(memo[0]))
                return
            if isinstance(obj, _Instance):  # what save_reduce writes for copyreg.__newobj__
                self.save(obj.cls)
                self.save(())
                self.write(pickle.NEWOBJ)
                self.memoize(obj)
                if obj.state is not None:  # an object with an empty __dict__ has no state
                    self.save(obj.state)
                    self.write(pickle.BUILD)
            else:
                self.save(obj.func)
                self.save(obj.args)
                self.write(pickle.REDUCE)
                self.memoize(obj)
            return
        if isinstance(obj, _Name):
            memo = self.memo.get(id(obj))
            if memo is not None:
                self.write(self.get(memo[0]))
                return
            self.save_global(obj)
            return
        super().save(obj, save_persistent_id)


_CLASSES: dict[str, _Name] = {}


def _cls(module: str, name: str) -> _Name:
    key = f"{module}.{name}"
    if key not in _CLASSES:
        _CLASSES[key] = _Name(module, name)
    return _CLASSES[key]


def _tensor_properties(dtype: torch.dtype, shared: dict[str, _Call]) -> _Instance:
    """``TensorProperties(dtype)``; ``torch.strided`` and the contiguous-format enum member
    are single objects in torch, so they are shared (memoised) here too."""
    if not shared:
        shared["layout"] = _Call(_cls("torch.serialization", "_get_layout"), ("torch.strided",))
        shared["contiguous"] = _Call(_cls(_MD, "_MEM_FORMAT_ENCODING"), (0,))
    return _Instance(_cls(_MD, "TensorProperties"), (dtype, shared["layout"], False, shared["contiguous"], False))


def metadata_bytes(tensors: list[tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...],
                   tuple[int, ...], str, int, int]]]],
                   objects: list[tuple[str, str, int, int]], version: str) -> bytes:
    """``pickle.dumps(Metadata(...))`` for tensors ``(key, shape, dtype, [(offsets, sizes,
    path, offset, length), …])`` (chunks sorted) and BYTE_IO objects ``(key, path, offset,
    length)``, in that order."""
    sd_md: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    shared: dict[str, _Call] = {}
    for key, shape, dtype, chunks in tensors:
        sd_md[key] = _Instance(_cls(_MD, "TensorStorageMetadata"), {
            "properties": _tensor_properties(dtype, shared), "size": torch.Size(shape),
            "chunks": [_Instance(_cls(_MD, "ChunkStorageMetadata"),
                                 {"offsets": torch.Size(off), "sizes": torch.Size(siz)})
                       for off, siz, _, _, _ in chunks]})
        for i, (off, _, path, offset, length) in enumerate(chunks):
            index = _Keyed(_cls(_MD, "MetadataIndex"), {"fqn": key, "index": i, "offset": torch.Size(off)})
            storage[index] = _Instance(_cls(_FS, "_StorageInfo"),
                                       {"relative_path": path, "offset": offset, "length": length})
    for key, path, offset, length in objects:
        sd_md[key] = _Instance(_cls(_MD, "BytesStorageMetadata"), None)
        storage[_Keyed(_cls(_MD, "MetadataIndex"), {"fqn": key, "index": None})] = _Instance(
            _cls(_FS, "_StorageInfo"), {"relative_path": path, "offset": offset, "length": length})
    md = _Instance(_cls(_MD, "Metadata"), {
        "state_dict_metadata": sd_md, "planner_data": {k: (k,) for k in sd_md}, "storage_data": storage,
        "storage_meta": None, "version": version})
    buf = io.BytesIO()
    _StubPickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(md)
    _CLASSES.clear()
    return buf.getvalue()
