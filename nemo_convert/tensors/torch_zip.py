"""Read ``torch.save`` zip archives in place: lazily, safely, without extracting.

A ``torch.save`` file (torch ≥ 1.6) is a zip archive whose members are STORED
(uncompressed): ``<name>/data.pkl`` pickles the object tree and refers to each tensor's
storage by key through persistent ids; the bytes of storage ``k`` are member
``<name>/data/k``. This module reads the zip directory from a :class:`ByteRegion` (a
whole file, or a member of an uncompressed tar such as a ``.nemo``), unpickles
``data.pkl`` with the restricted unpickler and turns every tensor into a
:class:`LazyTensor`: shape, dtype, stride and storage offset, read only on
:meth:`LazyTensor.load`, which returns a view on a copy-on-write memory map of the file.
"""

from __future__ import annotations

import io
import math
import sys
import threading
import weakref
import zipfile
import zlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import ByteRegion, FileMap, TensorInfo, dtype_name, dtype_size, torch_dtype
from nemo_convert.tensors.safe_unpickle import (
    Checked,
    StorageType,
    TypeToken,
    safe_load,
    to_plain,
)
from nemo_convert.tensors.zip_directory import LOCAL_HEADER, read_directory

if TYPE_CHECKING:
    import torch

@dataclass(frozen=True, eq=False)
class StorageRef:
    """One storage of the archive: member ``<name>/data/<key>``, ``nbytes`` long."""

    key: str
    dtype: str  # the storage's element type, torch's name for it ("uint8" for untyped storages)
    nbytes: int
    location: str  # the device it was saved from ("cpu", "cuda:0"); ignored on load
    archive: _Archive = field(repr=False)


@dataclass(frozen=True, eq=False)
class LazyTensor:
    """A tensor of a torch archive, described but not read.

    ``storage_offset`` and ``stride`` count elements of ``dtype``, as in torch.
    ``requires_grad`` and ``is_parameter`` are recorded but not applied by :meth:`load`.
    The dtype is kept by name (no torch needed to describe a tensor); :attr:`dtype` is
    torch's.
    """

    storage: StorageRef
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype_name: str
    requires_grad: bool = False
    is_parameter: bool = False
    metadata: dict[str, Any] | None = None  # conj/neg bits, as torch records them

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_name)

    @property
    def storage_key(self) -> str:
        return self.storage.key

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def info(self, name: str = "") -> TensorInfo:
        return TensorInfo(name=name, shape=self.shape, dtype=self.dtype_name)

    def is_contiguous(self) -> bool:
        expected = 1
        for size, step in reversed(list(zip(self.shape, self.stride))):
            if size != 1 and step != expected:
                return False
            expected *= size
        return True

    def load(self) -> torch.Tensor:
        """The tensor as a view on the file's memory map (no copy). Do not modify it.

        A tensor saved with a conj/neg bit is the rare exception: it is materialized, so
        that its bytes always mean what its values say."""
        import torch
        flat = self.storage.archive.storage_view(self.storage, self.dtype_name)
        start = flat.storage_offset() + self.storage_offset
        tensor = flat.as_strided(self.shape, self.stride, start)
        if self.metadata:
            torch._utils.set_tensor_metadata(tensor, self.metadata)
            tensor = tensor.resolve_conj().resolve_neg()
        return tensor


# ------------------------------------------------------------------------ rebuilders
def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in value):
        raise InputError(f"torch pickle has a malformed tensor {what}: {value!r}")
    return tuple(value)


