"""Writers of the ``.nemo`` weights layouts, fed logical tensor names.

Logical names are per layer and unprefixed (``decoder.layers.3.mlp.linear_fc1.weight``).
* ``dist``: Megatron-Core ``torch_dist`` folder ``model_weights/``: layers stacked on a
  leading axis (each layer written as its own chunk, never stacked in memory), the
  ``model.`` prefix, and one ``_extra_state`` object per linear module per layer.
* ``legacy``: one ``model_weights.ckpt`` = ``torch.save`` of the ``model.``-prefixed state
  dict, streamed tensor by tensor.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, cast

import torch

from nemo_convert.errors import ShapeError
from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter, write_dist_metadata
from nemo_convert.formats.dist_checkpoint.sections import section_infos, section_parts
from nemo_convert.formats.io.sink import MemberSink
from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter
from nemo_convert.mapping.rules import Sections
from nemo_convert.sharding.layout import split_layer_name
from nemo_convert.tensors.base import TensorInfo

EXPERT_RE = re.compile(r"^(?P<head>(?:.*\.)?experts)\.local_experts\.(?P<e>\d+)\.(?P<rest>.+)$")
_STACKED_KEY = re.compile(r"(^|\.)layers\.(?!\d+(\.|$))")
LAYOUTS = ("dist", "legacy")


class WeightsWriter(Protocol):
    def write(self, name: str, tensor: torch.Tensor) -> None: ...

    def close(self) -> None: ...


#: Module names of linear layers that are not spelled ``linear_*``: the MTP block's
#: ``eh_proj`` (a column-parallel linear: Megatron-Core 0.16.1 saves its ``_extra_state``);
#: the Mamba mixer's ``mixer.in_proj`` and ``mixer.out_proj`` (column- and row-parallel
#: linears, ``ssm/mamba_mixer.py`` lines 268–280 and 367–379: their ``sharded_state_dict``
#: carries ``_extra_state`` beside the weight, which the mixer's own
#: ``sharded_state_dict`` keeps, lines 1118–1135). Matched as the module's last components.
OTHER_LINEARS = ("eh_proj", "mixer.in_proj", "mixer.out_proj")
#: Logical-name prefixes Megatron-Core never stacks: the MTP block keeps every layer's keys
#: (``MultiTokenPredictionBlock.sharded_state_dict``: ``mtp.layers.<k>.…``, experts ``[E, …]``).
NEVER_STACKED = ("mtp.layers.",)


def _is_linear(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last.startswith("linear_") or any(module == o or module.endswith("." + o) for o in OTHER_LINEARS)


def extra_state_modules(rests: Sequence[str]) -> list[str]:
    """The Transformer-Engine modules of one layer that carry ``_extra_state``: every
    linear module with a weight (``linear_*``, :data:`OTHER_LINEARS`), plus
    ``core_attention`` beside ``linear_qkv``."""
    mods = sorted({r[: -len(".weight")] for r in rests if r.endswith(".weight") and _is_linear(r[: -len(".weight")])})
    if any(m.endswith("linear_qkv") for m in mods):
        mods += [m.replace("linear_qkv", "core_attention") for m in mods if m.endswith("linear_qkv")]
    return sorted(mods)


@dataclass(frozen=True, slots=True)
class DistPlace:
    """Where one logical tensor goes in a ``torch_dist`` checkpoint: its key (without
    prefix) and its fixed indices on the key's leading stacked axes (layer, expert)."""

    key: str
    index: tuple[int, ...]


def split_expert_name(name: str) -> tuple[str, int] | None:
    """``("mlp.experts.experts.linear_fc1.weight", 3)`` for the logical name of one
    expert's tensor (``mlp.experts.local_experts.3.linear_fc1.weight``, Megatron's module
    name), else None. Megatron-Core stores every expert of a layer under one key with an
    expert axis (``SequentialMLP.sharded_state_dict``)."""
    m = EXPERT_RE.match(name)
    if not m:
        return None
    return f"{m['head']}.experts.{m['rest']}", int(m["e"])


