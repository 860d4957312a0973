"""PyTorch Lightning training checkpoints, found, read safely and lazily.

Three layouts hold the weights of one training run (nemo-formats.md §7):

* one ``.ckpt`` file: ``torch.save`` of Lightning's checkpoint dict (``state_dict``,
  ``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``, ``hyper_parameters``…);
* per-rank files of a model-parallel run, ``mp_rank_XX/<name>.ckpt`` (PP = 1) or
  ``tp_rank_XX_pp_rank_YYY/<name>.ckpt``, each holding its rank's slices (layers
  renumbered from 0 in every pipeline stage);
* a distributed (``torch_dist``) checkpoint folder: ``metadata.json``, ``.metadata`` and
  ``__*_*.distcp`` with the (stacked, ``model.``-prefixed) weights and the sharded
  optimizer state, and ``common.pt`` with everything else (epoch, loops, hyper-parameters…).

:func:`locate` decides which one a path is (a checkpoints folder holding several is
narrowed with a checkpoint name); :func:`open_training_checkpoint` reads it. Every pickle
goes through the restricted unpickler (``.ckpt`` and ``common.pt``) or the DCP metadata
unpickler (``.metadata``); tensors are memory-mapped, never loaded up front. What is not a
model weight (optimizer state, ``_extra_state`` blobs, loops, …) is counted, not kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nemo_convert.errors import InputError, UnsupportedError
from nemo_convert.formats.dist_checkpoint.distckpt_meta import MetadataIndex
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.nemo.nemo_ranks import WEIGHTS, PerRankSource
from nemo_convert.formats.io.tar_archive import Container
from nemo_convert.sharding.layout import ParallelLayout, split_layer_name
from nemo_convert.sharding.protocol import Strategies
from nemo_convert.tensors.base import ByteRegion, TensorSource, dtype_size
from nemo_convert.tensors.torch_zip import LazyTensor
from nemo_convert.tensors.torch_zip_source import TorchZipSource
from nemo_convert.tensors.views import MultiSource, PrefixView

from nemo_convert.formats.ptl.ptl_locate import (  # noqa: F401  (re-exported)
    CKPT_SUFFIX,
    DIST_MARKER,
    COMMON_PT,
    EXTRA_STATE,
    WEIGHT_PREFIXES,
    _VIRTUAL_PP,
    RUN_FIELDS,
    HPARAM_FIELDS,
    DIST_SUMMARY,
    Located,
    _is_dist,
    _rank_folders,
    _candidates,
    locate,
    _locate_ranks,
)


# ------------------------------------------------------------------------- reading
@dataclass
class Dropped:
    """What one section of the checkpoint held that the ``.nemo`` does not keep."""

    tensors: int = 0
    bytes: int = 0
    objects: int = 0  # non-tensor blobs (``_extra_state``, dist BYTE_IO items)

    def add(self, other: Dropped) -> None:
        self.tensors += other.tensors
        self.bytes += other.bytes
        self.objects += other.objects

    def as_dict(self) -> dict[str, int]:
        d = {"tensors": self.tensors, "bytes": self.bytes}
        if self.objects:
            d["objects"] = self.objects
        return d


def _size_of(node: Any) -> Dropped:
    """The lazy tensors under ``node`` (dicts, lists, tuples), each counted once."""
    lazy = LazyTensor
    d = Dropped()
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, lazy):
            d.tensors += 1
            d.bytes += n.numel * dtype_size(n.dtype_name)
        elif isinstance(n, dict):
            stack.extend(n.values())
        elif isinstance(n, (list, tuple, set, frozenset)):
            stack.extend(n)
    return d


def find_weights_prefix(keys: Iterable[str], where: str) -> str:
    """The prefix of the model's weights among ``keys`` (see :data:`WEIGHT_PREFIXES`)."""
    keys = list(keys)
    virtual = sorted({m.group(0) for k in keys if (m := _VIRTUAL_PP.match(k))})
    if virtual:
        raise UnsupportedError(f"{where}: interleaved (virtual) pipeline-parallel checkpoints "
                               f"({', '.join(virtual)}…) are not supported")
    for prefix in WEIGHT_PREFIXES:
        if any(k.startswith(prefix) for k in keys):
            return prefix
    shown = ", ".join(keys[:5]) + (", …" if len(keys) > 5 else "")
    raise InputError(f"{where}: no model weights (no tensor name starts with 'model.', 'module.' or "
                     f"'state_dict.model.'; tensors: {shown or 'none'})")


def is_weight(key: str, prefix: str) -> bool:
    """Whether ``key`` is a model weight: under ``prefix`` and not a TE ``_extra_state``."""
    return key.startswith(prefix) and not key.rsplit(".", 1)[-1].startswith(EXTRA_STATE) \
        and f".{EXTRA_STATE}/" not in key


class _RankFiles(Container):
    """The files of a per-rank checkpoint as a container with the member names
    :class:`~nemo_convert.formats.nemo.nemo_ranks.PerRankSource` reads
    (``<rank folder>/model_weights.ckpt``)."""

    def __init__(self, loc: Located, layout: ParallelLayout) -> None:
        super().__init__(loc.path)
        for p, t, folder in layout.rank_dirs():
            path = loc.rank_file(t, p)
            self._add_file(f"{folder}/{WEIGHTS}", ByteRegion(path, 0, os.path.getsize(path)), path)


