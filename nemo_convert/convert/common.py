"""Pieces shared by the conversions: the report, the registry default, our config section."""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, ParamSpec, TypeVar

from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.detect import require_kind
from nemo_convert.formats.open_any import open_model_checkpoint
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.mapping.planner import nemo_parallel_kinds
from nemo_convert.plugins.manager import Registry, get_registry
from nemo_convert.tokenizers import tokenizer_size

#: The section of ``model_config.yaml`` where we keep what NeMo has no field for.
SECTION = "nemo_convert"


@dataclass
class ConversionReport:
    """What a conversion did; ``--json`` prints this."""

    output: str
    family: str
    tensors: int
    bytes: int
    seconds: float
    layout: str | None = None
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    non_finite: dict[str, int] = field(default_factory=dict)  # with check_finite: tensor -> NaN/Inf count

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def finite_warning(non_finite: dict[str, int]) -> list[str]:
    if not non_finite:
        return []
    names = ", ".join(f"{k} ({n})" for k, n in sorted(non_finite.items())[:8])
    more = f" and {len(non_finite) - 8} more" if len(non_finite) > 8 else ""
    return [f"{len(non_finite)} tensor(s) hold NaN or Inf values: {names}{more}"]


def tokenizer_rows_warning(files: Mapping[str, bytes], rows: Any) -> list[str]:
    """A warning when the tokenizer among ``files`` has ids past the embedding's ``rows``
    (tokens added to the tokenizer without resizing the embedding): those ids would index
    past the embedding and the output layer."""
    found = tokenizer_size(files)
    if found is None or not isinstance(rows, int) or isinstance(rows, bool) or rows < 1 or found[1] <= rows:
        return []
    name, size = found
    return [f"{name} has {size} token ids but the embedding has {rows} rows (vocab_size): ids {rows}–{size - 1} "
            "have no embedding row; resize the embedding and the output layer before using them"]


P = ParamSpec("P")
T = TypeVar("T")


def gc_paused(fn: Callable[P, T]) -> Callable[P, T]:
    """Run ``fn`` with Python's cyclic garbage collector paused, and restore it after.

    A conversion allocates a few small objects per tensor (plan tasks, infos, chunk
    records, the ``.metadata`` records) and keeps most of them until it ends; every 700
    allocations the collector scans the young ones and, ever more often as the survivors
    pile up, all of them, finding nothing: at DeepSeek-V3's 92k tensors that was a fifth
    of the import's CPU (docs/performance.md, "Third round"). Nothing the conversions build
    is cyclic garbage that needs the collector (reference counting frees it), and whatever
    is left for it is collected by its next run after ``fn`` returns. Nested calls keep it
    paused; a collector the caller had disabled stays disabled."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> T:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return paused


def registry_or_default(registry: Registry | None) -> Registry:
    return registry if registry is not None else get_registry()


@contextmanager
def dir_sink(path: str) -> Iterator[DirectorySink]:
    yield DirectorySink(path)


def kinds_for(registry: Registry, family: str | None = None):  # type: ignore[no-untyped-def]
    """A ``cfg -> {logical name: Parallel}`` callback for the readers, from the family that
    handles the config (empty when no installed family does)."""
    def kinds(cfg: dict[str, Any]) -> dict[str, Any]:
        try:
            fam = registry.family(family) if family else registry.family_for_nemo_config(cfg)
        except NemoConvertError:
            return {}
        return nemo_parallel_kinds(fam.mapping(cfg), cfg)

    return kinds


def open_nemo_source(src: str, registry: Registry, *, family: str | None, compute: Any, trust_pickle: bool,
                     iteration: int | None) -> Any:
    """Open what export and reshard read — a ``.nemo``, a NeMo 2 folder or a Megatron
    directory (``iteration``: its ``iter_XXXXXXX/``) — lazily, with the registry's sharding
    strategies, its tensor-parallel merge run by ``compute`` (a
    :class:`~nemo_convert.compute.Compute`); any other kind is refused naming the command
    that takes it."""
    require_kind(src, ("nemo", "nemo2", "megatron"), "a .nemo")
    strategies = registry.strategies()
    return open_model_checkpoint(src, trust_pickle=trust_pickle, kinds_for=kinds_for(registry, family),
                                 providers=registry.providers(),
                                 strategies=strategies.with_tensor(compute.tensor_parallel(strategies.tensor)),
                                 iteration=iteration)


def dict_at(cfg: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``cfg[key]`` where it is a dict (that very object: edits reach ``cfg``), else a new
    empty one (a section that is absent, null or malformed)."""
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}
