"""Inert stand-ins the safe unpickler hands to a pickle instead of real classes:
frozen tokens, OmegaConf/Lightning containers and numpy arrays rebuilt from bytes."""

from __future__ import annotations
import math
import pickle
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from nemo_convert.errors import InputError

if TYPE_CHECKING:
    import torch

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
    if TYPE_CHECKING:  # the slots' types (set by _Frozen.__init__)
        source: str
        fn: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class StorageType(_Frozen):
    """A torch storage class as a token: ``StorageType(source, dtype, untyped)``."""

    __slots__ = ("source", "dtype", "untyped")  # noqa: RUF023 - positional order
    if TYPE_CHECKING:
        source: str
        dtype: str  # torch's dtype name
        untyped: bool


class TypeToken(_Frozen):
    """A type a pickle names only as data (``torch.Tensor``, ``typing.Any``)."""

    __slots__ = ("source",)
    if TYPE_CHECKING:
        source: str


# --------------------------------------------------------------------- stand-ins
class StandIn(metaclass=_FrozenMeta):
    """Replaces a foreign class (one subclass per global, named by ``source``); instances
    record NEWOBJ/REDUCE ``args``/``kwargs`` and the BUILD ``state``."""

    source: str = "?"
    if TYPE_CHECKING:  # set in __dict__ by __new__ and __setstate__
        args: tuple[Any, ...]
        kwargs: dict[str, Any]
        state: Any

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


class EnumStandIn(StandIn):
    """A member of a foreign ``enum.Enum``: a pickle builds it as ``Class(value)`` (what
    ``Enum.__reduce_ex__`` writes); only the scalar value is recorded. ``names`` maps the
    values whose name is the same in every release read to that name."""

    names: dict[Any, str] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> EnumStandIn:
        if kwargs or len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], (int, str)):
            raise InputError(f"pickle builds {cls.source} from unexpected arguments")
        obj = super().__new__(cls, *args)
        assert isinstance(obj, EnumStandIn)
        return obj

    def __setstate__(self, state: Any) -> None:
        raise InputError(f"pickle sets state on an enum member of {self.source}")

    @property
    def value(self) -> Any:
        return self.args[0]  # type: ignore[attr-defined]

    def plain(self) -> str:
        """``Class.name`` (as ``str()`` of the enum member), or ``Class(value)`` where the
        value's name is not known or differs between releases."""
        short = self.source.rsplit(".", 1)[-1]
        name = self.names.get(self.value)
        return f"{short}.{name}" if name else f"{short}({self.value!r})"


#: Megatron enums a Megatron-LM training run puts in ``args`` (``common.pt``,
#: ``model_optim_rng.pt``), with the values whose names agree in every release
#: core_r0.8.0 … core_v0.19.0 (``megatron/core/enums.py``, ``megatron/core/transformer/enums.py``
#: at each tag). How each gets there, and the pickles that show it, are in
#: ``tests/data/megatron_lm_args/`` (written by Megatron-LM's own argument code per release):
#:
#: * ``megatron.core.enums.ModelType`` — ``args.model_type = model_type`` in
#:   ``megatron/training/training.py`` ``pretrain`` (every release). Only 1 is
#:   ``encoder_or_decoder`` in all of them: 2 is ``encoder_and_decoder`` up to core_v0.13 and
#:   ``retro_encoder`` in core_v0.14–0.15 (removed from core_v0.16).
#: * ``megatron.core.transformer.enums.AttnBackend`` — ``--attention-backend``
#:   (``arguments.py``, from core_r0.11.0; default ``auto``).
#: * ``megatron.core.transformer.enums.CudaGraphScope`` — ``--cuda-graph-scope`` (core_v0.16–0.17).
#: * ``megatron.core.transformer.enums.CudaGraphModule`` — ``--cuda-graph-modules`` (core_v0.18+).
#: * ``megatron.core.transformer.enums.InferenceCudaGraphScope`` — set by ``validate_args``
#:   (``_normalize_inference_cuda_graph_scope_arg``, core_v0.18+), in every such ``args``.
#: * ``signal.Signals`` — ``--exit-signal`` (default ``SIGTERM``, core_v0.16+): a standard-library
#:   enum, named from Linux's numbers.
MEGATRON_ENUMS: dict[str, dict[Any, str]] = {
    "megatron.core.enums.ModelType": {1: "encoder_or_decoder"},
    "megatron.core.transformer.enums.AttnBackend": {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"},
    "megatron.core.transformer.enums.CudaGraphScope": {1: "full_iteration", 2: "attn", 3: "mlp", 4: "moe",
                                                       5: "moe_router", 6: "moe_preprocess", 7: "mamba",
                                                       8: "full_iteration_inference"},
    "megatron.core.transformer.enums.CudaGraphModule": {1: "attn", 2: "mlp", 3: "moe", 4: "moe_router",
                                                        5: "moe_preprocess", 6: "mamba"},
    "megatron.core.transformer.enums.InferenceCudaGraphScope": {1: "none", 2: "layer", 3: "block"},
    "signal.Signals": {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 10: "SIGUSR1", 12: "SIGUSR2", 15: "SIGTERM"},
}


def enum_standin(source: str, names: dict[Any, str]) -> type:
    """A new :class:`EnumStandIn` subclass for the foreign enum ``source``."""
    ns = {"source": source, "names": dict(names), "__module__": __name__}
    return _FrozenMeta(source.rsplit(".", 1)[-1], (EnumStandIn,), ns)


def _standin(base: type, source: str) -> type:
    """A new stand-in subclass of ``base`` for the foreign global ``source``."""
    ns = {"source": source, "__module__": __name__}
    return _FrozenMeta(source.rsplit(".", 1)[-1], (base,), ns)


_NDARRAY = TypeToken("numpy.ndarray")  # only _np_reconstruct accepts it


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
        made: Any = cls  # a StandIn or AttributeDictStandIn subclass, checked above
        return made(state or {}) if base is dict else made.__new__(made)
    raise InputError(f"pickle reconstructs {cls!r} (base {base!r}), which is not allowed")


def _torch_size(dims: Any = ()) -> tuple[int, ...]:
    """``torch.Size(dims)`` as the plain tuple it is (``torch.Size`` subclasses ``tuple``):
    every ``torch.save`` pickle names it, for each tensor's shape, and reading one must
    not need torch."""
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) for d in dims):
        raise InputError("pickle builds torch.Size from something other than integers")
    return tuple(dims)


def _torch_device(kind: Any, index: Any = None) -> torch.device:
    import torch
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
    if not (isinstance(spec, str) and re.fullmatch(r"[biufcSU][1-9]\d*", spec)):
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


