"""The DCP ``.metadata`` pickle, written without importing ``torch.distributed.checkpoint``.

That package costs ~0.7 s to import (it pulls in the compiler stack), a third of a
1.5 GB import. The pickle only *names* its classes, so we emit the same opcodes from
stand-ins: ``tests/test_distckpt.py`` checks the bytes equal ``pickle.dumps`` of torch's
own ``Metadata`` for the same records. :func:`metadata_bytes` runs the C pickler over
look-alike classes (one record per chunk, so an MoE's thousand expert chunks cost ~2 ms);
:func:`_metadata_stub`, the pure-Python pickler over stand-ins, is its fallback.
"""

from __future__ import annotations

import array
import io
import pickle
import sys
import types
from collections.abc import Callable
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


def _metadata_stub(tensors: list[tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...],
                   tuple[int, ...], str, int, int]]]],
                   objects: list[tuple[str, str, int, int]], version: str) -> bytes:
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


def metadata_bytes(tensors: list[tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...],
                   tuple[int, ...], str, int, int]]]],
                   objects: list[tuple[str, str, int, int]], version: str) -> bytes | bytearray:
    """``pickle.dumps(Metadata(...))`` for tensors ``(key, shape, dtype, [(offsets, sizes,
    path, offset, length), …])`` (chunks sorted) and BYTE_IO objects ``(key, path, offset,
    length)``, in that order. Written by :func:`_metadata_stream` where it applies (it
    holds no object graph), else by the C pickler over look-alikes."""
    if _streamable(tensors, objects, version):
        return _metadata_stream(tensors, objects, version)  # not copied: bytes-like, the peak's half
    return _metadata_pickled(tensors, objects, version)


def _metadata_pickled(tensors: list[tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...],
                      tuple[int, ...], str, int, int]]]],
                      objects: list[tuple[str, str, int, int]], version: str) -> bytes:
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


# The streaming path: the same opcodes written record by record, without the object graph.
# Building the look-alike graph and running the C pickler over it holds, at its peak, every
# record's objects plus the pickler's memo (which keeps each memoised object alive): ~2 KiB
# per tensor. The bytes of that graph follow a fixed grammar, so :class:`_Emitter` writes
# them directly — the memo indices, the dict and list batches of 1000, the frames of
# 64 KiB — holding only the memo indices of the key strings. ``tests/test_distckpt.py``
# checks it against :func:`metadata_bytes`'s C-pickler bytes (which it checks against
# torch's), for sizes that cross frames and batches. Facts from CPython 3.11
# ``Modules/_pickle.c``: ``batch_list_exact`` / ``batch_dict_exact`` (a one-item container
# is ``APPEND`` / ``SETITEM``; a dict of a multiple of 1000 items ends with an empty
# ``MARK SETITEMS``), ``_Pickler_OpcodeBoundary`` (a frame of 64 KiB or more is committed
# when a ``save`` returns), ``_Pickler_CommitFrame`` (a frame under 4 bytes has no header).

_FRAME_TARGET = 64 * 1024
_BATCH = 1000
_S_MEMO = bytes((pickle.MEMOIZE[0],))