@dataclass
class TrainingCheckpoint:
    """A training checkpoint opened lazily: its run metadata and hyper-parameters, what is
    dropped, and (through :meth:`weights`) the model weights under logical names."""

    located: Located
    meta: dict[str, Any]  # rank 0's checkpoint dict (or common.pt) without the weights
    prefix: str
    dropped: dict[str, Dropped] = field(default_factory=dict)
    dropped_keys: list[str] = field(default_factory=list)  # model entries that are not weights
    stage_sizes: tuple[int, ...] | None = None  # layers per pipeline stage (per-rank, PP > 1)
    _make_weights: Callable[[dict[str, Any], bool, Strategies], TensorSource] | None = field(default=None,
                                                                                             repr=False)
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def hyper_parameters(self) -> Any:
        return self.meta.get("hyper_parameters")

    @property
    def run(self) -> dict[str, Any]:
        """Epoch, global step and Lightning version, where recorded."""
        return {k: self.meta[k] for k in RUN_FIELDS
                if isinstance(self.meta.get(k), (int, str)) and not isinstance(self.meta.get(k), bool)}

    @property
    def dropped_total(self) -> Dropped:
        total = Dropped()
        for d in self.dropped.values():
            total.add(d)
        return total

    def weights(self, kinds: dict[str, Any] | None = None, *, strategies: Strategies,
                tied: bool = False) -> TensorSource:
        """The model's global tensors under logical names. Per-rank slices are merged
        with ``strategies`` (the registry's) using ``kinds`` (each tensor's parallel kind)
        and ``tied`` (whether the last stage holds a copy of the word embedding).
        Vocabulary padding is kept."""
        assert self._make_weights is not None
        source = self._make_weights(kinds or {}, tied, strategies)
        self._closers.append(source.close)
        return source

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()

    def __enter__(self) -> TrainingCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _add(dropped: dict[str, Dropped], section: str, d: Dropped) -> None:
    if d.tensors or d.objects:
        dropped.setdefault(section, Dropped()).add(d)


def _account_state(state: dict[Any, Any], prefix: str, dropped: dict[str, Dropped],
                   dropped_keys: list[str], where: str = "") -> None:
    """Count the entries of a state dict that are not model weights."""
    for key, value in state.items():
        key = str(key)
        if is_weight(key, prefix):
            continue
        size = _size_of(value)
        if size.tensors or key.endswith(EXTRA_STATE):
            dropped_keys.append(where + key)
            _add(dropped, "state_dict (not model weights)", size if size.tensors else Dropped(objects=1))


def _split_tree(tree: Any, where: str) -> tuple[dict[str, Any], dict[Any, Any] | None]:
    """``(metadata, state dict)`` of a checkpoint tree: a Lightning dict, or a bare state dict."""
    if not isinstance(tree, dict):
        raise InputError(f"{where}: not a Lightning checkpoint (it holds a {type(tree).__name__})")
    if isinstance(tree.get("state_dict"), dict):
        return {k: v for k, v in tree.items() if k != "state_dict"}, tree["state_dict"]
    if "state_dict" in tree:
        raise InputError(f"{where}: its state_dict is a {type(tree['state_dict']).__name__}, not a dict")
    return {}, tree  # a bare state dict (e.g. model_weights.ckpt)


def _account_meta(meta: dict[str, Any], dropped: dict[str, Dropped], label: str = "") -> None:
    """Every top-level section of the training state (optimizer, loops, callbacks, …), with
    its tensors; the run fields and hyper-parameters are used, not dropped."""
    for k, v in meta.items():
        if k in RUN_FIELDS or k in HPARAM_FIELDS:
            continue
        dropped.setdefault(f"{label}{k}", Dropped()).add(_size_of(v))


def open_training_checkpoint(loc: Located, *, trust_pickle: bool = False) -> TrainingCheckpoint:
    """Open the checkpoint :func:`locate` found: read its pickles safely, count what is
    dropped, and prepare the weights (no tensor data is read yet)."""
    if loc.kind == "ckpt":
        return _open_single(loc, trust_pickle)
    if loc.kind == "per-rank":
        return _open_ranks(loc, trust_pickle)
    return _open_dist(loc, trust_pickle)


def _zip_source(path: str, trust_pickle: bool):  # type: ignore[no-untyped-def]
    return TorchZipSource(ByteRegion(path, 0, os.path.getsize(path)), trust_pickle=trust_pickle)


def _open_single(loc: Located, trust_pickle: bool) -> TrainingCheckpoint:
    zs = _zip_source(loc.path, trust_pickle)
    try:
        meta, state = _split_tree(zs.tree, loc.path)
        prefix = find_weights_prefix(zs.keys(), loc.path)
        ck = TrainingCheckpoint(loc, meta, prefix)
        _account_meta(meta, ck.dropped)
        _account_state(state or {}, prefix, ck.dropped, ck.dropped_keys)
    except BaseException:
        zs.close()
        raise
    ck._closers.append(zs.close)
    ck._make_weights = lambda kinds, tied, strategies: PrefixView(zs, prefix, keep=lambda k: is_weight(k, prefix))
    return ck


