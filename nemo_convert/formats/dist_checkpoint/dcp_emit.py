"""The DCP ``.metadata`` pickle written record by record (:func:`metadata_stream`).

:mod:`nemo_convert.formats.dist_checkpoint.dcp_pickle` builds the same bytes by the C
pickler over look-alike classes (and by the pure-Python pickler over stand-ins); it calls
:func:`streamable` / :func:`metadata_stream` where they apply and tests compare the three.
"""

from __future__ import annotations

import array
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: ``(key, global shape, dtype, chunks)`` per tensor; a chunk ``(offsets, sizes, relative
#: path, byte offset, byte length)``, in ``offsets`` order
Tensors = Sequence[tuple[str, tuple[int, ...], Any, Sequence[tuple[Any, ...]]]]

MD = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


# The streaming path: the same opcodes written record by record, without the object graph.
# Building the look-alike graph and running the C pickler over it holds, at its peak, every
# record's objects plus the pickler's memo (which keeps each memoised object alive): ~2 KiB
# per tensor. The bytes of that graph follow a fixed grammar, so :class:`_Emitter` writes
# them directly — the memo indices, the dict and list batches of 1000, the frames of
# 64 KiB — holding only the memo indices of the key strings. ``tests/test_distckpt.py``
# checks it against :func:`~nemo_convert.formats.dist_checkpoint.dcp_pickle.metadata_bytes`'s C-pickler bytes (which it checks against
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

    def __init__(self, write: Callable[[bytearray], Any] | None = None) -> None:
        self.out = bytearray(pickle.PROTO + bytes((pickle.DEFAULT_PROTOCOL,)))
        self.write = write  # given: each committed frame goes there, not kept
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
            if self.write is not None:
                self.write(self.out)
                self.out = bytearray()
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


_MODULES = {"md": ("md", MD), "fs": ("fs", FS)}


def streamable(tensors: Any, objects: Any, version: str) -> bool:
    """Whether :func:`metadata_stream` writes what the C pickler would: no string that
    could share a memo entry with another by being one object (equal values), no empty
    chunk list, no huge string (written outside the frames), dtypes pickled by name."""
    keys = [t[0] for t in tensors] + [o[0] for o in objects]
    paths = {c[2] for t in tensors for c in t[3]} | {o[1] for o in objects}
    fixed = {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version",
             "properties", "size", "chunks", "offsets", "sizes", "fqn", "index", "offset",
             "relative_path", "length", "torch", "Size", "torch.strided", MD, FS, "Metadata",
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


def metadata_stream(tensors: Tensors, objects: Sequence[tuple[str, str, int, int]], version: str,
                    write: Callable[[bytearray], Any] | None = None) -> bytearray:
    """:func:`~nemo_convert.formats.dist_checkpoint.dcp_pickle.metadata_bytes`'s bytes,
    written record by record (see :class:`_Emitter`). With ``write``, every frame but the
    last is passed to it as it is done (64 KiB at a time, not the whole pickle in memory:
    ~0.2 KiB per tensor) and the rest is returned."""
    e = _Emitter(write)
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

    def chunk_list(chunks: Sequence[Any]) -> None:
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

    def tensor_md(key: str, shape: tuple[int, ...], dtype: torch.dtype, chunks: Sequence[Any]) -> Any:
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
