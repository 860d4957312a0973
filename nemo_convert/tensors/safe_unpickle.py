"""A restricted unpickler: pickles become data, never code.

A pickle runs code only through the globals it names, which ``pickle`` resolves with
``find_class``. :class:`SafeUnpickler` answers from an explicit allow-list, refuses the
rest (:class:`~nemo_convert.errors.UnsafePickleError`) and never imports what a pickle
names. It hands out harmless builtins and torch dtypes, immutable tokens, argument-checked
functions, and *stand-ins* that only record pickled state: OmegaConf configs, Lightning's
``AttributeDict``, ``argparse.Namespace``, the enums Megatron-LM puts in its ``args``
(:data:`~nemo_convert.tensors.pickle_standins.MEGATRON_ENUMS`), numpy arrays and dtypes. :func:`to_plain`
turns stand-ins into plain dicts, lists, scalars and numpy arrays. Callers add what their
format needs through ``extra_globals`` (e.g. lazy tensor rebuilders). ``trust=True``
resolves unlisted names normally, running what the pickle asks: callers must warn loudly.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import collections
import io
import pathlib
import pickle
import typing
from collections.abc import Callable, Mapping
from typing import Any

from nemo_convert.errors import InputError, NemoConvertError, UnsafePickleError
from nemo_convert.tensors.base import is_dtype_name
from nemo_convert.tensors.pickle_standins import (  # noqa: F401  (re-exported)
    AttrObject,
    AttributeDictStandIn,
    Checked,
    EnumStandIn,
    MEGATRON_ENUMS,
    NumpyArray,
    NumpyDtype,
    OmegaContainer,
    OmegaValue,
    StandIn,
    StorageType,
    TypeToken,
    _Frozen,
    _FrozenMeta,
    _bytes_like,
    _codecs_encode,
    _np_dtype,
    _np_frombuffer,
    _np_reconstruct,
    _np_scalar,
    _numpy,
    _real_array,
    _real_dtype,
    _reconstructor,
    _standin,
    enum_standin,
    _torch_device,
    _torch_size,
    TRUST_HINT,
    _NDARRAY,
)


# -------------------------------------------------------------------- allow-list
#: torch's typed storage classes → the name of their element dtype.
_STORAGE_TYPES: dict[str, str] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
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
    for src, names in MEGATRON_ENUMS.items():  # Megatron-LM's args: inert members, no Megatron code
        g[src] = enum_standin(src, names)
    for module in _ATTRIBUTE_DICTS:
        g[f"{module}.AttributeDict"] = _standin(AttributeDictStandIn, f"{module}.AttributeDict")
    for src, base in (("omegaconf.dictconfig.DictConfig", OmegaContainer),
                      ("omegaconf.listconfig.ListConfig", OmegaContainer),
                      ("omegaconf.base.Metadata", StandIn),  # node types and flags
                      ("omegaconf.base.ContainerMetadata", StandIn),
                      *((f"omegaconf.nodes.{n}", OmegaValue) for n in _OMEGA_NODES)):
        g[src] = _standin(base, src)
    # torch's dtypes and torch.strided: torch's own objects, from _torch_global (on demand)
    g["torch.Size"] = Checked("torch.Size", _torch_size)
    g["torch.device"] = Checked("torch.device", _torch_device)
    for name, dtype in _STORAGE_TYPES.items():
        g[f"torch.{name}"] = g[f"torch.cuda.{name}"] = StorageType(f"torch.{name}", dtype, False)
    for src in ("torch.UntypedStorage", "torch.storage.UntypedStorage",
                "torch.TypedStorage", "torch.storage.TypedStorage"):
        g[src] = StorageType(src, "uint8", True)
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


def _torch_global(full: str) -> Any:
    """``torch.<dtype>`` (every dtype of torch) and ``torch.strided``: torch's own objects,
    immutable. They are looked up (importing torch) only when a pickle names one, so that
    reading a checkpoint whose pickles name none — ``torch.save`` files name storage
    classes, not dtypes — does not load torch. None for any other name."""
    module, _, name = full.rpartition(".")
    if module != "torch" or not (name == "strided" or is_dtype_name(name)):
        return None
    import torch

    return getattr(torch, name)


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
        found = _torch_global(full)
        if found is not None:
            return found
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
    elif isinstance(obj, EnumStandIn):
        result = obj.plain()
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
