"""A tensor not yet copied together: the dim-0 concatenation of contiguous tensors.

Fusing QKV or gated fc1, splitting gated fc1 for a tensor-parallel rank and merging
column-parallel rank slices only rearrange whole rows. :class:`Pieces` records such a
result as the list of contiguous tensors whose bytes, one after another, are the result's
bytes — no copy is made. A writer that understands it writes each piece straight from
where it lies (file to file in the kernel when the piece views an input file:
:mod:`nemo_convert.tensors.file_map`); anything else calls :func:`materialize`, which
copies the pieces into one new tensor. The math of each op is written once, as the list
of pieces (``mapping/ops.py``, ``sharding/tensor.py``); the eager tensor is always
``materialize`` of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

from nemo_convert.errors import ShapeError
from nemo_convert.tensors import hugepages

if TYPE_CHECKING:
    import torch


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class Pieces:
    """``shape``/``dtype`` of a tensor whose flat bytes are the flat bytes of ``parts`` in order.

    Supports what flows between an op and a writer: ``narrow`` on dim 0 (a sub-list),
    ``reshape`` / ``unsqueeze(0)`` (same bytes), and the size queries writers ask.
    """

    __slots__ = ("parts", "shape", "dtype")

    def __init__(self, parts: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> None:
        import torch
        flat = tuple(p.reshape(-1) for p in parts if p.numel())
        if any(p.dtype != dtype or p.device.type != "cpu" for p in flat):
            raise ShapeError("internal error: pieces of one tensor differ in dtype or device")
        if sum(p.numel() for p in flat) != _numel(shape):
            raise ShapeError(f"internal error: pieces of {sum(p.numel() for p in flat)} elements "
                             f"do not make a tensor of shape {list(shape)}")
        self.parts, self.shape, self.dtype = flat, torch.Size(shape), dtype

    # -- what writers ask of a tensor --------------------------------------------------
    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return _numel(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    # -- views -------------------------------------------------------------------------
    def reshape(self, *shape: int | Sequence[int]) -> "Pieces":
        first = shape[0] if len(shape) == 1 else None
        want: list[int] = ([int(d) for d in first] if first is not None and not isinstance(first, int)
                           else [int(d) for d in shape if isinstance(d, int)])
        if -1 in want:
            known = _numel([d for d in want if d != -1])
            want[want.index(-1)] = self.numel() // known if known else 0
        return Pieces(self.parts, want, self.dtype)

    def unsqueeze(self, dim: int) -> "Pieces":
        if dim != 0:
            raise ShapeError("internal error: pieces only gain a leading dimension")
        return Pieces(self.parts, (1, *self.shape), self.dtype)

    def narrow(self, dim: int, start: int, length: int) -> "Pieces":
        """Rows ``[start, start + length)``: the pieces (and parts of pieces) they cover."""
        if dim != 0 or start < 0 or length < 0 or start + length > self.shape[0]:
            raise ShapeError(f"internal error: cannot narrow pieces of shape {list(self.shape)} "
                             f"on dim {dim} to [{start}, {start + length})")
        row = _numel(self.shape[1:])
        lo, hi = start * row, (start + length) * row
        out, at = [], 0
        for p in self.parts:
            n = p.numel()
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                out.append(p[a - at:b - at])
            at += n
        return Pieces(out, (length, *self.shape[1:]), self.dtype)


Lazy = Union["torch.Tensor", Pieces]


def rows(parts: Sequence[Lazy]) -> Lazy:
    """``parts`` concatenated on dim 0, deferred where possible: a :class:`Pieces` when
    every part is a CPU tensor (contiguous or already :class:`Pieces`), else one new
    tensor (meta tensors give a shape-only result). A single contiguous part is returned
    as it is."""
    import torch
    if not parts:
        raise ShapeError("internal error: nothing to concatenate")
    first = parts[0]
    rest = tuple(first.shape[1:])
    if any(p.dim() != first.dim() or tuple(p.shape[1:]) != rest or p.dtype != first.dtype for p in parts):
        raise ShapeError(f"cannot concatenate shapes {[list(p.shape) for p in parts]} on dim 0")
    shape = (sum(int(p.shape[0]) for p in parts), *rest)
    if len(parts) == 1 and (isinstance(first, Pieces) or first.is_contiguous()):
        return first  # already the whole result: no copy, deferred or not
    deferrable = all(isinstance(p, Pieces) or (p.device.type == "cpu" and p.is_contiguous()) for p in parts)
    if deferrable:
        flat: list[torch.Tensor] = []
        for p in parts:
            flat.extend(p.parts if isinstance(p, Pieces) else (p,))
        return Pieces(flat, shape, first.dtype)
    tensors = [materialize(p) for p in parts]
    if tensors[0].is_meta:
        return torch.empty(shape, dtype=first.dtype, device="meta")
    out = hugepages.empty(shape, first.dtype) if tensors[0].device.type == "cpu" else None
    return torch.cat(tensors, dim=0, out=out) if out is not None else torch.cat(tensors, dim=0)


def materialize(x: Lazy, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as one tensor: a tensor is returned as is; pieces are copied, in order, into
    ``out`` (a reused buffer of the right shape) or a new one on huge pages."""
    if not isinstance(x, Pieces):
        return x
    if out is None:
        out = hugepages.empty(tuple(x.shape), x.dtype)
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or not out.is_contiguous():
        raise ShapeError("internal error: buffer does not fit the pieces")
    flat = out.view(-1)
    at = 0
    for p in x.parts:
        flat[at:at + p.numel()].copy_(p)
        at += p.numel()
    return out