def _open_ranks(loc: Located, trust_pickle: bool) -> TrainingCheckpoint:
    dropped: dict[str, Dropped] = {}
    dropped_keys: list[str] = []
    meta: dict[str, Any] = {}
    layers: dict[int, set[int]] = {p: set() for p in range(loc.pp)}
    for p in range(loc.pp):
        for t in range(loc.tp):
            path = loc.rank_file(t, p)
            with _zip_source(path, trust_pickle) as zs:
                rank_meta, state = _split_tree(zs.tree, path)
                prefix = find_weights_prefix(zs.keys(), path)
                if prefix != "model.":
                    raise UnsupportedError(f"{path}: per-rank weights under {prefix!r}; only 'model.' "
                                           "(NeMo's legacy layout) is supported")
                _account_meta(rank_meta, dropped)
                _account_state(state or {}, prefix, dropped, dropped_keys, f"{loc.rank_folder(t, p)}/")
                if (t, p) == (0, 0):
                    meta = rank_meta
                if t == 0:
                    for k in zs.keys():
                        parts = split_layer_name(k[len(prefix):]) if is_weight(k, prefix) else None
                        if parts is not None and parts[0] == "decoder.layers":
                            layers[p].add(parts[1])
    sizes = tuple(len(layers[p]) for p in range(loc.pp))
    for p in range(loc.pp):
        if layers[p] != set(range(sizes[p])):
            raise InputError(f"{loc.path}: pipeline stage {p} numbers its layers {sorted(layers[p])}; "
                             f"expected 0..{sizes[p] - 1}")
    ck = TrainingCheckpoint(loc, meta, "model.", dropped, dropped_keys, sizes if loc.pp > 1 else None)

    def make(kinds: dict[str, Any], tied: bool, strategies: Strategies) -> TensorSource:
        playout = ParallelLayout.make(sum(sizes), loc.tp, loc.pp, stage_sizes=sizes if loc.pp > 1 else None,
                                      tied=tied, pipeline=strategies.pipeline)
        return PrefixView(PerRankSource(_RankFiles(loc, playout), "", playout, kinds, trust_pickle=trust_pickle,
                                        tensor_parallel=strategies.tensor), "", keep=lambda k: is_weight(k, ""))

    ck._make_weights = make
    return ck


def _open_dist(loc: Located, trust_pickle: bool) -> TrainingCheckpoint:
    root = loc.path

    def open_region(name: str) -> ByteRegion:
        full = os.path.join(root, name)
        return ByteRegion(full, 0, os.path.getsize(full))

    dist = DistCheckpointSource(open_region, name=root)
    closers: list[Callable[[], None]] = [dist.close]
    try:
        prefix = find_weights_prefix(dist.raw_keys(), root)
        dropped: dict[str, Dropped] = {}
        dropped_keys: list[str] = []
        entries = dist.metadata.state_dict_metadata
        for raw in dist.raw_keys():
            if is_weight(raw, prefix):
                continue
            item = entries[raw]
            numel = 1
            for s in item.size:
                numel *= int(s)
            section = raw.split(".", 1)[0] if not raw.startswith(prefix) else "model (not weights)"
            _add(dropped, section, Dropped(1, numel * dtype_size(item.properties.dtype_name)))
        for obj in dist.object_keys:
            info = dist.metadata.storage_data.get(MetadataIndex(obj))
            size = Dropped(0, int(getattr(info, "length", 0) or 0), 1)
            if EXTRA_STATE in obj:
                _add(dropped, EXTRA_STATE, size)
            else:
                _add(dropped, obj.split("/", 1)[0].split(".", 1)[0], size)
        meta: dict[str, Any] = {}
        extra: TensorSource | None = None
        common = os.path.join(root, COMMON_PT)
        if os.path.isfile(common):
            zs = _zip_source(common, trust_pickle)
            closers.append(zs.close)
            tree = zs.tree if isinstance(zs.tree, dict) else {}
            meta = {k: v for k, v in tree.items() if k != "state_dict"}
            _account_meta(meta, dropped, f"{COMMON_PT}: ")
            state = tree.get("state_dict")
            if isinstance(state, dict) and zs.keys():
                # Non-sharded weights that Megatron kept in common.pt: part of the model.
                cprefix = find_weights_prefix(zs.keys(), common)
                _account_state(state, cprefix, dropped, dropped_keys, f"{COMMON_PT}: ")
                extra = PrefixView(zs, cprefix, keep=lambda k: is_weight(k, cprefix))
    except BaseException:
        for c in closers:
            c()
        raise
    ck = TrainingCheckpoint(loc, meta, prefix, dropped, dropped_keys)
    ck._closers.extend(closers)
    view = PrefixView(dist, prefix, keep=lambda k: is_weight(k, prefix))
    ck._make_weights = lambda kinds, tied, strategies: view if extra is None else MultiSource([view, extra], root)
    return ck
