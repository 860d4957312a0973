"""The DCP ``.metadata`` pickle, written without importing ``torch.distributed.checkpoint``.

That package costs ~0.7 s to import (it pulls in the compiler stack), a third of a
1.5 GB import. The pickle only *names* its classes, so we emit the same opcodes from
stand-ins: ``tests/test_distckpt.py`` checks the bytes equal ``pickle.dumps`` of torch's
own ``Metadata`` for the same records. :func:`metadata_bytes` runs the C pickler over
look-alike classes (one record per chunk, so an MoE's thousand expert chunks cost ~2 ms);
:func:`_metadata_stub`, the pure-Python pickler over stand-ins, is its fallback.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nemo_convert.formats.dist_checkpoint.dcp_emit import FS as _FS
from nemo_convert.formats.dist_checkpoint.dcp_emit import MD as _MD
from nemo_convert.formats.dist_checkpoint.dcp_emit import Tensors
from nemo_convert.formats.dist_checkpoint.dcp_emit import metadata_stream, streamable


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


#: the pure-Python pickler, private to ``pickle`` and without a type stub
_PurePickler: Any = getattr(pickle, "_Pickler")  # noqa: B009 - typeshed does not declare it


class _StubPickler(_PurePickler):
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


def _metadata_stub(tensors: Tensors, objects: Sequence[tuple[str, str, int, int]], version: str) -> bytes:
    """:func:`metadata_bytes` by the pure-Python pickler over stand-ins (the fallback, and
    the reference the fast path is tested against)."""
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


# The fast path: the C pickler over look-alike classes. They live in a module we register
# under a name exactly as long as torch's, so the C pickler can name them (it imports the
# module by name from ``sys.modules`` and checks the attribute), and the output differs
# from torch's only in those two equally long module strings, each written once (later
# uses are memo references). Replacing them keeps every length, frame and memo index, so
# the bytes are pickle.dumps(torch's Metadata) — 10-30× faster than ``_StubPickler``.


def _look_alike_module(real: str) -> types.ModuleType:
    name = "_nemo_convert_dcp_stand_in_" + real.rsplit(".", 1)[1]
    name += "_" * (len(real) - len(name))
    assert len(name) == len(real) and len(real.encode()) < 256
    mod = sys.modules.get(name)
    if mod is None:
        mod = sys.modules[name] = types.ModuleType(name, f"stand-ins named like {real} (dcp_pickle)")
    return mod


_MD_FAST = _look_alike_module(_MD)
_FS_FAST = _look_alike_module(_FS)


def _look_alike(mod: types.ModuleType, cls: type) -> type:
    cls.__module__ = mod.__name__
    setattr(mod, cls.__name__, cls)
    return cls


class _Metadata:
    def __init__(self, sd_md: dict[str, Any], planner: dict[str, Any], storage: dict[Any, Any], version: str) -> None:
        self.state_dict_metadata, self.planner_data, self.storage_data = sd_md, planner, storage
        self.storage_meta, self.version = None, version


class _TensorStorageMetadata:
    def __init__(self, properties: Any, size: torch.Size, chunks: list[Any]) -> None:
        self.properties, self.size, self.chunks = properties, size, chunks


class _TensorProperties:
    def __init__(self, state: tuple[Any, ...]) -> None:
        self._state = state

    def __getstate__(self) -> tuple[Any, ...]:  # torch's TensorProperties pickles a tuple
        return self._state


class _ChunkStorageMetadata:
    def __init__(self, offsets: torch.Size, sizes: torch.Size) -> None:
        self.offsets, self.sizes = offsets, sizes


class _BytesStorageMetadata:
    pass


class _MetadataIndex:  # a dict key: hashable by identity
    def __init__(self, fqn: str, index: int | None, offset: torch.Size | None) -> None:
        self.fqn, self.index = fqn, index  # torch's __dict__ order; no offset: absent
        if offset is not None:
            self.offset = offset


class _StorageInfo:
    def __init__(self, relative_path: str, offset: int, length: int) -> None:
        self.relative_path, self.offset, self.length = relative_path, offset, length


class _MemFormat:
    def __reduce__(self) -> tuple[Any, ...]:  # an enum member: REDUCE(cls, (value,))
        return (_MemFormat, (0,))


for _c, _n in ((_Metadata, "Metadata"), (_TensorStorageMetadata, "TensorStorageMetadata"),
               (_TensorProperties, "TensorProperties"), (_ChunkStorageMetadata, "ChunkStorageMetadata"),
               (_BytesStorageMetadata, "BytesStorageMetadata"), (_MetadataIndex, "MetadataIndex"),
               (_MemFormat, "_MEM_FORMAT_ENCODING")):
    _c.__name__ = _c.__qualname__ = _n
    _look_alike(_MD_FAST, _c)
_StorageInfo.__name__ = _StorageInfo.__qualname__ = "_StorageInfo"
_look_alike(_FS_FAST, _StorageInfo)
_MODULE_SWAPS = [(bytes((pickle.SHORT_BINUNICODE[0], len(fast.__name__))) + fast.__name__.encode(),
                  bytes((pickle.SHORT_BINUNICODE[0], len(real))) + real.encode())
                 for fast, real in ((_MD_FAST, _MD), (_FS_FAST, _FS))]
_FAST_NAMES = frozenset((_MD_FAST.__name__, _FS_FAST.__name__))


def metadata_bytes(tensors: Tensors, objects: Sequence[tuple[str, str, int, int]],
                   version: str) -> bytes | bytearray:
    """``pickle.dumps(Metadata(...))`` for tensors ``(key, shape, dtype, [(offsets, sizes,
    path, offset, length), …])`` (chunks sorted) and BYTE_IO objects ``(key, path, offset,
    length)``, in that order. Written by :func:`~nemo_convert.formats.dist_checkpoint.dcp_emit.metadata_stream` where it applies (it
    holds no object graph), else by the C pickler over look-alikes."""
    if streamable(tensors, objects, version):
        return metadata_stream(tensors, objects, version)  # not copied: bytes-like, the peak's half
    return _metadata_pickled(tensors, objects, version)


def write_metadata(write: Callable[[bytes | bytearray], Any], tensors: Tensors,
                   objects: Sequence[tuple[str, str, int, int]], version: str) -> None:
    """:func:`metadata_bytes`, passed to ``write`` a frame at a time where the record-by-record
    writer applies (else at once)."""
    if streamable(tensors, objects, version):
        write(metadata_stream(tensors, objects, version, write))
    else:
        write(_metadata_pickled(tensors, objects, version))


def _metadata_pickled(tensors: Tensors, objects: Sequence[tuple[str, str, int, int]], version: str) -> bytes:
    """:func:`metadata_bytes` by the C pickler over the look-alike classes."""
    Size = torch.Size
    sd_md: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    layout, contiguous = torch.strided, _MemFormat()  # one object each, as in torch
    for key, shape, dtype, chunks in tensors:
        sd_md[key] = _TensorStorageMetadata(_TensorProperties((dtype, layout, False, contiguous, False)),
                                            Size(shape), [_ChunkStorageMetadata(Size(off), Size(siz))
                                                          for off, siz, _, _, _ in chunks])
        for i, (off, _, path, offset, length) in enumerate(chunks):
            storage[_MetadataIndex(key, i, Size(off))] = _StorageInfo(path, offset, length)
    for key, path, offset, length in objects:
        sd_md[key] = _BytesStorageMetadata()
        storage[_MetadataIndex(key, None, None)] = _StorageInfo(path, offset, length)
    md = _Metadata(sd_md, {k: (k,) for k in sd_md}, storage, version)
    out = pickle.dumps(md, protocol=pickle.DEFAULT_PROTOCOL)
    # Each module string is written once (later uses are memo references). A key, path or
    # version equal to one could share its memo entry (same interned object), and one that
    # contains it would add a count: in either case take the slow, sure path.
    strings = {version, *sd_md, *(c[2] for *_, chunks in tensors for c in chunks), *(o[1] for o in objects)}
    if not _FAST_NAMES.isdisjoint(strings):
        return _metadata_stub(tensors, objects, version)
    for (fast, real), used in zip(_MODULE_SWAPS, (True, bool(storage))):
        if out.count(fast) != used:
            return _metadata_stub(tensors, objects, version)
        out = out.replace(fast, real)
    return out