def _pickled_dtype(value: Any) -> str | None:
    """The name of a torch dtype a pickle passed (it got it from the allow-list, which
    imported torch to hand it out), or None when ``value`` is not one."""
    torch = sys.modules.get("torch")
    return dtype_name(value) if torch is not None and isinstance(value, torch.dtype) else None


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None,
            requires_grad: Any = False, metadata: Any = None) -> LazyTensor:
    if not isinstance(storage, StorageRef) or dtype is None:
        raise InputError(f"torch pickle rebuilds a tensor from {storage!r}, not a storage")
    shape, strides = _ints(size, "size"), _ints(stride, "stride")
    (offset,) = _ints((offset,), "storage offset")
    flags_ok = metadata is None or isinstance(metadata, dict) and all(
        k in ("conj", "neg") and isinstance(v, bool) for k, v in metadata.items())
    if len(shape) != len(strides) or not flags_ok:
        raise InputError(f"torch pickle has a malformed tensor (size {shape}, stride {strides}, "
                         f"flags {metadata!r})")
    if math.prod(shape) >= 2**62:
        raise InputError(f"torch pickle has a tensor of absurd size {shape}")
    lazy = LazyTensor(storage, offset, shape, strides, dtype, bool(requires_grad), False,
                      dict(metadata) if metadata else None)
    if lazy.numel:
        last = offset + sum((s - 1) * st for s, st in zip(shape, strides))
        if (last + 1) * dtype_size(dtype) > storage.nbytes:
            raise InputError(
                f"{storage.archive.where}: a tensor of shape {shape} reads past the end of "
                f"storage {storage.key} ({storage.nbytes} bytes)")
    return lazy


def _storage_dtype(storage: Any) -> str | None:
    return storage.dtype if isinstance(storage, StorageRef) else None


def _rebuild_v1(storage: Any, offset: Any, size: Any, stride: Any) -> LazyTensor:
    return _tensor(storage, offset, size, stride, _storage_dtype(storage))


def _rebuild_v2(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                backward_hooks: Any = None, metadata: Any = None) -> LazyTensor:
    return _tensor(storage, offset, size, stride, _storage_dtype(storage), requires_grad, metadata)


def _rebuild_v3(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                backward_hooks: Any, dtype: Any, metadata: Any = None) -> LazyTensor:
    return _tensor(storage, offset, size, stride, _pickled_dtype(dtype), requires_grad, metadata)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any,
                       state: Any = None) -> LazyTensor:
    if not isinstance(data, LazyTensor):
        raise InputError("torch pickle rebuilds a Parameter from a non-tensor")
    return replace(data, requires_grad=bool(requires_grad), is_parameter=True)


_PARAMETER_TYPES = ("torch.nn.Parameter", "torch.nn.parameter.Parameter")
_TENSOR_TYPES = ("torch.Tensor", "torch._tensor.Tensor", *_PARAMETER_TYPES)


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> LazyTensor:
    """A tensor (subclass) with Python attributes: the attributes are dropped."""
    if not (isinstance(func, Checked) and func.source in _REBUILDERS and isinstance(args, tuple)):
        raise InputError(f"torch pickle rebuilds a tensor through {func!r}")
    if not (isinstance(new_type, TypeToken) and new_type.source in _TENSOR_TYPES):
        raise InputError(f"torch pickle holds a tensor subclass {new_type!r}; not supported")
    return replace(func(*args), is_parameter=new_type.source in _PARAMETER_TYPES)


