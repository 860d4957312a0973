"""A restricted unpickler: pickles become data, never code.

A pickle runs code only through the globals it names, which ``pickle`` resolves with
``find_class``. :class:`SafeUnpickler` answers from an explicit allow-list, refuses the
rest (:class:`~nemo_convert.errors.UnsafePickleError`) and never imports what a pickle
names. It hands out harmless builtins and torch dtypes, immutable tokens, argument-checked
functions, and *stand-ins* that only record pickled state: OmegaConf configs, Lightning's
``AttributeDict``, ``argparse.Namespace``, numpy arrays and dtypes. :func:`to_plain`
turns stand-ins into plain dicts, lists, scalars and numpy arrays. Callers add what their
format needs through ``extra_globals`` (e.g. lazy tensor rebuilders). ``trust=True``
resolves unlisted names normally, running what the pickle asks: callers must warn loudly.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import collections
import io
import math
import pathlib
import pickle
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_convert.errors import InputError, NemoConvertError, UnsafePickleError

TRUST_HINT = "pass --trust-pickle to allow it (only for files you trust)"


# ----------------------------------------------------------------- frozen tokens
class _FrozenMeta(type):
    """Metaclass of stand-ins: a pickle's BUILD opcode cannot set class attributes."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise InputError(f"pickle tries to set attribute {name!r} on class {cls.__name__}")


class _Frozen:
    """Base of the tokens the allow-list hands out; instances are immutable."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, source: str, *values: Any) -> None:
        for k, v in zip(self.__slots__, (source, *values)):
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise InputError(f"pickle tries to set attribute {name!r} on {self!r}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.source}>"  # type: ignore[attr-defined]


class Checked(_Frozen):
    """An allowed callable ``Checked(source, fn)``: our own argument-checking function."""

    __slots__ = ("source", "fn")  # noqa: RUF023 - positional order of __init__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class StorageType(_Frozen):
    """A torch storage class as a token: ``StorageType(source, dtype, untyped)``."""

    __slots__ = ("source", "dtype", "untyped")  # noqa: RUF023 - positional order


class TypeToken(_Frozen):
    """A type a pickle names only as data (``torch.Tensor``, ``typing.Any``)."""

    __slots__ = ("source",)


# --------------------------------------------------------------------- stand-ins
class StandIn(metaclass=_FrozenMeta):
    """Replaces a foreign class (one subclass per global, named by ``source``); instances
    record NEWOBJ/REDUCE ``args``/``kwargs`` and the BUILD ``state``."""

    source: str = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        obj = object.__new__(cls)
        obj.__dict__.update(args=args, kwargs=kwargs, state=None)
        return obj

    def __setstate__(self, state: Any) -> None:
        self.__dict__["state"] = state

    def __repr__(self) -> str:
        return f"<stand-in {self.source}>"


class OmegaContainer(StandIn):
    """``DictConfig``/``ListConfig``: state ``_content`` is nodes, None or a string."""


class OmegaValue(StandIn):
    """An omegaconf value node (``AnyNode``, ``StringNode``, …): state ``_val``."""


class AttrObject(StandIn):
    """An object whose state is its attribute dict (``argparse.Namespace``)."""


class AttributeDictStandIn(dict, metaclass=_FrozenMeta):
    """Lightning's ``AttributeDict``: a dict subclass; its items arrive by SETITEMS."""

    source: str = "?"


def _standin(base: type, source: str) -> type:
    """A new stand-in subclass of ``base`` for the foreign global ``source``."""
    ns = {"source": source, "__module__": __name__}
    return _FrozenMeta(source.rsplit(".", 1)[-1], (base,), ns)


# -------------------------------------------------------------- checked builders
def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for ``bytes``: latin-1 text only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise InputError("pickle calls _codecs.encode with arguments other than (str, 'latin1')")
    return text.encode("latin-1")


def _bytes_like(kind: type) -> Callable[..., Any]:
    def build(data: Any = b"", *encoding: str) -> Any:  # (), (bytes,) or (str, "latin1")
        if not isinstance(data, (bytes, bytearray, list, tuple)) or encoding:
            data = _codecs_encode(data, *encoding)
        return kind(data)

    return build


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    """``copyreg._reconstructor`` (protocol 0/1 objects), for stand-in classes only."""
    if isinstance(cls, type) and issubclass(cls, (StandIn, AttributeDictStandIn)) and (
            base is (dict if issubclass(cls, dict) else object)):
        return cls(state or {}) if base is dict else cls.__new__(cls)
    raise InputError(f"pickle reconstructs {cls!r} (base {base!r}), which is not allowed")


