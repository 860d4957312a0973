"""Deferred pieces: the row-rearranging ops in their deferred form give, once materialized,
exactly what an independent eager computation gives; pieces slice and reshape like tensors."""

from __future__ import annotations

import pytest
import torch

from nemo_convert.errors import ShapeError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import Parallel
from nemo_convert.sharding.tensor import TensorParallel, deferred
from nemo_convert.tensors.pieces import Pieces, materialize, rows


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


def test_rows_of_contiguous_tensors_defer_and_materialize_to_cat():
    a, b, c = rand(3, 4), rand(1, 4), rand(5, 4)
    lazy = rows([a, b, c])
    assert isinstance(lazy, Pieces) and tuple(lazy.shape) == (9, 4)
    assert torch.equal(materialize(lazy), torch.cat([a, b, c]))
    assert all(p.data_ptr() in (a.data_ptr(), b.data_ptr(), c.data_ptr()) for p in lazy.parts)  # no copies


@pytest.mark.parametrize("start,length", [(0, 9), (0, 3), (2, 3), (3, 1), (4, 5), (8, 1), (5, 0)])
def test_narrow_across_piece_boundaries(start, length):
    parts = [rand(3, 4), rand(1, 4), rand(5, 4)]
    got = rows(parts).narrow(0, start, length)
    assert torch.equal(materialize(got), torch.cat(parts).narrow(0, start, length))


def test_nested_pieces_reshape_and_unsqueeze():
    a, b = rand(2, 6), rand(4, 6)
    inner = rows([a, b])
    outer = rows([inner.narrow(0, 1, 4), a])
    want = torch.cat([torch.cat([a, b])[1:5], a])
    assert torch.equal(materialize(outer), want)
    assert torch.equal(materialize(outer.reshape(3, 2, 6)), want.reshape(3, 2, 6))
    assert torch.equal(materialize(outer.reshape(-1)), want.reshape(-1))
    assert torch.equal(materialize(outer.unsqueeze(0)), want.unsqueeze(0))
    with pytest.raises(ShapeError):
        outer.narrow(1, 0, 2)


def test_non_contiguous_or_meta_parts_are_concatenated_at_once():
    a = rand(4, 6)
    strided = a.t()  # not contiguous
    out = rows([strided, strided])
    assert isinstance(out, torch.Tensor) and torch.equal(out, torch.cat([strided, strided]))
    meta = rows([torch.empty(2, 3, device="meta"), torch.empty(5, 3, device="meta")])
    assert isinstance(meta, torch.Tensor) and meta.is_meta and tuple(meta.shape) == (7, 3)
    with pytest.raises(ShapeError):
        rows([rand(2, 3), rand(2, 4)])
    # pieces followed by a part that cannot be deferred: everything is copied together
    strided_too = rand(6, 4).t()  # 4 x 6, not contiguous
    mixed = rows([rows([a[:2], a[2:]]), strided_too])
    assert isinstance(mixed, torch.Tensor) and torch.equal(mixed, torch.cat([a, strided_too]))


def test_materialize_into_a_given_buffer():
    a, b = rand(2, 3), rand(2, 3)
    buf = torch.empty(4, 3, dtype=torch.bfloat16)
    assert materialize(rows([a, b]), buf) is buf and torch.equal(buf, torch.cat([a, b]))
    with pytest.raises(ShapeError):
        materialize(rows([a, b]), torch.empty(3, 4, dtype=torch.bfloat16))


