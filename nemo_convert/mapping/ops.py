"""The tensor math of conversions, each piece written once.

Every function is pure (tensors in, tensors out), works on ``meta`` tensors (the planner
runs them on meta tensors to learn output shapes before any byte is read), and has its
inverse next to it. Plugins never call these directly: they name intent in their
mapping rules and the core calls the math.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_convert.errors import ShapeError
from nemo_convert.tensors import hugepages
from nemo_convert.tensors.pieces import Lazy, materialize, rows

if TYPE_CHECKING:
    import torch


def concat(tensors: list[torch.Tensor], dim: int = 0, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.cat``, but shape-only on meta tensors (``torch.cat`` on meta tensors pulls in
    the compiler stack, ~1 s) and into ``out`` when given (a reused buffer)."""
    import torch
    if tensors and tensors[0].is_meta:
        shape = list(tensors[0].shape)
        for t in tensors[1:]:
            if t.dim() != len(shape) or any(a != b for i, (a, b) in enumerate(zip(t.shape, shape)) if i != dim):
                raise ShapeError(f"cannot concatenate shapes {[list(x.shape) for x in tensors]} on dim {dim}")
        shape[dim] = sum(t.shape[dim] for t in tensors)
        return torch.empty(shape, dtype=tensors[0].dtype, device="meta")
    if (out is None and tensors and tensors[0].device.type == "cpu"
            and all(t.dtype == tensors[0].dtype and t.dim() == tensors[0].dim() for t in tensors)):
        shape = list(tensors[0].shape)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        out = hugepages.empty(shape, tensors[0].dtype)
    if out is not None:
        return torch.cat(tensors, dim=dim, out=out)
    return torch.cat(tensors, dim=dim)


class BufferPool:
    """Reusable output buffers, one per (shape, dtype), for fused tensors.

    Safe only when each fused tensor is consumed (written) before the next task runs,
    which is how the engine drives the writers; disabled unless a conversion enables it.
    """

    def __init__(self) -> None:
        self.enabled = False
        #: how many buffers of one shape take turns: more than the tensors that can be in
        #: flight at once (queued for, or being written by, the writer thread)
        self.rotation = 1
        self._buffers: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self._turn: dict[tuple[tuple[int, ...], torch.dtype], int] = {}

    def get(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
        if not self.enabled or like.is_meta or like.device.type != "cpu":
            return None
        key = (tuple(shape), like.dtype)
        ring = self._buffers.setdefault(key, [])
        turn = self._turn.get(key, 0) % max(1, self.rotation)
        self._turn[key] = turn + 1
        while len(ring) <= turn:
            ring.append(hugepages.empty(shape, like.dtype))
        return ring[turn]


def _expect(t: Lazy, dim0: int, what: str, rest: tuple[int, ...] | None = None) -> None:
    if t.dim() == 0 or t.shape[0] != dim0 or (rest is not None and tuple(t.shape[1:]) != rest):
        want = (dim0,) + (rest if rest is not None else tuple(t.shape[1:]))
        raise ShapeError(f"{what} has shape {list(t.shape)}, but the config implies {list(want)}")


def fuse_qkv_lazy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, heads: int, groups: int,
                  head_dim: int) -> Lazy:
    """Megatron's grouped QKV: per query group g, its ``heads/groups`` query heads, then
    ``k_g``, then ``v_g`` (``head_dim`` rows each). Works for weights ``[rows, in]`` and
    biases ``[rows]`` alike. Deferred (:mod:`nemo_convert.tensors.pieces`): the pieces, in order."""
    if heads % groups:
        raise ShapeError(f"num_attention_heads={heads} is not a multiple of num_query_groups={groups}")
    per = heads // groups
    rest = tuple(q.shape[1:])
    _expect(q, heads * head_dim, "q", rest)
    _expect(k, groups * head_dim, "k", rest)
    _expect(v, groups * head_dim, "v", rest)
    parts = []
    for g in range(groups):
        parts += [q.narrow(0, g * per * head_dim, per * head_dim), k.narrow(0, g * head_dim, head_dim),
                  v.narrow(0, g * head_dim, head_dim)]
    return rows(parts)


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, heads: int, groups: int,
             head_dim: int, pool: BufferPool | None = None) -> torch.Tensor:
    """:func:`fuse_qkv_lazy`, copied into one tensor (a pooled buffer when given)."""
    import torch
    fused = fuse_qkv_lazy(q, k, v, heads=heads, groups=groups, head_dim=head_dim)
    out = pool.get(tuple(fused.shape), q) if pool is not None and not isinstance(fused, torch.Tensor) else None
    return materialize(fused, out)


