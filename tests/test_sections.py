"""Hybrid stacks in the core: layers selected by their symbol in a per-layer pattern
(``{i:PATH=S}``), tensors split across TP ranks by sections
(:class:`nemo_convert.mapping.rules.Sections`), and a distributed checkpoint storing each
section under its own key — checked against Megatron-Core 0.16.1's own
``_split_tensor_factory`` (``ssm/mamba_mixer.py`` lines 1187–1244), slice by slice."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
import torch

from nemo_convert.errors import ConfigError, ShapeError, UnsupportedError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.distckpt_write import write_dist_metadata
from nemo_convert.formats.dist_checkpoint.sections import SectionsView, join_sections
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter
from nemo_convert.mapping.rules import Axes, Parallel, Sections
from nemo_convert.sharding.tensor import TensorParallel
from nemo_convert.tensors.base import ByteRegion, TensorInfo
from nemo_convert.tensors.pieces import Pieces, materialize

TP = TensorParallel()
#: a mixer's in_proj: d_inner 8, 2 groups × state 3, 4 heads
IN_PROJ = Sections(("z", "x", "B", "C", "dt"), (8, 8, 6, 6, 4))


def test_layers_are_selected_by_their_symbol() -> None:
    axes = Axes(6, 0, {"hybrid_override_pattern": "M-*ME-"})
    assert [i for i, _ in axes.expand("l.{i:hybrid_override_pattern=M}.w")] == [0, 3]
    assert [n for _, n in axes.expand("l.{i:hybrid_override_pattern=*}.w")] == ["l.2.w"]
    assert [i for i, _ in axes.expand("l.{i:hybrid_override_pattern=-E}.w")] == [1, 4, 5]
    listed = Axes(3, 0, {"p": ["M", "*", "M"]})  # a list of symbols reads alike
    assert [i for i, _ in listed.expand("{i:p=M}")] == [0, 2]
    assert [i for i, _ in axes.expand("{i}")] == list(range(6))


@pytest.mark.parametrize("pattern, words", [("M-*", "3 symbols for 6 layers"), (7, "neither a string"),
                                            (["M", "**"], "neither a string")])
def test_a_pattern_that_does_not_fit_is_refused_by_name(pattern: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Axes(6, 0, {"p": pattern}).expand("{i:p=M}")


@pytest.mark.parametrize("tp", [1, 2])
def test_sections_split_each_section_on_its_own(tp: int) -> None:
    g = torch.arange(32 * 3, dtype=torch.float32).reshape(32, 3)
    parts = [TP.split(g, IN_PROJ, tp, r) for r in range(tp)]
    starts = [0, 8, 16, 22, 28]
    for r, part in enumerate(parts):
        want = torch.cat([g[s + r * (n // tp): s + (r + 1) * (n // tp)] for s, n in zip(starts, IN_PROJ.sizes)])
        assert torch.equal(part, want)
    assert torch.equal(TP.merge(parts, IN_PROJ), g)
    lazy = TP.split_lazy(g, IN_PROJ, 2, 1)
    assert isinstance(lazy, Pieces) and torch.equal(materialize(lazy), TP.split(g, IN_PROJ, 2, 1))
    assert TP.local_shape((32, 3), IN_PROJ, 2) == (16, 3)
    if tp == 2:  # the contiguous column split is another layout: the kinds are not interchangeable
        assert not torch.equal(TP.split(g, Parallel.COLUMN, 2, 0), parts[0])


def test_a_section_that_does_not_split_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedError, match="section 'B' of 6 rows does not split into 4"):
        TP.local_shape((32, 3), IN_PROJ, 4)
    groups = Sections(("x", "B", "C"), (8, 6, 6), units=(4, 1, 1))  # one group of 6 state rows: whole on a rank
    with pytest.raises(UnsupportedError, match="section 'B' of 6 rows in 1 whole blocks does not split into 2"):
        TP.split(torch.zeros(20, 1), groups, 2, 0)
    with pytest.raises(ShapeError, match="31 rows are not the sections"):
        TP.split(torch.zeros(31, 3), IN_PROJ, 2, 0)


def _megatron_split_factory(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Megatron-Core 0.16.1's ``_split_tensor_factory``. ``ssm/mamba_mixer.py`` imports the
    dynamic-inference Triton kernels at module level (``inference/contexts/attention_context/
    triton/tensor_ops.py``: ``import triton``); they are not used here, and Triton is not
    installed: that one module is stood in for while the mixer module is imported."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("einops")
    name = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"
    if name not in sys.modules:
        ops = types.ModuleType(name)
        ops.tensor_get_slice_after = ops.tensor_masked_update = ops.tensor_merge = None  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, ops)
    monkeypatch.delitem(sys.modules, "megatron.core.ssm.mamba_mixer", raising=False)
    from megatron.core.ssm import mamba_mixer

    return mamba_mixer._split_tensor_factory


@pytest.mark.slow  # imports Megatron-Core (about 20 s)
@pytest.mark.parametrize("tp", [1, 2])
def test_sections_match_megatron_cores_split_tensor_factory(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    """Every rank's local tensor (our split) is cut by Megatron-Core's own factory into the
    section keys; each piece lands in its section's global tensor exactly where our layout
    has those rows, and the global shapes are the section sizes."""
    split_factory = _megatron_split_factory(monkeypatch)
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    g = torch.randn(32, 5, generator=torch.Generator().manual_seed(0))
    sections = dict(zip(IN_PROJ.names, (g[s:s + n] for _, s, n in IN_PROJ.spans())))
    seen: dict[str, list[tuple[int, int]]] = {k: [] for k in IN_PROJ.names}
    for rank in range(tp):
        local = TP.split(g, IN_PROJ, tp, rank)
        sh = ShardedTensor.from_rank_offsets("w", local, (0, rank, tp), replica_id=0)
        local_sizes = [n // tp for n in IN_PROJ.sizes]
        for piece in split_factory(sh, local_sizes, list(IN_PROJ.names), 0).build():
            section = piece.key.split(".")[-1]
            assert piece.key == f"w.{section}"
            assert piece.global_shape == (IN_PROJ.sizes[IN_PROJ.names.index(section)], 5)
            start, rows = piece.global_offset[0], piece.local_shape[0]
            assert torch.equal(piece.data, sections[section][start:start + rows]), (rank, section)
            seen[section].append((start, rows))
    for section, n in zip(IN_PROJ.names, IN_PROJ.sizes):  # the pieces tile every section once
        assert sorted(seen[section]) == [(r * (n // tp), n // tp) for r in range(tp)]


def test_dist_checkpoint_stores_one_key_per_section_and_reads_them_whole(tmp_path: Any) -> None:
    g = torch.randn(32, 5, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    norm = torch.randn(5)
    name = "decoder.layers.0.mixer.in_proj.weight"
    infos = [TensorInfo(name, tuple(g.shape), g.dtype),
             TensorInfo("decoder.layers.0.mixer.in_proj.layer_norm_weight", (5,), norm.dtype)]
    sink = DirectorySink(str(tmp_path))
    w = DistWeightsWriter(sink, infos, prefix="", folder="ckpt", sections={name: IN_PROJ},
                          unstacked=("decoder.layers.",))
    w.write(name, g)
    w.write(infos[1].name, norm)
    w.add_extra_states()
    write_dist_metadata(sink, "ckpt", [w.close(finalize=False)])
    root = os.path.join(str(tmp_path), "ckpt")
    src = DistCheckpointSource(lambda n: ByteRegion(os.path.join(root, n), 0, os.path.getsize(os.path.join(root, n))))
    assert sorted(src.keys()) == sorted([f"{name}.{s}" for s in IN_PROJ.names] + [infos[1].name])
    assert src.info(f"{name}.dt").shape == (4, 5) and src.info(f"{name}.B").shape == (6, 5)
    assert any(k.endswith("mixer.in_proj._extra_state/shard_0_1") for k in src.extra_state_keys)
    view = join_sections(src, {name: IN_PROJ, infos[1].name: Parallel.REPLICATED})
    assert isinstance(view, SectionsView) and sorted(view.keys()) == sorted([name, infos[1].name])
    assert view.info(name).shape == (32, 5) and view.info(name).dtype_name == "bfloat16"
    assert torch.equal(view.load(name), g) and torch.equal(materialize(view.load_lazy(name)), g)
    assert torch.equal(view.load(infos[1].name), norm)
    src.close()