class _Emitter:
    """Pickle opcodes into one buffer, with the C pickler's framing and memo numbering."""

    def __init__(self) -> None:
        self.out = bytearray(pickle.PROTO + bytes((pickle.DEFAULT_PROTOCOL,)))
        self.n = 0  # the next memo index
        self.fixed: dict[Any, int] = {}  # memo indices of the fixed strings and objects
        self.open()

    def open(self) -> None:
        """Start a frame: its header's place. (The C pickler starts one at the next write;
        here a write always follows.)"""
        self.frame = len(self.out)  # where the current frame's header is
        self.limit = self.frame + 9 + _FRAME_TARGET  # the length that ends it at a save
        self.out += b"\0" * 9

    def w(self, b: bytes) -> None:
        self.out += b

    def commit(self) -> None:
        n = len(self.out) - self.frame - 9
        if n >= 4:
            self.out[self.frame:self.frame + 9] = pickle.FRAME + n.to_bytes(8, "little")
        else:
            del self.out[self.frame:self.frame + 9]

    def save(self) -> None:
        """A ``save`` starts: a frame of 64 KiB or more is committed (and the next opened)."""
        if len(self.out) >= self.limit:
            self.commit()
            self.open()

    def memo(self) -> int:
        self.w(_S_MEMO)
        self.n += 1
        return self.n - 1

    def get(self, i: int) -> None:
        self.save()
        self.w(pickle.BINGET + bytes((i,)) if i < 256 else pickle.LONG_BINGET + i.to_bytes(4, "little"))

    def new_str(self, s: str) -> int:
        self.save()
        b = s.encode("utf-8", "surrogatepass")
        if len(b) < 256:
            self.w(pickle.SHORT_BINUNICODE + bytes((len(b),)) + b)
        else:
            self.w(pickle.BINUNICODE + len(b).to_bytes(4, "little") + b)
        i = self.memo()
        return i

    def fixed_str(self, s: Any, text: str) -> None:
        """A string that is one object throughout (an attribute or module name)."""
        i = self.fixed.get(s)
        if i is None:
            self.fixed[s] = self.new_str(text)
        else:
            self.get(i)

    def int_(self, v: int) -> None:
        self.save()
        if 0 <= v < 256:
            self.w(pickle.BININT1 + bytes((v,)))
        elif 0 <= v < 65536:
            self.w(pickle.BININT2 + v.to_bytes(2, "little"))
        elif -(2 ** 31) <= v < 2 ** 31:
            self.w(pickle.BININT + v.to_bytes(4, "little", signed=True))
        else:
            b = pickle.encode_long(v)  # type: ignore[attr-defined]
            self.w(pickle.LONG1 + bytes((len(b),)) + b)

    def once(self, key: Any, build: Callable[[], None]) -> None:
        """An object that is one object throughout: built (then memoized under ``key``) the
        first time, a memo get after."""
        self.save()
        i = self.fixed.get(key)
        if i is not None:
            self.get(i)
            return
        build()
        self.fixed[key] = self.memo()

    def global_(self, key: Any, module: tuple[Any, str], name: str) -> None:
        def build() -> None:
            self.fixed_str(*module)
            self.new_str(name)
            self.w(pickle.STACK_GLOBAL)

        self.once(key, build)

    def tuple_(self, items: Any, save: Any) -> None:
        self.save()
        n = len(items)
        if n == 0:
            self.w(pickle.EMPTY_TUPLE)
            return
        if n > 3:
            self.w(pickle.MARK)
        for x in items:
            save(x)
        self.w((pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3)[n - 1] if n <= 3 else pickle.TUPLE)
        self.memo()

    def size(self, shape: tuple[int, ...]) -> None:
        """``torch.Size(shape)``: ``REDUCE(torch.Size, (tuple(shape),))``."""
        self.save()
        self.global_("Size", ("torch/Size", "torch"), "Size")
        self.tuple_((shape,), lambda t: self.tuple_(t, self.int_))
        self.w(pickle.REDUCE)
        self.memo()

    def dict_items(self, n: int, items: Any) -> None:
        """``EMPTY_DICT`` and its ``n`` items, each written by a call of ``items``."""
        self.save()
        self.w(pickle.EMPTY_DICT)
        self.memo()
        if n == 1:
            next(items)()
            self.w(pickle.SETITEM)
        elif n > 1:
            while True:
                self.w(pickle.MARK)
                k = 0
                for item in items:
                    item()
                    k += 1
                    if k == _BATCH:
                        break
                self.w(pickle.SETITEMS)
                if k != _BATCH:
                    break

    def obj(self, cls: str, module: tuple[Any, str], state: Any) -> None:
        """``NEWOBJ(cls)`` then ``BUILD(state())``; ``state`` None: no state."""
        self.save()
        self.global_(cls, module, cls)
        self.save()
        self.w(pickle.EMPTY_TUPLE)
        self.w(pickle.NEWOBJ)
        self.memo()
        if state is not None:
            state()
            self.w(pickle.BUILD)


_MODULES = {"md": ("md", _MD), "fs": ("fs", _FS)}


def _streamable(tensors: Any, objects: Any, version: str) -> bool:
    """Whether :func:`_metadata_stream` writes what the C pickler would: no string that
    could share a memo entry with another by being one object (equal values), no empty
    chunk list, no huge string (written outside the frames), dtypes pickled by name."""
    keys = [t[0] for t in tensors] + [o[0] for o in objects]
    paths = {c[2] for t in tensors for c in t[3]} | {o[1] for o in objects}
    fixed = {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version",
             "properties", "size", "chunks", "offsets", "sizes", "fqn", "index", "offset",
             "relative_path", "length", "torch", "Size", "torch.strided", _MD, _FS, "Metadata",
             "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "BytesStorageMetadata",
             "MetadataIndex", "_StorageInfo", "_MEM_FORMAT_ENCODING", "_get_layout", "torch.serialization",
             *(t[2].__reduce__() for t in tensors)}
    if len(set(keys)) != len(keys) or not {version}.isdisjoint(keys) or version in paths:
        return False
    if not paths.isdisjoint(keys) or not fixed.isdisjoint(keys) or not fixed.isdisjoint(paths):
        return False
    if version in fixed or any(not t[3] for t in tensors):
        return False
    if any(len(s) > 4096 for s in (*keys, *paths, version)):
        return False
    for dtype in {t[2] for t in tensors}:
        name = dtype.__reduce__()
        if not isinstance(name, str) or getattr(torch, name, None) is not dtype:
            return False
    return True