def split_qkv_lazy(fused: Lazy, *, heads: int, groups: int, head_dim: int) -> tuple[Lazy, Lazy, Lazy]:
    """Inverse of :func:`fuse_qkv_lazy`: q, k and v, each the rows of its blocks in group
    order (views of ``fused`` where one block is the whole result, else pieces)."""
    if heads % groups:
        raise ShapeError(f"num_attention_heads={heads} is not a multiple of num_query_groups={groups}")
    per = heads // groups
    rest = tuple(fused.shape[1:])
    _expect(fused, (heads + 2 * groups) * head_dim, "fused qkv", rest)
    block = (per + 2) * head_dim
    q = [fused.narrow(0, g * block, per * head_dim) for g in range(groups)]
    k = [fused.narrow(0, g * block + per * head_dim, head_dim) for g in range(groups)]
    v = [fused.narrow(0, g * block + (per + 1) * head_dim, head_dim) for g in range(groups)]
    return rows(q), rows(k), rows(v)


def split_qkv(fused: torch.Tensor, *, heads: int, groups: int,
              head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`split_qkv_lazy` as tensors (views where one block is the whole result)."""
    q, k, v = split_qkv_lazy(fused, heads=heads, groups=groups, head_dim=head_dim)
    return materialize(q), materialize(k), materialize(v)


def regroup_qkv_lazy(packed: Lazy, *, heads: int, groups: int, head_dim: int) -> Lazy:
    """HF's packed ``[q; k; v]`` (Phi-3 ``qkv_proj``: all query heads, then all key heads,
    then all value heads) → Megatron's grouped QKV (:func:`fuse_qkv_lazy`). Deferred: the
    rows of ``packed``, reordered."""
    _expect(packed, (heads + 2 * groups) * head_dim, "packed qkv", tuple(packed.shape[1:]))
    q = packed.narrow(0, 0, heads * head_dim)
    k = packed.narrow(0, heads * head_dim, groups * head_dim)
    v = packed.narrow(0, (heads + groups) * head_dim, groups * head_dim)
    return fuse_qkv_lazy(q, k, v, heads=heads, groups=groups, head_dim=head_dim)  # type: ignore[arg-type]


def ungroup_qkv_lazy(fused: Lazy, *, heads: int, groups: int, head_dim: int) -> Lazy:
    """Inverse of :func:`regroup_qkv_lazy`: Megatron's grouped QKV → packed ``[q; k; v]``."""
    return rows(list(split_qkv_lazy(fused, heads=heads, groups=groups, head_dim=head_dim)))


def transpose_2d(t: Lazy) -> torch.Tensor:
    """A 2-D weight transposed, as a new contiguous tensor (its own inverse). HF's
    ``Conv1D`` (GPT-2) stores ``[in, out]`` and computes ``x @ W``; a linear layer
    (Megatron, and HF's ``nn.Linear``) stores ``[out, in]``. On ``meta`` tensors: the shape."""
    m = materialize(t)
    if m.dim() != 2:
        raise ShapeError(f"a Conv1D weight is 2-D, this one has shape {list(m.shape)}")
    if m.is_meta:
        return m.new_empty((m.shape[1], m.shape[0]))
    return m.t().contiguous()


def add_scalar(t: torch.Tensor, value: float) -> torch.Tensor:
    """``t + value`` in ``t``'s dtype, as a new tensor (never in place: sources are views of
    input files). For weights stored with a constant offset, e.g. NeMo 1 Gemma norms
    (``1 + w``) against Hugging Face's zero-centred ``w``."""
    import torch
    return torch.add(t, value)


def fuse_gated_lazy(gate: torch.Tensor, up: torch.Tensor, *, ffn: int | None = None) -> Lazy:
    """Megatron's gated fc1: ``[gate; up]`` on dim 0 (the activation applies to the first
    half). Deferred: the two pieces."""
    if ffn is not None:
        _expect(gate, ffn, "gate projection")
        _expect(up, ffn, "up projection", tuple(gate.shape[1:]))
    elif gate.shape != up.shape:
        raise ShapeError(f"gate {list(gate.shape)} and up {list(up.shape)} projections differ in shape")
    return rows([gate, up])


def fuse_gated(gate: torch.Tensor, up: torch.Tensor, *, ffn: int | None = None,
               pool: BufferPool | None = None) -> torch.Tensor:
    """:func:`fuse_gated_lazy`, copied into one tensor (a pooled buffer when given)."""
    import torch
    fused = fuse_gated_lazy(gate, up, ffn=ffn)
    out = pool.get(tuple(fused.shape), gate) if pool is not None and not isinstance(fused, torch.Tensor) else None
    return materialize(fused, out)


def split_gated(fc1: Lazy, *, ffn: int | None = None) -> tuple[Lazy, Lazy]:
    """Inverse of :func:`fuse_gated`; returns views (or pieces of pieces)."""
    if fc1.shape[0] % 2 or (ffn is not None and fc1.shape[0] != 2 * ffn):
        raise ShapeError(f"gated fc1 has {fc1.shape[0]} rows, expected 2 × ffn_hidden_size={ffn}")
    half = fc1.shape[0] // 2
    return fc1.narrow(0, 0, half), fc1.narrow(0, half, half)