def _unsupported(kind: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise InputError(f"the torch file holds a {kind} tensor; nemo-convert reads only "
                         "dense CPU-loadable tensors")

    return refuse


_REBUILDERS = {
    "torch._utils._rebuild_tensor": _rebuild_v1,
    "torch._utils._rebuild_tensor_v2": _rebuild_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
}
_TORCH_GLOBALS: dict[str, Any] = {name: Checked(name, fn) for name, fn in _REBUILDERS.items()}
_TORCH_GLOBALS["torch._tensor._rebuild_from_type_v2"] = Checked(
    "torch._tensor._rebuild_from_type_v2", _rebuild_from_type_v2)
for _name, _kind in (("qtensor", "quantized"), ("sparse_tensor", "sparse"),
                     ("nested_tensor", "nested"), ("wrapper_subclass", "wrapper-subclass"),
                     ("meta_tensor_no_storage", "meta"),
                     ("device_tensor_from_numpy", "device (numpy)"),
                     ("device_tensor_from_cpu_tensor", "device")):
    _TORCH_GLOBALS[f"torch._utils._rebuild_{_name}"] = Checked(
        f"torch._utils._rebuild_{_name}", _unsupported(_kind))


# -------------------------------------------------------------------------- archive
class _Archive:
    """The zip directory of one torch archive and, once needed, a map of its file."""

    def __init__(self, region: ByteRegion, mapped: memoryview | None = None) -> None:
        """``mapped``: the region's bytes, where the caller has the file mapped already (a
        dist checkpoint's chunks): the zip directory is then read from memory, without
        :mod:`zipfile` when it has the plain layout
        :func:`~nemo_convert.tensors.zip_directory.read_directory` reads."""
        self.region = region
        self.where = region.path + (f" (member at byte {region.offset})" if region.offset else "")
        self._lock = threading.Lock()
        self._map: FileMap | None = None
        # weak: each StorageRef holds its archive, and a strong cache would make every
        # archive a reference cycle, freed only by the cyclic collector, which conversions
        # pause (convert/common.py gc_paused): its file map would stay mapped until then
        self._storages: weakref.WeakValueDictionary[str, StorageRef] = weakref.WeakValueDictionary()
        self._data_offsets: dict[str, int] = {}
        self._mapped = mapped
        self.members: dict[str, Any] = {}  # zipfile.ZipInfo, or ZipMember (the same attributes)
        self._check_magic()
        if mapped is not None and self._read_mapped(mapped):
            return
        with region.open() as f:
            try:
                with zipfile.ZipFile(f) as zf:  # type: ignore[arg-type]
                    self.members = {i.filename: i for i in zf.infolist()}
                    self.prefix = self._find_prefix()
                    self.data_pkl = zf.read(self.prefix + "data.pkl")
                    order = self.members.get(self.prefix + "byteorder")
                    byteorder = zf.read(order).decode("ascii", "replace") if order else None
            except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, zlib.error,
                    EOFError, ValueError, RuntimeError) as e:  # RuntimeError: "encrypted"
                raise InputError(f"{self.where}: corrupt torch zip archive: {e}") from e
        if byteorder not in (None, sys.byteorder):
            raise InputError(f"{self.where}: tensors are stored {byteorder}-endian; only "
                             f"{sys.byteorder}-endian torch files are supported")

    def _read_mapped(self, buf: memoryview) -> bool:
        """The directory, ``data.pkl`` and ``byteorder`` from memory (see
        :func:`~nemo_convert.tensors.zip_directory.read_directory`),
        with :mod:`zipfile`'s checks: the local header names the member, the bytes are
        STORED, unencrypted and match their CRC-32. False: read it with :mod:`zipfile`."""
        members = read_directory(buf)
        if members is None:
            return False
        self.members = members
        self.prefix = self._find_prefix()
        got: list[bytes | None] = []
        for name in (self.prefix + "data.pkl", self.prefix + "byteorder"):
            m = members.get(name)
            if m is None:
                got.append(None)
                continue
            if m.compress_type != zipfile.ZIP_STORED or m.flag_bits & 0x1 or m.compress_size != m.file_size:
                return False
            sig, name_len, extra_len = LOCAL_HEADER.unpack_from(buf, m.header_offset)
            start = m.header_offset + LOCAL_HEADER.size
            if sig != b"PK\x03\x04" or bytes(buf[start:start + name_len]) != name.encode():
                return False
            start += name_len + extra_len
            if start + m.file_size > m.end:  # overlapping entries: zipfile names the problem
                return False
            data = bytes(buf[start:start + m.file_size])
            if zlib.crc32(data) != m.CRC:
                return False
            got.append(data)
        if got[0] is None:
            return False
        self.data_pkl = got[0]
        byteorder = got[1].decode("ascii", "replace") if got[1] is not None else None
        if byteorder not in (None, sys.byteorder):
            raise InputError(f"{self.where}: tensors are stored {byteorder}-endian; only "
                             f"{sys.byteorder}-endian torch files are supported")
        return True

    def _check_magic(self) -> None:
        if self._mapped is not None:
            head = bytes(self._mapped[:512])
        else:
            head = self.region.read(0, min(self.region.length, 512))
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            return
        if head[:1] == b"\x80":
            raise InputError(
                f"{self.where}: this is the legacy (non-zip, torch < 1.6 or "
                "_use_new_zipfile_serialization=False) torch.save format, which nemo-convert "
                "does not support; re-save it with a current torch.save")
        if head[257:262] == b"ustar":
            raise InputError(f"{self.where}: this is a tar archive, not a torch.save zip file")
        raise InputError(f"{self.where}: not a torch.save zip archive")

    def _find_prefix(self) -> str:
        candidates = [n for n in self.members
                      if n == "data.pkl" or (n.endswith("/data.pkl") and n.count("/") == 1)]
        if not candidates:
            raise InputError(f"{self.where}: zip archive without data.pkl: not a torch.save "
                             "file (TorchScript archives are not supported)")
        first = min(candidates, key=lambda n: self.members[n].header_offset)
        return first[: -len("data.pkl")]

    def persistent_load(self, pid: Any) -> StorageRef:
        """Answers ``("storage", storage_type, key, location, numel)`` ids."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise InputError(f"{self.where}: unknown persistent id in the torch pickle: {pid!r}")
        _, stype, key, location, numel = pid
        if not (isinstance(stype, StorageType) and isinstance(key, str)
                and isinstance(numel, int) and numel >= 0):
            raise InputError(f"{self.where}: malformed storage id in the torch pickle: {pid!r}")
        return self.storage(key, stype.dtype, numel, str(location))

    def storage(self, key: str, dtype: str, numel: int, location: str) -> StorageRef:
        """Storage ``key`` of ``numel`` elements of ``dtype``, checked against the archive."""
        ref = self._storages.get(key)
        if ref is not None:
            if ref.dtype != dtype:
                raise InputError(f"{self.where}: storage {key} is used with two element types")
            return ref
        info = self.members.get(f"{self.prefix}data/{key}")
        if info is None:
            raise InputError(f"{self.where}: storage {key} is missing from the archive")
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise InputError(f"{self.where}: storage {key} is compressed or encrypted; only "
                             "uncompressed (STORED) torch archives can be read in place")
        nbytes = numel * dtype_size(dtype)
        if info.file_size < nbytes:
            raise InputError(f"{self.where}: storage {key} has {info.file_size} bytes, "
                             f"needs {nbytes}")
        ref = self._storages[key] = StorageRef(key, dtype, nbytes, location, self)
        return ref

    def _data_offset(self, key: str) -> int:
        """Offset of storage ``key``'s bytes in the region, from its local zip header."""
        if key not in self._data_offsets:
            info = self.members[f"{self.prefix}data/{key}"]
            sig, name_len, extra_len = b"", 0, 0
            if 0 <= info.header_offset <= self.region.length - LOCAL_HEADER.size:
                if self._mapped is not None:
                    sig, name_len, extra_len = LOCAL_HEADER.unpack_from(self._mapped, info.header_offset)
                else:
                    sig, name_len, extra_len = LOCAL_HEADER.unpack(
                        self.region.read(info.header_offset, LOCAL_HEADER.size))
            if sig != b"PK\x03\x04":
                raise InputError(f"{self.where}: bad zip header for storage {key}")
            start = info.header_offset + LOCAL_HEADER.size + name_len + extra_len
            if start + info.file_size > self.region.length:
                raise InputError(f"{self.where}: storage {key} runs past the end of the archive")
            self._data_offsets[key] = start
        return self._data_offsets[key]

    def storage_view(self, ref: StorageRef, dtype: torch.dtype | str) -> torch.Tensor:
        """The whole storage as a flat tensor of ``dtype`` on the file's memory map (whose
        writers may reuse the record's stored CRC: :mod:`~nemo_convert.tensors.file_map`)."""
        with self._lock:
            offset, nbytes, crc = self.stored_range(ref)
            if self._map is None:
                self._map = FileMap(self.region.path)
            fmap = self._map
        if crc is not None:
            fmap.note_checksum(offset, nbytes, crc)
        return fmap.tensor(offset, (nbytes // dtype_size(dtype),), torch_dtype(dtype))

    def stored_range(self, ref: StorageRef) -> tuple[int, int, int | None]:
        """Storage ``ref``'s bytes: absolute offset in the file, length, and the record's
        stored CRC-32 (None when the storage is shorter than its record)."""
        info = self.members[f"{self.prefix}data/{ref.key}"]
        crc = info.CRC if ref.nbytes == info.file_size else None
        return self.region.offset + self._data_offset(ref.key), ref.nbytes, crc

    def close(self) -> None:
        with self._lock:
            if self._map is not None:
                self._map.close()
                self._map = None


def load_archive(region: ByteRegion, trust_pickle: bool, mapped: memoryview | None = None) -> tuple[Any, _Archive]:
    """:func:`read_torch_zip`'s object tree, and the archive that keeps its file map."""
    archive = _Archive(region, mapped)
    obj = safe_load(io.BytesIO(archive.data_pkl), trust=trust_pickle,
                    extra_globals=_TORCH_GLOBALS, persistent_load=archive.persistent_load,
                    where=archive.where)
    return to_plain(obj), archive


#: ``data.pkl`` of a one-tensor archive → what its unpickling gave, minus the archive:
#: (storage key, storage dtype name, numel, location, storage offset, shape, stride, dtype
#: name, requires_grad). See :func:`read_tensor_archive`.
_ONE_TENSOR: dict[bytes, tuple[str, str, int, str, int, tuple[int, ...], tuple[int, ...], str, bool]] = {}


def read_tensor_archive(region: ByteRegion, mapped: memoryview | None = None) -> Any:
    """:func:`read_torch_zip` of an archive that usually holds one plain tensor (a dist
    checkpoint's chunk; ``mapped``: its bytes, where the caller has the file mapped). Every
    chunk of one shape and dtype has the same ``data.pkl``: it is unpickled (restricted,
    checked) once per process, and for each later archive only the storage it names is
    looked up and checked in that archive, as unpickling would."""
    archive = _Archive(region, mapped)
    got = _ONE_TENSOR.get(archive.data_pkl)
    if got is not None:
        key, sdtype, numel, location, offset, shape, stride, dtype, grad = got
        return LazyTensor(archive.storage(key, sdtype, numel, location), offset, shape, stride, dtype, grad)
    obj = to_plain(safe_load(io.BytesIO(archive.data_pkl), extra_globals=_TORCH_GLOBALS,
                             persistent_load=archive.persistent_load, where=archive.where))
    if isinstance(obj, LazyTensor) and not obj.metadata and not obj.is_parameter and len(archive._storages) == 1:
        ref = obj.storage
        if len(_ONE_TENSOR) >= 4096:
            _ONE_TENSOR.clear()
        _ONE_TENSOR[archive.data_pkl] = (ref.key, ref.dtype, ref.nbytes // dtype_size(ref.dtype), ref.location,
                                         obj.storage_offset, obj.shape, obj.stride, obj.dtype_name, obj.requires_grad)
    return obj


def read_torch_zip(region: ByteRegion, *, trust_pickle: bool = False) -> Any:
    """The object tree of a ``torch.save`` archive: tensors are :class:`LazyTensor`,
    configs (OmegaConf, AttributeDict, Namespace, OrderedDict) are plain dicts/lists.
    The tensors keep the file's map alive; nothing else needs closing."""
    return load_archive(region, trust_pickle)[0]


__all__ = ["LazyTensor", "StorageRef", "load_archive", "read_tensor_archive", "read_torch_zip"]