def _metadata_stream(tensors: list[tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...],
                     tuple[int, ...], str, int, int]]]],
                     objects: list[tuple[str, str, int, int]], version: str) -> bytearray:
    """:func:`metadata_bytes`'s bytes, written record by record (see :class:`_Emitter`)."""
    e = _Emitter()
    md, fs = _MODULES["md"], _MODULES["fs"]
    key_memo = array.array("q")
    path_memo: dict[int, int] = {}

    def path(p: str) -> None:
        i = path_memo.get(id(p))
        if i is None:
            path_memo[id(p)] = e.new_str(p)
        else:
            e.get(i)

    def name(s: str) -> None:
        e.fixed_str(s, s)

    def shared(key: str, func: tuple[Any, tuple[Any, str], str], arg: Any) -> None:
        def build() -> None:
            e.global_(*func)
            e.tuple_((arg,), lambda a: e.fixed_str(a, a) if isinstance(a, str) else e.int_(a))
            e.w(pickle.REDUCE)

        e.once(key, build)

    def properties(dtype: torch.dtype) -> None:
        def field(x: Any) -> None:
            if x is False:
                e.save()
                e.w(pickle.NEWFALSE)
            elif x == "layout":
                shared("layout", ("_get_layout", ("torch.serialization", "torch.serialization"),
                                  "_get_layout"), "torch.strided")
            elif x == "contiguous":
                shared("contiguous", ("_MEM_FORMAT_ENCODING", md, "_MEM_FORMAT_ENCODING"), 0)
            else:
                e.global_(x, ("torch/dtype", "torch"), x.__reduce__())
        e.obj("TensorProperties", md, lambda: e.tuple_((dtype, "layout", False, "contiguous", False), field))

    def item(k: Any, v: Any) -> Any:
        def run() -> None:
            k()
            v()
        return run

    def kv(attr: str, save: Any) -> Any:
        return item(lambda: name(attr), save)

    def chunk(off: tuple[int, ...], siz: tuple[int, ...]) -> Any:
        return lambda: e.obj("ChunkStorageMetadata", md, lambda: e.dict_items(2, iter((
            kv("offsets", lambda: e.size(off)), kv("sizes", lambda: e.size(siz))))))

    def chunk_list(chunks: list[Any]) -> None:
        e.save()
        e.w(pickle.EMPTY_LIST)
        e.memo()
        n = len(chunks)
        if n == 1:
            chunk(chunks[0][0], chunks[0][1])()
            e.w(pickle.APPEND)
        else:
            for start in range(0, n, _BATCH):
                e.w(pickle.MARK)
                for c in chunks[start:start + _BATCH]:
                    chunk(c[0], c[1])()
                e.w(pickle.APPENDS)

    def tensor_md(key: str, shape: tuple[int, ...], dtype: torch.dtype, chunks: list[Any]) -> Any:
        def run() -> None:
            key_memo.append(e.new_str(key))
            e.obj("TensorStorageMetadata", md, lambda: e.dict_items(3, iter((
                kv("properties", lambda: properties(dtype)), kv("size", lambda: e.size(shape)),
                kv("chunks", lambda: chunk_list(chunks))))))
        return run

    def object_md(key: str) -> Any:
        def run() -> None:
            key_memo.append(e.new_str(key))
            e.obj("BytesStorageMetadata", md, None)
        return run

    def sd_items() -> Any:
        for key, shape, dtype, chunks in tensors:
            yield tensor_md(key, shape, dtype, chunks)
        for o in objects:
            yield object_md(o[0])

    def planner_items() -> Any:
        for i in key_memo:
            def run(i: int = i) -> None:
                e.get(i)
                e.tuple_((i,), e.get)
            yield run

    def storage_item(k: int, index: int | None, off: tuple[int, ...] | None, p: str, offset: int,
                     length: int) -> Any:
        fields = [kv("fqn", lambda: e.get(k)),
                  kv("index", (lambda: e.int_(index)) if index is not None else none)]
        if off is not None:
            fields.append(kv("offset", lambda: e.size(off)))
        return item(lambda: e.obj("MetadataIndex", md, lambda: e.dict_items(len(fields), iter(fields))),
                    lambda: e.obj("_StorageInfo", fs, lambda: e.dict_items(3, iter((
                        kv("relative_path", lambda: path(p)), kv("offset", lambda: e.int_(offset)),
                        kv("length", lambda: e.int_(length)))))))

    def none() -> None:
        e.save()
        e.w(pickle.NONE)

    def storage_items() -> Any:
        n = 0
        for _, _, _, chunks in tensors:
            k = key_memo[n]
            n += 1
            for i, (off, _, p, offset, length) in enumerate(chunks):
                yield storage_item(k, i, off, p, offset, length)
        for _, p, offset, length in objects:
            yield storage_item(key_memo[n], None, None, p, offset, length)
            n += 1

    n_keys = len(tensors) + len(objects)
    n_storage = sum(len(t[3]) for t in tensors) + len(objects)
    e.obj("Metadata", md, lambda: e.dict_items(5, iter((
        kv("state_dict_metadata", lambda: e.dict_items(n_keys, sd_items())),
        kv("planner_data", lambda: e.dict_items(n_keys, planner_items())),
        kv("storage_data", lambda: e.dict_items(n_storage, storage_items())),
        kv("storage_meta", none),
        kv("version", lambda: e.new_str(version))))))
    e.w(pickle.STOP)
    e.commit()
    return e.out