def deinterleave_rows(t: torch.Tensor) -> Lazy:
    """Rows ``[0, 2, 4, …; 1, 3, 5, …]``: GPT-OSS's gate/up pairs (interleaved) → Megatron's
    ``[gate; up]``. Deferred: two strided views."""
    if t.shape[0] % 2:
        raise ShapeError(f"interleaved gate/up rows: {t.shape[0]} is odd")
    return rows([t[0::2], t[1::2]])


def interleave_rows(t: Lazy) -> torch.Tensor:
    """Inverse of :func:`deinterleave_rows`: ``[gate; up]`` → rows ``g0, u0, g1, u1, …``."""
    import torch
    gate, up = split_gated(t)
    g, u = materialize(gate), materialize(up)
    if g.is_meta:
        return torch.empty((2 * g.shape[0], *g.shape[1:]), dtype=g.dtype, device="meta")
    return torch.stack([g, u], 1).reshape(2 * g.shape[0], *g.shape[1:])


def unstack_experts(fused: Lazy, *, experts: int, transpose: bool = False,
                    interleaved: bool = False) -> tuple[Lazy, ...]:
    """One tensor holding every expert on dim 0 (transformers v5's fused
    ``experts.gate_up_proj`` ``[E, 2I, H]``, ``experts.down_proj`` ``[E, H, I]``) → the
    experts' own tensors, in order (views). ``transpose``: each expert is stored as
    ``x @ W`` (GPT-OSS ``[E, H, 2I]``), Megatron's weight is ``W.T``; ``interleaved``: its
    gate/up rows alternate (:func:`deinterleave_rows`)."""
    if fused.dim() < 2 or fused.shape[0] != experts:
        raise ShapeError(f"fused experts tensor has shape {list(fused.shape)}, but the config implies "
                         f"{experts} experts on dim 0")
    rest = tuple(fused.shape[1:])
    out: list[Lazy] = []
    for e in range(experts):
        t = fused.narrow(0, e, 1).reshape(rest)
        if transpose:
            t = materialize(t).t()
        out.append(deinterleave_rows(materialize(t)) if interleaved else t)
    return tuple(out)


def stack_experts_lazy(parts: list[Lazy], *, transpose: bool = False, interleaved: bool = False) -> Lazy:
    """Inverse of :func:`unstack_experts`: the experts' tensors stacked on a new dim 0.
    Deferred: one piece per expert, so a writer copies them one at a time (a transposed or
    interleaved expert is one new tensor each)."""
    import torch
    if not parts:
        raise ShapeError("no experts to stack")
    shape = tuple(parts[0].shape)
    for p in parts[1:]:
        if tuple(p.shape) != shape:
            raise ShapeError(f"experts differ in shape: {list(shape)} vs {list(p.shape)}")
    out = []
    for p in parts:
        t: Lazy = interleave_rows(p) if interleaved else p
        if transpose:
            t = materialize(t).t()
            t = t.contiguous() if not t.is_meta else torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
        out.append(t.reshape(1, *t.shape))
    return rows(out)


def padded_vocab_size(vocab: int, divisible_by: int, tp: int = 1) -> int:
    """Megatron's padded vocabulary: the next multiple of ``divisible_by × tp``."""
    m = max(1, divisible_by) * max(1, tp)
    return -(-vocab // m) * m


def pad_vocab_lazy(t: Lazy, padded: int) -> Lazy:
    """Zero rows appended on dim 0 up to ``padded`` rows (no-op when already that size).
    Deferred where ``t`` can be: the rows of ``t``, then a block of zeros."""
    import torch
    if t.shape[0] > padded:
        raise ShapeError(f"vocabulary of {t.shape[0]} rows does not fit a padded size of {padded}")
    if t.shape[0] == padded:
        return t
    device = "cpu" if not isinstance(t, torch.Tensor) else t.device
    pad = torch.zeros((padded - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=device)
    return rows([t, pad])


def pad_vocab(t: torch.Tensor, padded: int) -> torch.Tensor:
    """:func:`pad_vocab_lazy` as one tensor."""
    return materialize(pad_vocab_lazy(t, padded))


def trim_vocab(t: Lazy, vocab: int) -> Lazy:
    """The first ``vocab`` rows (undoes :func:`pad_vocab`); a view."""
    if t.shape[0] < vocab:
        raise ShapeError(f"embedding has {t.shape[0]} rows, fewer than the vocabulary size {vocab}")
    return t.narrow(0, 0, vocab)


def largest_pow2_divisor(n: int, cap: int = 128) -> int:
    """Largest power of two ≤ ``cap`` dividing ``n`` (NeMo's choice of
    ``make_vocab_size_divisible_by`` so that TP=1 needs no padding)."""
    d = cap
    while d > 1 and n % d:
        d //= 2
    return d