def dist_places(infos: Sequence[TensorInfo], unstacked: tuple[str, ...] = ()) -> DistPlaces:
    """The dist key and stacked indices of every logical tensor, as Megatron-Core's
    ``sharded_state_dict`` lays them out: per-layer tensors stacked on a leading layer axis
    (``decoder.layers.<rest>`` ``[L, …]``), experts on a further expert axis
    (``[L, E, …]``). A stack whose layers hold different tensors (a mixed dense/MoE stack)
    is *non-homogeneous*: every key keeps its layer index (``decoder.layers.<i>.<rest>``,
    experts ``[E, …]``), as it is for the stacks of ``unstacked`` name prefixes and of
    :data:`NEVER_STACKED`."""
    unstacked = (*unstacked, *NEVER_STACKED)
    per_layer: dict[str, dict[int, set[str]]] = {}
    for info in infos:
        parts = None if info.name.startswith(unstacked) else split_layer_name(info.name)
        if parts:
            per_layer.setdefault(parts[0], {}).setdefault(parts[1], set()).add(parts[2])
    mixed = frozenset(stack for stack, layers in per_layer.items() if len({frozenset(r) for r in layers.values()}) > 1)
    return DistPlaces(unstacked, mixed)


class DistPlaces:
    """:func:`dist_places`' answer: a tensor's :class:`DistPlace` worked out from its name
    when asked (what stacks are mixed is known), not held per tensor for the writers' life
    (a place and a table entry per tensor, ~0.1 KiB each; docs/performance.md, "Memory,
    third round")."""

    __slots__ = ("_mixed", "_unstacked")

    def __init__(self, unstacked: tuple[str, ...], mixed: frozenset[str]) -> None:
        self._unstacked, self._mixed = unstacked, mixed

    def __getitem__(self, name: str) -> DistPlace:
        parts = None if name.startswith(self._unstacked) else split_layer_name(name)
        if parts and parts[0] not in self._mixed:
            stack, i, rest = parts
            expert = split_expert_name(rest)
            return DistPlace(f"{stack}.{expert[0]}", (i, expert[1])) if expert else DistPlace(f"{stack}.{rest}", (i,))
        expert = split_expert_name(name)
        return DistPlace(expert[0], (expert[1],)) if expert else DistPlace(name, ())


#: :func:`dist_layout`'s result: every logical tensor's place, and every dist key's
#: (counts of its stacked axes, per-entry shape, dtype).
DistLayout = tuple[DistPlaces, dict[str, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]]