def _grouped_qkv_reference(q, k, v, heads, groups, head_dim):
    """Megatron's layout, computed independently: per group, its query heads, then k, then v."""
    per = heads // groups
    blocks = []
    for g in range(groups):
        blocks += [q[g * per * head_dim:(g + 1) * per * head_dim], k[g * head_dim:(g + 1) * head_dim],
                   v[g * head_dim:(g + 1) * head_dim]]
    return torch.cat(blocks)


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_fuse_qkv_lazy_matches_the_grouped_layout(groups, bias):
    heads, head_dim, hidden = 4, 3, 5
    rest = () if bias else (hidden,)
    q, k, v = rand(heads * head_dim, *rest), rand(groups * head_dim, *rest), rand(groups * head_dim, *rest)
    lazy = ops.fuse_qkv_lazy(q, k, v, heads=heads, groups=groups, head_dim=head_dim)
    want = _grouped_qkv_reference(q, k, v, heads, groups, head_dim)
    assert isinstance(lazy, Pieces)
    assert torch.equal(materialize(lazy), want)
    assert torch.equal(ops.fuse_qkv(q, k, v, heads=heads, groups=groups, head_dim=head_dim), want)
    pool = ops.BufferPool()
    pool.enabled = True
    assert torch.equal(ops.fuse_qkv(q, k, v, heads=heads, groups=groups, head_dim=head_dim, pool=pool), want)


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_qkv_regroups_as_deferred_rows_and_back(groups, bias):
    """Phi-3's ``qkv_proj`` = ``[q; k; v]`` → Megatron's grouped layout, and back."""
    heads, head_dim, hidden = 4, 3, 5
    rest = () if bias else (hidden,)
    q, k, v = rand(heads * head_dim, *rest), rand(groups * head_dim, *rest), rand(groups * head_dim, *rest)
    packed = torch.cat([q, k, v])
    lazy = ops.regroup_qkv_lazy(packed, heads=heads, groups=groups, head_dim=head_dim)
    want = _grouped_qkv_reference(q, k, v, heads, groups, head_dim)
    assert isinstance(lazy, Pieces) and torch.equal(materialize(lazy), want)
    back = ops.ungroup_qkv_lazy(want, heads=heads, groups=groups, head_dim=head_dim)
    assert torch.equal(materialize(back), packed)
    with pytest.raises(ShapeError, match="packed qkv"):
        ops.regroup_qkv_lazy(packed[1:], heads=heads, groups=groups, head_dim=head_dim)


def test_add_scalar_is_a_new_tensor():
    w = rand(4)
    out = ops.add_scalar(w, 1.0)
    assert out.data_ptr() != w.data_ptr() and torch.equal(out, w + 1.0)
    assert ops.add_scalar(torch.empty(3, device="meta"), 1.0).shape == (3,)


def test_gated_and_vocab_ops_lazy_and_eager_agree():
    gate, up = rand(6, 4), rand(6, 4)
    assert torch.equal(materialize(ops.fuse_gated_lazy(gate, up)), torch.cat([gate, up]))
    emb = rand(10, 4)
    padded = ops.pad_vocab_lazy(emb, 16)
    assert isinstance(padded, Pieces)
    want = torch.cat([emb, torch.zeros(6, 4, dtype=emb.dtype)])
    assert torch.equal(materialize(padded), want) and torch.equal(ops.pad_vocab(emb, 16), want)
    assert torch.equal(materialize(ops.trim_vocab(padded, 10)), emb)


KINDS = [Parallel.REPLICATED, Parallel.COLUMN, Parallel.QKV, Parallel.ROW, Parallel.GATED_FC1, Parallel.VOCAB]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tensor_parallel_lazy_split_and_merge_equal_the_eager_ones(kind, tp):
    tpm = TensorParallel()
    t = rand(24, 8) if kind is not Parallel.VOCAB else rand(22, 8)
    padded = 24 if kind is Parallel.VOCAB else None
    for r in range(tp):
        eager = tpm.split(t, kind, tp, r, padded_vocab=padded)
        assert torch.equal(materialize(tpm.split_lazy(t, kind, tp, r, padded_vocab=padded)), eager)
        # and from a deferred input (a merged source passed on to a split)
        assert torch.equal(materialize(tpm.split_lazy(rows([t[:5], t[5:]]), kind, tp, r, padded_vocab=padded)),
                           eager)
    slices = [tpm.split(t, kind, tp, r, padded_vocab=padded) for r in range(tp)]
    vocab = 22 if kind is Parallel.VOCAB else None
    merged = tpm.merge(slices, kind, vocab=vocab)
    assert torch.equal(materialize(tpm.merge_lazy(slices, kind, vocab=vocab)), merged)
    if kind is not Parallel.REPLICATED:
        assert torch.equal(merged, t)


def test_deferred_forms_never_bypass_an_overridden_split():
    class Mine(TensorParallel):
        def split(self, t, kind, tp, rank, *, name="tensor", padded_vocab=None):  # type: ignore[no-untyped-def]
            return super().split(t, kind, tp, rank, name=name, padded_vocab=padded_vocab)

    class Complete(Mine):
        def split_lazy(self, t, kind, tp, rank, *, name="tensor", padded_vocab=None):  # type: ignore[no-untyped-def]
            return super().split_lazy(t, kind, tp, rank, name=name, padded_vocab=padded_vocab)

    assert deferred(TensorParallel(), "split") is not None and deferred(TensorParallel(), "merge") is not None
    assert deferred(Mine(), "split") is None  # inherited split_lazy would skip Mine.split
    assert deferred(Mine(), "merge") is not None  # merge is not overridden
    assert deferred(Complete(), "split") is not None
    assert deferred(object(), "split") is None