def _torch_size(dims: Any = ()) -> torch.Size:
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) for d in dims):
        raise InputError("pickle builds torch.Size from something other than integers")
    return torch.Size(tuple(dims))


def _torch_device(kind: Any, index: Any = None) -> torch.device:
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise InputError("pickle builds torch.device from unexpected arguments")
    return torch.device(kind) if index is None else torch.device(kind, index)


class NumpyDtype(StandIn):
    """``numpy.dtype(spec)`` (a number, bool or string type); BUILD gives the byte order.

    Real numpy dtypes and arrays are never exposed to the pickle: numpy's own
    ``__setstate__`` trusts its input (a BUILD can mark a dtype as holding objects)."""


class NumpyArray(StandIn):
    """An ndarray; BUILD state ``(version, shape, dtype, fortran, raw bytes)``."""


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy comes with torch wheels
        raise InputError("the pickle holds numpy data; install numpy to read it") from e
    return numpy


def _np_dtype(spec: Any, align: Any = False, copy: Any = False) -> NumpyDtype:
    if not (isinstance(spec, str) and re.fullmatch(r"[biufcSU]\d+", spec)):
        raise InputError(f"pickle holds numpy dtype {spec!r}; only numbers, bools and "
                         "strings are supported")
    return NumpyDtype(spec)


def _real_dtype(token: Any) -> Any:
    state = token.state if isinstance(token, NumpyDtype) else None
    order = state[1] if isinstance(state, tuple) and len(state) > 1 else "|"
    if not isinstance(token, NumpyDtype) or order not in ("<", ">", "|", "="):
        raise InputError(f"pickle holds a malformed numpy dtype {token!r}")
    dtype = _numpy().dtype(token.args[0])
    return dtype.newbyteorder(order) if order in "<>" else dtype


def _np_reconstruct(cls: Any, shape: Any, typecode: Any) -> NumpyArray:
    if cls is not _NDARRAY or shape != (0,) or not isinstance(typecode, bytes):  # as numpy
        raise InputError("pickle reconstructs a numpy array from unexpected arguments")
    return NumpyArray()


def _np_frombuffer(buf: Any, token: Any, shape: Any, order: Any = "C") -> NumpyArray:
    """``numpy._core.numeric._frombuffer``: protocol-5 arrays."""
    if not isinstance(buf, (bytes, bytearray, pickle.PickleBuffer)):
        raise InputError("pickle builds a numpy array from a non-buffer")
    array = NumpyArray()
    array.__setstate__((1, shape, token, order == "F", bytes(memoryview(buf))))
    return array


def _real_array(array: NumpyArray) -> Any:
    state = array.state
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], tuple)
            and all(isinstance(d, int) and d >= 0 for d in state[1])):
        raise InputError("pickle holds a malformed numpy array")
    _, shape, token, fortran, raw = state
    dtype = _real_dtype(token)
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != dtype.itemsize * math.prod(shape):
        raise InputError(f"pickle holds a numpy array of shape {shape} with the wrong byte count")
    flat = _numpy().frombuffer(bytearray(raw), dtype)
    return flat.reshape(shape, order="F" if fortran else "C")


def _np_scalar(token: Any, data: Any = None) -> Any:
    dtype = _real_dtype(token)
    if not (isinstance(data, bytes) and len(data) == dtype.itemsize):
        raise InputError("pickle builds a numpy scalar from malformed bytes")
    return _numpy().frombuffer(data, dtype)[0]


# -------------------------------------------------------------------- allow-list
_NDARRAY = TypeToken("numpy.ndarray")  # only _np_reconstruct accepts it
_STORAGE_TYPES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
}
_OMEGA_NODES = ("ValueNode", "AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode",
                "BytesNode", "PathNode", "NoneNode", "LiteralNode", "EnumNode",
                "InterpolationResultNode")
_ATTRIBUTE_DICTS = ("pytorch_lightning.utilities.parsing", "lightning.fabric.utilities.data",
                    "lightning.pytorch.utilities.parsing", "lightning_fabric.utilities.data")


