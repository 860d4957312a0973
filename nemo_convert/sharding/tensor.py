"""Tensor parallelism: the one implementation of Megatron's per-kind splits and merges.

Rules (nemo-formats.md §6, megatron-compat.md): column-parallel along dim 0, row-parallel
along dim 1; QKV as contiguous dim-0 chunks (whole query groups per rank); gated fc1 with
gate and up halves chunked separately (rank r holds ``[gate_r; up_r]``); embeddings and
output layer along the vocabulary, padded to a multiple of ``divisible_by × TP`` on split
and trimmed back on merge; a tensor of named sections (:class:`~nemo_convert.mapping.rules.Sections`:
the Mamba mixer's ``in_proj`` ``[z; x; B; C; dt]`` and ``conv1d`` ``[x; B; C]``) with every
section chunked on its own, rank r holding ``[s0_r; s1_r; …]``; everything else replicated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from nemo_convert.errors import ShapeError, UnsupportedError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import Kind, Parallel, Sections
from nemo_convert.tensors.pieces import Lazy, materialize, rows

if TYPE_CHECKING:
    import torch


def _chunk(t: Lazy, dim: int, tp: int, rank: int, what: str) -> Lazy:
    if t.dim() <= dim:
        return t  # a bias of a row-parallel layer: replicated
    if t.shape[dim] % tp:
        raise UnsupportedError(f"{what}: dimension {dim} of size {t.shape[dim]} does not split into {tp} "
                               "tensor-parallel ranks")
    n = t.shape[dim] // tp
    return t.narrow(dim, rank * n, n)


def _check_sections(kind: Sections, rows: int, tp: int, what: str) -> None:
    if rows != kind.rows:
        raise ShapeError(f"{what}: {rows} rows are not the sections {dict(zip(kind.names, kind.sizes))} "
                         f"({kind.rows} rows)")
    for k, (name, size) in enumerate(zip(kind.names, kind.sizes)):
        blocks = kind.units[k] if kind.units is not None else size
        if blocks % tp:
            whole = f" in {blocks} whole blocks" if blocks != size else ""
            raise UnsupportedError(f"{what}: section {name!r} of {size} rows{whole} does not split into {tp} "
                                   "tensor-parallel ranks")


def split_sections(t: Lazy, kind: Sections, tp: int, rank: int, what: str = "tensor") -> Lazy:
    """Rank ``rank``'s rows of a sectioned tensor: the rank's chunk of every section, in
    section order (deferred: only rows are picked)."""
    _check_sections(kind, t.shape[0], tp, what)
    return rows([t.narrow(0, start + rank * (n // tp), n // tp) for _, start, n in kind.spans()])


def merge_sections(parts: Sequence[Lazy], kind: Sections, what: str = "tensor") -> Lazy:
    """The global sectioned tensor from every rank's rows: section by section, rank by rank."""
    tp = len(parts)
    _check_sections(kind, sum(p.shape[0] for p in parts), tp, what)
    pieces: list[Lazy] = []
    for _, start, n in kind.spans():
        local_start, local = start // tp, n // tp
        pieces += [p.narrow(0, local_start, local) for p in parts]
    return rows(pieces)


class TensorParallel:
    """Splits a global tensor for one TP rank, and merges rank slices back."""

    def split(self, t: torch.Tensor, kind: Kind, tp: int, rank: int, *, name: str = "tensor",
              padded_vocab: int | None = None) -> torch.Tensor:
        """Rank ``rank``'s slice of ``t`` (a view where the kind allows, else a new tensor)."""
        return materialize(self.split_lazy(t, kind, tp, rank, name=name, padded_vocab=padded_vocab))

    def merge(self, parts: Sequence[torch.Tensor], kind: Kind, *, name: str = "tensor",
              vocab: int | None = None) -> torch.Tensor:
        """The global tensor from every rank's slice, in rank order."""
        return materialize(self.merge_lazy(parts, kind, name=name, vocab=vocab))

    def split_lazy(self, t: Lazy, kind: Kind, tp: int, rank: int, *, name: str = "tensor",
                   padded_vocab: int | None = None) -> Lazy:
        """:meth:`split`, deferred where it only picks rows (:mod:`nemo_convert.tensors.pieces`)."""
        if tp == 1 and kind is not Parallel.VOCAB:
            return t
        if kind is Parallel.REPLICATED:
            return t
        if isinstance(kind, Sections):
            return split_sections(t, kind, tp, rank, name)
        if kind in (Parallel.COLUMN, Parallel.QKV):
            return _chunk(t, 0, tp, rank, name)
        if kind is Parallel.ROW:
            return _chunk(materialize(t) if t.dim() > 1 else t, 1, tp, rank, name)
        if kind is Parallel.GATED_FC1:
            gate, up = ops.split_gated(t)
            return rows([_chunk(gate, 0, tp, rank, name), _chunk(up, 0, tp, rank, name)])
        if kind is Parallel.VOCAB:
            full = ops.pad_vocab_lazy(t, padded_vocab) if padded_vocab is not None else t
            return _chunk(full, 0, tp, rank, name)
        raise UnsupportedError(f"{name}: unknown parallel kind {kind!r}")

    def merge_lazy(self, parts: Sequence[Lazy], kind: Kind, *, name: str = "tensor",
                   vocab: int | None = None) -> Lazy:
        """:meth:`merge`, deferred where it only stacks rows."""
        if len(parts) == 1 and kind is not Parallel.VOCAB:
            return parts[0]
        if kind is Parallel.REPLICATED:
            first = parts[0]
            for i, p in enumerate(parts[1:], 1):
                if p.shape != first.shape:
                    raise ShapeError(f"{name}: replicated tensor differs in shape on TP rank {i}")
            return first
        if isinstance(kind, Sections):
            return merge_sections(parts, kind, name)
        if kind in (Parallel.COLUMN, Parallel.QKV):
            return rows(parts) if parts[0].dim() >= 1 else parts[0]
        if kind is Parallel.ROW:
            if parts[0].dim() < 2:
                return parts[0]
            return ops.concat([materialize(p) for p in parts], 1)
        if kind is Parallel.GATED_FC1:
            halves = [ops.split_gated(p) for p in parts]
            return rows([g for g, _ in halves] + [u for _, u in halves])
        if kind is Parallel.VOCAB:
            full = rows(parts)
            return ops.trim_vocab(full, vocab) if vocab is not None else full
        raise UnsupportedError(f"{name}: unknown parallel kind {kind!r}")

    def local_shape(self, shape: tuple[int, ...], kind: Kind, tp: int, *,
                    padded_vocab: int | None = None) -> tuple[int, ...]:
        import torch
        meta = torch.empty(shape, device="meta")
        return tuple(self.split(meta, kind, tp, 0, padded_vocab=padded_vocab).shape)


def deferred(strategy: object, method: str) -> Callable[..., Lazy] | None:
    """``strategy.<method>_lazy`` (``method`` is ``split`` or ``merge``) when it is the
    deferred form of the strategy's own ``method``: defined by the class that defines
    ``method``, or a subclass of it. A subclass that overrides only ``split`` (a device
    wrapper, a third party's strategy) is never bypassed by an inherited lazy form."""
    def owner(name: str) -> type | None:
        return next((c for c in type(strategy).__mro__ if name in vars(c)), None)

    eager, lazy = owner(method), owner(method + "_lazy")
    if eager is None or lazy is None or not issubclass(lazy, eager):
        return None
    return getattr(strategy, method + "_lazy")  # type: ignore[no-any-return]