def dist_layout(infos: Sequence[TensorInfo], unstacked: tuple[str, ...] = ()) -> DistLayout:
    """:func:`dist_places` and, per dist key, (counts of its stacked axes, the per-entry
    shape, dtype), checked equal across the entries it stacks."""
    places = dist_places(infos, unstacked)
    keys: dict[str, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = {}
    for info in infos:
        place = places[info.name]
        prev = keys.get(place.key)
        if prev is not None and (prev[1], prev[2]) != (info.shape, info.dtype):
            raise ShapeError(f"the entries of {place.key} differ in shape or dtype "
                             f"({list(prev[1])} {prev[2]} vs {list(info.shape)} {info.dtype})")
        counts = tuple(max(a, b + 1) for a, b in zip(prev[0], place.index)) if prev else tuple(
            j + 1 for j in place.index)
        keys[place.key] = (counts, info.shape, info.dtype)
    return places, keys


def extra_state_items(keys: dict[str, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]) -> list[str]:
    """The ``_extra_state`` items Megatron-Core requires (without prefix): one per
    Transformer-Engine module of each layer (:func:`extra_state_modules`) and expert,
    ``<module>._extra_state/shard_<i>_<L>`` for a layer stack, ``shard_<i>.<e>_<L>.<E>``
    for a stack of experts, ``shard_<e>_<E>`` for the experts of one layer's key,
    ``shard_0_1`` for one layer's key."""
    items: list[str] = []
    by_module: dict[str, tuple[int, ...]] = {}
    for key, (counts, _, _) in keys.items():
        head = key.rsplit(".", 1)[0] if key.endswith(".weight") else None
        per_layer = split_layer_name(key) is not None or _STACKED_KEY.search(key) is not None
        if head is None or not per_layer:
            continue
        for mod in extra_state_modules([key]):
            by_module.setdefault(mod, counts)
    for mod, counts in sorted(by_module.items()):
        if not counts:
            items.append(f"{mod}._extra_state/shard_0_1")
            continue
        for idx in itertools.product(*(range(n) for n in counts)):
            items.append(f"{mod}._extra_state/shard_{'.'.join(map(str, idx))}_{'.'.join(map(str, counts))}")
    return items


class DistWeightsWriter:
    """Streams logical tensors into a stacked ``torch_dist`` checkpoint (:func:`dist_places`).

    ``infos`` are *all* the checkpoint's tensors (they define the stacked global shapes);
    one writer may write only some of them into its data file (a *part*), with
    ``finalize=False``: the parts' records are merged by :func:`finish_dist`. Each
    logical tensor — one layer's, one expert's — is one chunk: nothing is stacked in memory.
    A tensor of ``sections`` (:class:`~nemo_convert.mapping.rules.Sections`, by logical
    name) is stored as one key per section (:mod:`~nemo_convert.formats.dist_checkpoint.sections`);
    ``extra_states`` names modules outside the layers whose ``_extra_state`` the model class
    saves too (``NemoTarget.dist_extra_states``).
    """

    def __init__(self, sink: MemberSink, infos: Sequence[TensorInfo], *, prefix: str = "model.",
                 folder: str = "model_weights", data_file: str = "__0_0.distcp",
                 unstacked: tuple[str, ...] = (), sections: dict[str, Sections] | None = None,
                 extra_states: tuple[str, ...] = (), layout: DistLayout | None = None) -> None:
        """``layout``: :func:`dist_layout` of ``infos`` and ``unstacked``, when the caller
        has it already (the writers of several parts share one; only without ``sections``)."""
        self._w = DistCheckpointWriter(sink, folder, data_file=data_file)
        self._prefix = prefix
        names = {i.name for i in infos}
        # modules outside the layers whose _extra_state the model class keeps (MambaModel's output_layer)
        self._extra_modules = tuple(m for m in extra_states if m + ".weight" in names)
        self._sections = {k: v for k, v in (sections or {}).items() if k in names}
        if self._sections:
            layout = None
        self._places, self._keys = layout or dist_layout(section_infos(infos, self._sections), tuple(unstacked))
        # the modules' _extra_state items follow the parameters as modules hold them (whole)
        self._modules = dist_layout(infos, tuple(unstacked))[1] if self._sections else self._keys
        for key, (counts, shape, dtype) in self._keys.items():
            self._w.declare(prefix + key, (*counts, *shape), dtype)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        kind = self._sections.get(name)
        if kind is not None:
            for key, part in section_parts(name, tensor, kind):
                self._write_one(key, cast(torch.Tensor, part))  # a tensor's sections are tensors
            return
        self._write_one(name, tensor)

    def _write_one(self, name: str, tensor: torch.Tensor) -> None:
        place = self._places[name]
        lead = len(place.index)
        chunk = tensor.reshape(*((1,) * lead), *tensor.shape) if lead else tensor
        self._w.write_chunk(self._prefix + place.key, place.index + (0,) * tensor.dim(), chunk)

    def add_extra_states(self) -> None:
        """The ``_extra_state`` objects Megatron-Core requires (:func:`extra_state_items`)."""
        for item in extra_state_items(self._modules) + [f"{m}._extra_state/shard_0_1" for m in self._extra_modules]:
            self._w.add_object(self._prefix + item, [None])

    def abort(self, exc: BaseException | None = None) -> None:
        """Close the open data member without metadata (the run failed)."""
        self._w.abort(exc)

    def close(self, *, finalize: bool = True) -> Any:
        """Finish; with ``finalize`` (a one-part checkpoint) also write the metadata.
        Returns this part's records."""
        if finalize:
            self.add_extra_states()
        return self._w.close(finalize=finalize)


def finish_dist(sink: MemberSink, records: Sequence[Any], folder: str = "model_weights") -> None:
    """Write the dist checkpoint's metadata from every part's records."""
    write_dist_metadata(sink, folder, list(records))


class LegacyWeightsWriter:
    """Streams logical tensors into one ``model_weights.ckpt`` (``torch.save`` zip)."""

    def __init__(self, sink: MemberSink, infos: Sequence[TensorInfo], *, prefix: str = "model.",
                 member: str = "model_weights.ckpt") -> None:
        self._ctx = sink.open_member(member)
        stream = self._ctx.__enter__()
        self._w = TorchSaveWriter(stream)
        self._prefix = prefix

    def write(self, name: str, tensor: torch.Tensor) -> None:
        self._w.add(self._prefix + name, tensor)

    def close(self) -> None:
        self._w.close()
        self._ctx.__exit__(None, None, None)


def make_weights_writer(layout: str, sink: MemberSink, infos: Sequence[TensorInfo], *,
                        prefix: str = "model.") -> WeightsWriter:
    if layout == "dist":
        return DistWeightsWriter(sink, infos, prefix=prefix)  # one part, metadata on close
    if layout == "legacy":
        return LegacyWeightsWriter(sink, infos, prefix=prefix)
    raise ValueError(f"unknown layout {layout!r} (use {' or '.join(LAYOUTS)})")