def _base_globals() -> dict[str, Any]:
    """The allow-list: dotted name → what the pickle gets."""
    g: dict[str, Any] = {}
    for name in ("set", "frozenset", "slice", "complex", "dict", "list", "tuple", "int",
                 "float", "str", "bool", "object"):  # no range: list(range(10**12))
        g[f"builtins.{name}"] = getattr(builtins, name)
    g["builtins.bytes"] = Checked("builtins.bytes", _bytes_like(bytes))
    g["builtins.bytearray"] = Checked("builtins.bytearray", _bytes_like(bytearray))
    g["_codecs.encode"] = Checked("_codecs.encode", _codecs_encode)
    g["copyreg._reconstructor"] = Checked("copyreg._reconstructor", _reconstructor)
    g["collections.OrderedDict"] = collections.OrderedDict
    g["collections.defaultdict"] = collections.defaultdict
    g["_io.BytesIO"] = g["io.BytesIO"] = io.BytesIO  # Transformer-Engine _extra_state
    for name in ("Any", "Dict", "List", "Tuple", "Optional", "Union"):
        g[f"typing.{name}"] = TypeToken(f"typing.{name}")
    posix = Checked("pathlib.PurePosixPath", pathlib.PurePosixPath)  # pure: no file access
    windows = Checked("pathlib.PureWindowsPath", pathlib.PureWindowsPath)
    for name in ("Path", "PosixPath", "PurePosixPath", "PurePath"):
        g[f"pathlib.{name}"] = posix
    g["pathlib.WindowsPath"] = g["pathlib.PureWindowsPath"] = windows
    g["argparse.Namespace"] = _standin(AttrObject, "argparse.Namespace")
    for module in _ATTRIBUTE_DICTS:
        g[f"{module}.AttributeDict"] = _standin(AttributeDictStandIn, f"{module}.AttributeDict")
    for src, base in (("omegaconf.dictconfig.DictConfig", OmegaContainer),
                      ("omegaconf.listconfig.ListConfig", OmegaContainer),
                      ("omegaconf.base.Metadata", StandIn),  # node types and flags
                      ("omegaconf.base.ContainerMetadata", StandIn),
                      *((f"omegaconf.nodes.{n}", OmegaValue) for n in _OMEGA_NODES)):
        g[src] = _standin(base, src)
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            g[f"torch.{name}"] = value
    g["torch.Size"] = Checked("torch.Size", _torch_size)
    g["torch.device"] = Checked("torch.device", _torch_device)
    g["torch.strided"] = torch.strided
    for name, dtype in _STORAGE_TYPES.items():
        g[f"torch.{name}"] = g[f"torch.cuda.{name}"] = StorageType(f"torch.{name}", dtype, False)
    for src in ("torch.UntypedStorage", "torch.storage.UntypedStorage",
                "torch.TypedStorage", "torch.storage.TypedStorage"):
        g[src] = StorageType(src, torch.uint8, True)
    for src in ("torch.Tensor", "torch._tensor.Tensor", "torch.nn.Parameter",
                "torch.nn.parameter.Parameter"):
        g[src] = TypeToken(src)
    for core in ("numpy.core.multiarray", "numpy._core.multiarray"):
        g[f"{core}._reconstruct"] = Checked(f"{core}._reconstruct", _np_reconstruct)
        g[f"{core}.scalar"] = Checked(f"{core}.scalar", _np_scalar)
    for numeric in ("numpy.core.numeric", "numpy._core.numeric"):
        g[f"{numeric}._frombuffer"] = Checked(f"{numeric}._frombuffer", _np_frombuffer)
    g["numpy.ndarray"] = _NDARRAY
    g["numpy.dtype"] = Checked("numpy.dtype", _np_dtype)
    return g


_BASE_GLOBALS = _base_globals()


