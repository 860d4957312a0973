"""Writers of the ``.nemo`` weights layouts, fed logical tensor names.

Logical names are per layer and unprefixed (``decoder.layers.3.mlp.linear_fc1.weight``).
* ``dist``: Megatron-Core ``torch_dist`` folder ``model_weights/``: layers stacked on a
  leading axis (each layer written as its own chunk, never stacked in memory), the
  ``model.`` prefix, and one ``_extra_state`` object per linear module per layer.
* ``legacy``: one ``model_weights.ckpt`` = ``torch.save`` of the ``model.``-prefixed state
  dict, streamed tensor by tensor.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from nemo_convert.errors import ShapeError
from nemo_convert.formats.distckpt_write import DistCheckpointWriter, write_dist_metadata
from nemo_convert.formats.sink import MemberSink
from nemo_convert.formats.torch_save import TorchSaveWriter
from nemo_convert.sharding.layout import split_layer_name
from nemo_convert.tensors.base import TensorInfo

LAYOUTS = ("dist", "legacy")


class WeightsWriter(Protocol):
    def write(self, name: str, tensor: torch.Tensor) -> None: ...

    def close(self) -> None: ...


def extra_state_modules(rests: Sequence[str]) -> list[str]:
    """The Transformer-Engine modules of one layer that carry ``_extra_state``: every
    ``linear_*`` module with a weight, plus ``core_attention`` beside ``linear_qkv``."""
    mods = sorted({r[: -len(".weight")] for r in rests
                   if r.endswith(".weight") and r[: -len(".weight")].rsplit(".", 1)[-1].startswith("linear_")})
    if any(m.endswith("linear_qkv") for m in mods):
        mods += [m.replace("linear_qkv", "core_attention") for m in mods if m.endswith("linear_qkv")]
    return sorted(mods)


class DistWeightsWriter:
    """Streams logical tensors into a stacked ``torch_dist`` checkpoint.

    ``infos`` are *all* the checkpoint's tensors (they define the stacked global shapes);
    one writer may write only some of them into its data file (a *part*), with
    ``finalize=False``: the parts' records are merged by :func:`finish_dist`.
    """

    def __init__(self, sink: MemberSink, infos: Sequence[TensorInfo], *, prefix: str = "model.",
                 folder: str = "model_weights", data_file: str = "__0_0.distcp",
                 unstacked: tuple[str, ...] = ()) -> None:
        self._w = DistCheckpointWriter(sink, folder, data_file=data_file)
        self._prefix = prefix
        self._unstacked = tuple(unstacked)
        self._layers, self._stacks = stacked_layout([i for i in infos if self._layer(i.name)])
        for info in infos:
            if self._layer(info.name) is None:
                self._w.declare(prefix + info.name, info.shape, info.dtype)
        for stack, rests in self._stacks.items():
            n = self._layers[stack]
            for rest, info in rests.items():
                self._w.declare(f"{prefix}{stack}.{rest}", (n, *info.shape), info.dtype)

    def _layer(self, name: str) -> tuple[str, int, str] | None:
        """The stacking of ``name``: None for a tensor stored under its own key."""
        return None if name.startswith(self._unstacked) else split_layer_name(name)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        parts = self._layer(name) if self._unstacked else split_layer_name(name)
        if parts:
            stack, i, rest = parts
            self._w.write_chunk(f"{self._prefix}{stack}.{rest}", (i,) + (0,) * tensor.dim(), tensor.unsqueeze(0))
        else:
            self._w.write_chunk(self._prefix + name, (0,) * tensor.dim(), tensor)

    def add_extra_states(self) -> None:
        """One ``_extra_state`` object per Transformer-Engine module per layer."""
        for stack, rests in self._stacks.items():
            n = self._layers[stack]
            for mod in extra_state_modules(list(rests)):
                for i in range(n):
                    self._w.add_extra_state(f"{self._prefix}{stack}.{mod}._extra_state", i, n)

    def abort(self, exc: BaseException | None = None) -> None:
        """Close the open data member without metadata (the run failed)."""
        self._w.abort(exc)

    def close(self, *, finalize: bool = True) -> Any:
        """Finish; with ``finalize`` (a one-part checkpoint) also write the metadata.
        Returns this part's records."""
        if finalize:
            self.add_extra_states()
        return self._w.close(finalize=finalize)


def stacked_layout(infos: Sequence[TensorInfo]) -> tuple[dict[str, int], dict[str, dict[str, TensorInfo]]]:
    """Layer count per stack and the per-layer tensor of each stacked name (checked equal
    across layers)."""
    layers: dict[str, int] = {}
    per_stack: dict[str, dict[str, TensorInfo]] = {}
    for info in infos:
        parts = split_layer_name(info.name)
        if parts:
            stack, i, rest = parts
            layers[stack] = max(layers.get(stack, 0), i + 1)
            prev = per_stack.setdefault(stack, {}).get(rest)
            if prev is not None and (prev.shape, prev.dtype) != (info.shape, info.dtype):
                raise ShapeError(f"layers of {stack}.*.{rest} differ in shape or dtype "
                                 f"({list(prev.shape)} {prev.dtype} vs {list(info.shape)} {info.dtype})")
            per_stack[stack][rest] = info
    return layers, per_stack


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
