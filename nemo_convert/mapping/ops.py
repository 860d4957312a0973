"""The tensor math of conversions, each piece written once.

Every function is pure (tensors in, tensors out), works on ``meta`` tensors (the planner
runs them on meta tensors to learn output shapes before any byte is read), and has its
inverse next to it. Plugins never call these directly: they name intent in their
mapping rules and the core calls the math.
"""

from __future__ import annotations

import torch

from nemo_convert.errors import ShapeError


def _expect(t: torch.Tensor, dim0: int, what: str, rest: tuple[int, ...] | None = None) -> None:
    if t.dim() == 0 or t.shape[0] != dim0 or (rest is not None and tuple(t.shape[1:]) != rest):
        want = (dim0,) + (rest if rest is not None else tuple(t.shape[1:]))
        raise ShapeError(f"{what} has shape {list(t.shape)}, but the config implies {list(want)}")


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, heads: int, groups: int,
             head_dim: int) -> torch.Tensor:
    """Megatron's grouped QKV: per query group g, its ``heads/groups`` query heads, then
    ``k_g``, then ``v_g`` (``head_dim`` rows each). Works for weights ``[rows, in]`` and
    biases ``[rows]`` alike."""
    if heads % groups:
        raise ShapeError(f"num_attention_heads={heads} is not a multiple of num_query_groups={groups}")
    per = heads // groups
    rest = tuple(q.shape[1:])
    _expect(q, heads * head_dim, "q", rest)
    _expect(k, groups * head_dim, "k", rest)
    _expect(v, groups * head_dim, "v", rest)
    fused = torch.cat(
        [q.reshape(groups, per * head_dim, *rest), k.reshape(groups, head_dim, *rest),
         v.reshape(groups, head_dim, *rest)], dim=1)
    return fused.reshape(groups * (per + 2) * head_dim, *rest)


def split_qkv(fused: torch.Tensor, *, heads: int, groups: int,
              head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`; returns views of ``fused``."""
    if heads % groups:
        raise ShapeError(f"num_attention_heads={heads} is not a multiple of num_query_groups={groups}")
    per = heads // groups
    rest = tuple(fused.shape[1:])
    _expect(fused, (heads + 2 * groups) * head_dim, "fused qkv", rest)
    g = fused.reshape(groups, (per + 2) * head_dim, *rest)
    q, k, v = torch.split(g, [per * head_dim, head_dim, head_dim], dim=1)
    return (q.reshape(heads * head_dim, *rest), k.reshape(groups * head_dim, *rest),
            v.reshape(groups * head_dim, *rest))


def fuse_gated(gate: torch.Tensor, up: torch.Tensor, *, ffn: int | None = None) -> torch.Tensor:
    """Megatron's gated fc1: ``[gate; up]`` on dim 0 (the activation applies to the first half)."""
    if ffn is not None:
        _expect(gate, ffn, "gate projection")
        _expect(up, ffn, "up projection", tuple(gate.shape[1:]))
    elif gate.shape != up.shape:
        raise ShapeError(f"gate {list(gate.shape)} and up {list(up.shape)} projections differ in shape")
    return torch.cat([gate, up], dim=0)


def split_gated(fc1: torch.Tensor, *, ffn: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_gated`; returns views."""
    if fc1.shape[0] % 2 or (ffn is not None and fc1.shape[0] != 2 * ffn):
        raise ShapeError(f"gated fc1 has {fc1.shape[0]} rows, expected 2 × ffn_hidden_size={ffn}")
    half = fc1.shape[0] // 2
    return fc1[:half], fc1[half:]


def padded_vocab_size(vocab: int, divisible_by: int, tp: int = 1) -> int:
    """Megatron's padded vocabulary: the next multiple of ``divisible_by × tp``."""
    m = max(1, divisible_by) * max(1, tp)
    return -(-vocab // m) * m


def pad_vocab(t: torch.Tensor, padded: int) -> torch.Tensor:
    """Zero rows appended on dim 0 up to ``padded`` rows (no-op when already that size)."""
    if t.shape[0] > padded:
        raise ShapeError(f"vocabulary of {t.shape[0]} rows does not fit a padded size of {padded}")
    if t.shape[0] == padded:
        return t
    pad = torch.zeros((padded - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=0)


def trim_vocab(t: torch.Tensor, vocab: int) -> torch.Tensor:
    """The first ``vocab`` rows (undoes :func:`pad_vocab`); a view."""
    if t.shape[0] < vocab:
        raise ShapeError(f"embedding has {t.shape[0]} rows, fewer than the vocabulary size {vocab}")
    return t[:vocab]


def largest_pow2_divisor(n: int, cap: int = 128) -> int:
    """Largest power of two ≤ ``cap`` dividing ``n`` (NeMo's choice of
    ``make_vocab_size_divisible_by`` so that TP=1 needs no padding)."""
    d = cap
    while d > 1 and n % d:
        d //= 2
    return d