# --------------------------------------------------------------------- unpickler
class SafeUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` resolving globals only from the allow-list. ``extra_globals``
    maps ``"module.name"`` to more immutable objects to hand out (e.g. :class:`Checked`);
    ``persistent_load`` answers persistent ids; ``where`` names the input in errors."""

    def __init__(self, file: typing.BinaryIO, *, trust: bool = False,
                 extra_globals: Mapping[str, Any] | None = None,
                 persistent_load: Callable[[Any], Any] | None = None,
                 where: str = "pickle") -> None:
        super().__init__(file)
        self._trust = trust
        self._globals = {**_BASE_GLOBALS, **(extra_globals or {})}
        self._persistent = persistent_load
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        # Protocol-2 pickles write Python-2 names (``__builtin__.long``): map them.
        mod3, name3 = _compat_pickle.NAME_MAPPING.get(
            (module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name))
        full = f"{mod3}.{name3}"
        if full in self._globals:
            return self._globals[full]
        if self._trust:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"{self._where}: nemo-convert refuses to load global '{full}' from the pickle "
            f"(it is not on the allow-list of data-only types); {TRUST_HINT}"
        )

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise InputError(f"{self._where}: the pickle refers to external data ({pid!r})")
        return self._persistent(pid)


def safe_load(file: typing.BinaryIO, *, trust: bool = False,
              extra_globals: Mapping[str, Any] | None = None,
              persistent_load: Callable[[Any], Any] | None = None,
              where: str = "pickle") -> Any:
    """Unpickle ``file`` with :class:`SafeUnpickler`; malformed pickles raise InputError."""
    unpickler = SafeUnpickler(file, trust=trust, extra_globals=extra_globals,
                              persistent_load=persistent_load, where=where)
    try:
        return unpickler.load()
    except NemoConvertError:
        raise
    except Exception as e:  # anything else a malformed pickle provokes
        raise InputError(f"{where}: corrupt or unsupported pickle: {type(e).__name__}: {e}") from e


def safe_load_pickle_bytes(data: bytes, *, trust: bool = False,
                           extra_globals: Mapping[str, Any] | None = None,
                           plain: bool = True) -> Any:
    """Unpickle a plain (non-torch-zip) pickle safely; with ``plain``, apply :func:`to_plain`."""
    obj = safe_load(io.BytesIO(data), trust=trust, extra_globals=extra_globals)
    return to_plain(obj) if plain else obj


# ---------------------------------------------------------------------- to_plain
_SCALARS = (str, bytes, int, float, bool, complex, type(None))


def to_plain(obj: Any) -> Any:
    """Stand-ins → plain data: configs → dicts/lists/scalars, dict subclasses → ``dict``,
    paths → ``str``, stand-in classes → their dotted name. OmegaConf interpolations and
    ``"???"`` stay strings (as ``OmegaConf.to_container(resolve=False)``). Tensors, arrays
    and other objects are kept as they are; shared and cyclic references are preserved."""
    try:
        return _plain(obj, {})
    except (TypeError, RecursionError) as e:  # e.g. an array as a dict key; deep nesting
        raise InputError(f"pickle holds data that cannot be made plain: {e}") from e


def _plain(obj: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, _SCALARS):
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, type) and issubclass(obj, (StandIn, AttributeDictStandIn)):
        return obj.source
    if isinstance(obj, OmegaContainer):
        obj_content = _state_get(obj, "_content", "content")
        if isinstance(obj_content, (dict, list, tuple)):
            return _plain_container(obj, obj_content, memo)
        result = obj_content  # None, "???" or an interpolation string
    elif isinstance(obj, NumpyArray):
        result = _real_array(obj)
    elif isinstance(obj, NumpyDtype):
        result = _real_dtype(obj)
    elif isinstance(obj, OmegaValue):
        result = _plain(_state_get(obj, "_val", "val"), memo)
    elif isinstance(obj, AttrObject):
        return _plain_container(obj, obj.state if isinstance(obj.state, dict) else obj.kwargs, memo)
    elif isinstance(obj, (dict, list)):
        return _plain_container(obj, obj, memo)
    elif type(obj) is tuple:
        result = tuple(_plain(v, memo) for v in obj)
    elif isinstance(obj, (set, frozenset)):
        result = type(obj)(_plain(v, memo) for v in obj)
    elif isinstance(obj, pathlib.PurePath):
        result = str(obj)
    else:
        result = obj
    memo[id(obj)] = result
    return result


def _plain_container(key_obj: Any, content: Any, memo: dict[int, Any]) -> Any:
    """A plain dict/list for ``content``, memoized before its children (cycles end)."""
    if isinstance(content, dict):
        out: Any = {}
        memo[id(key_obj)] = out
        for k, v in content.items():
            out[_plain(k, memo)] = _plain(v, memo)
        return out
    out = []
    memo[id(key_obj)] = out
    out.extend(_plain(v, memo) for v in content)
    return out


def _state_get(obj: StandIn, *names: str) -> Any:
    """Field ``names[0]`` (or a fallback name) of a stand-in's pickled state dict."""
    state = obj.state if isinstance(obj.state, dict) else {}
    return next((state[n] for n in names if n in state), None)
