"""Tests of the torch_dist checkpoint writer and reader against torch's own DCP."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import pickle
import random
import warnings
from collections.abc import Iterator
from typing import Any, BinaryIO

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_convert.errors import InputError, ShapeError, UnsafePickleError
from nemo_convert.formats.dist_checkpoint.distckpt import tiling_problems
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter, write_dist_metadata
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.tensors.base import ByteRegion

L, H, QKV, F, V = 3, 16, 24, 8, 32
P = "model.decoder.layers."
MODULES = ["self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed.*")
        yield


def gpt_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    return {
        "model.embedding.word_embeddings.weight": r(V, H),
        P + "self_attention.linear_qkv.layer_norm_weight": r(L, H, dtype=torch.float32),
        P + "self_attention.linear_qkv.weight": r(L, QKV, H),
        P + "self_attention.linear_proj.weight": r(L, H, H),
        P + "mlp.linear_fc1.layer_norm_weight": r(L, H, dtype=torch.float32),
        P + "mlp.linear_fc1.weight": r(L, 2 * F, H),
        P + "mlp.linear_fc2.weight": r(L, H, F, dtype=torch.float32),
        "model.decoder.final_layernorm.weight": r(H, dtype=torch.float32),
        "model.output_layer.weight": r(V, H),
    }


def extra_state_keys() -> list[str]:
    keys = [f"{P}{m}._extra_state/shard_{l}_{L}" for m in MODULES for l in range(L)]
    return keys + ["model.output_layer._extra_state/shard_0_1"]


def write_gpt(sink: Any, tensors: dict[str, torch.Tensor], folder: str = "model_weights",
              seed: int = 1) -> DistCheckpointWriter:
    """Per-layer chunks in shuffled order, whole chunks for the rest, plus extra states."""
    w = DistCheckpointWriter(sink, folder)
    jobs: list[tuple[str, tuple[int, ...], torch.Tensor]] = []
    for k, t in tensors.items():
        w.declare(k, tuple(t.shape), t.dtype)
        if ".layers." in k:
            jobs += [(k, (l,) + (0,) * (t.dim() - 1), t[l:l + 1]) for l in range(t.shape[0])]
        else:
            jobs.append((k, (0,) * t.dim(), t))
    random.Random(seed).shuffle(jobs)
    for k, off, t in jobs:
        w.write_chunk(k, off, t)
    for m in MODULES:
        for l in range(L):
            w.add_extra_state(f"{P}{m}._extra_state", l, L)
    w.add_extra_state("model.output_layer._extra_state", None, None)
    w.close()
    return w


def torch_load(path: str, tensors: dict[str, torch.Tensor], objects: list[str]) -> dict[str, Any]:
    sd: dict[str, Any] = {k: torch.zeros_like(t) for k, t in tensors.items()}
    sd.update({k: "placeholder" for k in objects})
    dcp.load(sd, checkpoint_id=path, no_dist=True)
    return sd


class RecordingSink:
    """A MemberSink over memory whose streams cannot seek, checking one member at a time."""

    def __init__(self) -> None:
        self.members: dict[str, bytes] = {}
        self.order: list[str] = []
        self.open = False

    def add_bytes(self, name: str, data: bytes) -> None:
        assert not self.open
        self.members[name] = bytes(data)
        self.order.append(name)

    def add_file(self, name: str, path: str) -> None:
        with open(path, "rb") as f:
            self.add_bytes(name, f.read())

    @contextlib.contextmanager
    def open_member(self, name: str) -> Iterator[BinaryIO]:
        assert not self.open
        self.open = True
        buf = bytearray()

        class W(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b: Any) -> int:
                buf.extend(bytes(b))
                return len(bytes(b))

        try:
            yield W()  # type: ignore[misc]
        finally:
            self.open = False
        self.members[name] = bytes(buf)
        self.order.append(name)

    def to_dir(self, root: str) -> None:
        sink = DirectorySink(root)
        for name, data in self.members.items():
            sink.add_bytes(name, data)


# ---------------------------------------------------------------------------- writer


def test_torch_dcp_loads_what_we_write(tmp_path: Any) -> None:
    tensors = gpt_tensors()
    write_gpt(DirectorySink(str(tmp_path)), tensors)
    ckpt = str(tmp_path / "model_weights")
    assert sorted(os.listdir(ckpt)) == [".metadata", "__0_0.distcp", "common.pt", "metadata.json"]
    sd = torch_load(ckpt, tensors, extra_state_keys())
    for k, t in tensors.items():
        assert sd[k].dtype == t.dtype and torch.equal(sd[k], t), k
    for k in extra_state_keys():
        assert sd[k] == [None], k
    with open(os.path.join(ckpt, "metadata.json")) as f:
        assert json.load(f) == {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                "common_backend": "torch", "common_backend_version": 1}
    assert torch.load(os.path.join(ckpt, "common.pt"), weights_only=True) == {}
    md = dcp.FileSystemReader(ckpt).read_metadata()
    chunks = md.state_dict_metadata[P + "mlp.linear_fc1.weight"].chunks
    assert [tuple(c.offsets) for c in chunks] == [(l, 0, 0) for l in range(L)]
    assert all(tuple(c.sizes) == (1, 2 * F, H) for c in chunks)


def test_streaming_sink_order_and_one_member_at_a_time(tmp_path: Any) -> None:
    sink = RecordingSink()
    write_gpt(sink, gpt_tensors(), folder="weights")
    assert sink.order == ["weights/__0_0.distcp", "weights/.metadata", "weights/common.pt", "weights/metadata.json"]
    sink.to_dir(str(tmp_path))
    tensors = gpt_tensors()
    sd = torch_load(str(tmp_path / "weights"), tensors, extra_state_keys())
    assert all(torch.equal(sd[k], t) for k, t in tensors.items())


@pytest.mark.parametrize("shape", [(2, 5, 7), (3, 1024, 1024)])  # the second is checksummed while streamed
def test_chunk_item_is_what_torch_load_reads(tmp_path: Any, shape: tuple[int, ...]) -> None:
    """Each chunk item is a torch.save-format zip (as torch's FileSystemWriter writes), so
    torch.load of the item's byte range gives the tensor back; zip checksums are valid."""
    import io
    import zipfile

    t = torch.randn(*shape).bfloat16()
    w = DistCheckpointWriter(DirectorySink(str(tmp_path / "ours")), "")
    w.declare("k", shape, torch.bfloat16)
    w.write_chunk("k", (0,) * len(shape), t)
    (chunk,) = w.close().chunks
    with open(tmp_path / "ours" / "__0_0.distcp", "rb") as f:
        f.seek(chunk.offset)
        item = f.read(chunk.length)
    assert zipfile.ZipFile(io.BytesIO(item)).testzip() is None
    got = torch.load(io.BytesIO(item), weights_only=True)
    assert got.dtype == t.dtype and torch.equal(got, t)


def test_views_are_written_compactly(tmp_path: Any) -> None:
    big = torch.randn(600, 100)
    view = big[100:300, ::2]  # a strided view of a larger storage
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "")
    w.declare("k", (200, 50), torch.float32)
    w.write_chunk("k", (0, 0), view)
    (chunk,) = w.close().chunks
    assert chunk.length < view.nbytes + 4096
    src = DistCheckpointSource.from_dir(str(tmp_path))
    assert torch.equal(src.load("k"), view)


def test_gap_and_overlap_are_reported(tmp_path: Any) -> None:
    w = DistCheckpointWriter(DirectorySink(str(tmp_path / "a")), "")
    w.declare("x.layers.w", (3, 4, 2), torch.float32)
    w.write_chunk("x.layers.w", (0, 0, 0), torch.zeros(1, 4, 2))
    w.write_chunk("x.layers.w", (2, 0, 0), torch.zeros(1, 2, 2))
    with pytest.raises(ShapeError, match=r"missing \[1:2, 0:4, 0:2\], \[2:3, 2:4, 0:2\]"):
        w.close()
    assert not os.path.exists(tmp_path / "a" / "metadata.json")
    w = DistCheckpointWriter(DirectorySink(str(tmp_path / "b")), "")
    w.declare("y", (4,), torch.float32)
    w.write_chunk("y", (0,), torch.zeros(3))
    w.write_chunk("y", (2,), torch.zeros(2))
    with pytest.raises(ShapeError, match=r"written more than once \[2:3\]"):
        w.close()


def test_bad_chunks_are_refused(tmp_path: Any) -> None:
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "")
    w.declare("a", (2, 3), torch.bfloat16)
    with pytest.raises(ShapeError, match="before declare"):
        w.write_chunk("b", (0, 0), torch.zeros(1, 3))
    with pytest.raises(ShapeError, match="dtype"):
        w.write_chunk("a", (0, 0), torch.zeros(1, 3))
    with pytest.raises(ShapeError, match="outside"):
        w.write_chunk("a", (1, 1), torch.zeros(1, 3, dtype=torch.bfloat16))
    with pytest.raises(ShapeError, match="declared as"):
        w.declare("a", (2, 4), torch.bfloat16)
    with pytest.raises(ShapeError, match="layer 3"):
        w.add_extra_state("a._extra_state", 3, 3)


def test_several_ranks_merge_records(tmp_path: Any) -> None:
    t = torch.randn(L, 6, 4).bfloat16()
    sink = DirectorySink(str(tmp_path))
    records = []
    for rank in range(2):  # rank r holds rows [3r, 3r+3) of every layer (a TP split)
        w = DistCheckpointWriter(sink, "model_weights", data_file=f"__{rank}_0.distcp")
        w.declare("model.decoder.layers.w", tuple(t.shape), t.dtype)
        for l in range(L):
            w.write_chunk("model.decoder.layers.w", (l, 3 * rank, 0), t[l:l + 1, 3 * rank:3 * rank + 3])
        if rank == 0:
            for l in range(L):
                w.add_extra_state("model.decoder.layers._extra_state", l, L)
        records.append(pickle.loads(pickle.dumps(w.close(finalize=False))))
    assert not os.path.exists(tmp_path / "model_weights" / ".metadata")
    write_dist_metadata(sink, "model_weights", records)
    ckpt = str(tmp_path / "model_weights")
    sd = torch_load(ckpt, {"model.decoder.layers.w": t}, [f"model.decoder.layers._extra_state/shard_{l}_{L}"
                                                           for l in range(L)])
    assert torch.equal(sd["model.decoder.layers.w"], t)
    src = DistCheckpointSource.from_dir(ckpt, strip_prefix="model.")
    assert {src.group(f"decoder.layers.{l}.w") for l in range(L)} == {"__0_0.distcp"}
    for l in range(L):
        assert torch.equal(src.load(f"decoder.layers.{l}.w"), t[l])
    with pytest.raises(ShapeError, match="missing"):
        write_dist_metadata(sink, "other", records[:1])


# ---------------------------------------------------------------------------- reader


def test_source_unstacks_layers(tmp_path: Any) -> None:
    tensors = gpt_tensors()
    write_gpt(DirectorySink(str(tmp_path)), tensors)
    src = DistCheckpointSource.from_dir(tmp_path / "model_weights", strip_prefix="model.")
    expected = {}
    for k, t in tensors.items():
        name = k[len("model."):]
        if ".layers." in name:
            expected.update({name.replace("layers.", f"layers.{l}.", 1): t[l] for l in range(L)})
        else:
            expected[name] = t
    assert sorted(src.keys()) == sorted(expected)
    assert sorted(src.extra_state_keys) == sorted(extra_state_keys())
    for name, t in expected.items():
        info = src.info(name)
        assert info.shape == tuple(t.shape) and info.dtype == t.dtype
        got = src.load(name)
        assert got.dtype == t.dtype and torch.equal(got, t), name
        assert src.group(name) == "__0_0.distcp"
    assert src.load_object(extra_state_keys()[0]) == [None]
    src.close()


def test_source_does_not_keep_the_unpickled_metadata(tmp_path: Any) -> None:
    """The reader indexes ``.metadata`` and drops its object graph (tens of MiB at
    DeepSeek-V3's 92k chunks); :attr:`metadata` reads it again on first use."""
    write_gpt(DirectorySink(str(tmp_path)), gpt_tensors())
    src = DistCheckpointSource.from_dir(tmp_path / "model_weights", strip_prefix="model.")
    assert src._metadata is None
    md = src.metadata
    assert src.metadata is md  # kept once asked for
    assert sorted(md.state_dict_metadata) == sorted([*src._raw, *src._objects])
    src.close()


def test_layer_load_reads_only_its_chunks(tmp_path: Any, monkeypatch: Any) -> None:
    write_gpt(DirectorySink(str(tmp_path)), gpt_tensors())
    src = DistCheckpointSource.from_dir(tmp_path / "model_weights", strip_prefix="model.")
    seen: list[tuple[int, ...]] = []
    real = src._chunk_rows

    def spy(raw: str, c: Any, lo: int, hi: int) -> torch.Tensor:
        seen.append(c.offsets)
        return real(raw, c, lo, hi)

    monkeypatch.setattr(src, "_chunk_rows", spy)
    src.load("decoder.layers.1.mlp.linear_fc1.weight")
    assert seen == [(1, 0, 0)]


def test_reads_checkpoint_saved_by_torch(tmp_path: Any) -> None:
    tensors = gpt_tensors(3)
    state: dict[str, Any] = dict(tensors)
    state[f"{P}mlp.linear_fc1._extra_state/shard_0_{L}"] = [None]
    # torch keeps the strides of a dense non-contiguous tensor: exercise that layout too.
    strided = torch.randn(5, H, L).permute(2, 1, 0)
    state["model.decoder.layers.strided"] = strided
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    DirectorySink(str(tmp_path)).add_bytes("metadata.json", json.dumps({"sharded_backend": "torch_dist"}).encode())
    for mmap in (True, False):
        src = DistCheckpointSource.from_dir(tmp_path, strip_prefix="model.", mmap=mmap)
        for l in range(L):
            got = src.load(f"decoder.layers.{l}.self_attention.linear_qkv.weight")
            assert torch.equal(got, tensors[P + "self_attention.linear_qkv.weight"][l])
            got = src.load(f"decoder.layers.{l}.mlp.linear_fc2.weight")
            assert torch.equal(got, tensors[P + "mlp.linear_fc2.weight"][l])
        assert torch.equal(src.load("output_layer.weight"), tensors["model.output_layer.weight"])
        for l in range(L):
            assert torch.equal(src.load(f"decoder.layers.{l}.strided"), strided[l])
        assert src.extra_state_keys == [f"{P}mlp.linear_fc1._extra_state/shard_0_{L}"]


def test_metadata_with_megatron_save_plans(tmp_path: Any) -> None:
    """Megatron-Core 0.16 adds every rank's SavePlan to .metadata (``all_local_plans``)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

    write_gpt(DirectorySink(str(tmp_path)), gpt_tensors())
    path = tmp_path / "model_weights" / ".metadata"
    md = pickle.loads(path.read_bytes())
    md.all_local_plans = [SavePlan(items=[WriteItem(index=MetadataIndex("x"), type=WriteItemType.BYTE_IO)])]
    path.write_bytes(pickle.dumps(md))
    src = DistCheckpointSource.from_dir(tmp_path / "model_weights", strip_prefix="model.")
    assert len(src.keys()) == 3 + 6 * L


def _old_mcore_classes(monkeypatch: Any) -> tuple[type, type]:
    """Megatron-Core 0.15's ``MCoreMetadata`` and ``MCoreSavePlan`` re-declared as they were
    (strategies/torch.py L462-474 at core_v0.15.0: dataclasses adding ``mcore_data`` to
    torch's ``Metadata`` and ``SavePlan``), reachable under their real module path so that
    ``pickle`` names them exactly as Megatron did. Megatron itself is never imported."""
    import dataclasses
    import sys
    import types

    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import SavePlan

    mod_name = "megatron.core.dist_checkpointing.strategies.torch"
    parts = mod_name.split(".")
    for i in range(1, len(parts)):
        if ".".join(parts[:i]) not in sys.modules:
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    fake = types.ModuleType(mod_name)
    monkeypatch.setitem(sys.modules, mod_name, fake)

    @dataclasses.dataclass
    class MCoreMetadata(Metadata):
        mcore_data: Any = None

    @dataclasses.dataclass(frozen=True)
    class MCoreSavePlan(SavePlan):
        mcore_data: Any = None

    for cls in (MCoreMetadata, MCoreSavePlan):
        cls.__module__, cls.__qualname__ = mod_name, cls.__name__
        setattr(fake, cls.__name__, cls)
    return MCoreMetadata, MCoreSavePlan


@pytest.mark.parametrize("version", ["0.14", "0.15"])
def test_metadata_from_older_megatron_core(tmp_path: Any, monkeypatch: Any, version: str) -> None:
    """Megatron-Core 0.8-0.14 set ``Metadata.mcore_data`` (strategies/torch.py L502 at
    core_v0.14.0), 0.15 pickles ``MCoreMetadata``; both add ``all_local_plans`` of
    ``MCoreSavePlan`` (state_dict_saver.py L141-144). Read without --trust-pickle."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import BytesIOWriteData, TensorWriteData, WriteItem, WriteItemType

    mcore_md, mcore_plan = _old_mcore_classes(monkeypatch)
    tensors = gpt_tensors(5)
    write_gpt(DirectorySink(str(tmp_path)), tensors)
    path = tmp_path / "model_weights" / ".metadata"
    md = pickle.loads(path.read_bytes())
    mcore_data = {k: {} for k in tensors}
    mcore_data["model.embedding.word_embeddings.weight"] = {"nd_reformulated_orig_global_shape": (V, H)}
    items = [WriteItem(index=MetadataIndex("model.output_layer.weight", torch.Size([0, 0])), type=WriteItemType.SHARD,
                       tensor_data=TensorWriteData(ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([V, H])),
                                                   TensorProperties(torch.bfloat16), torch.Size([V, H]))),
             WriteItem(index=MetadataIndex("x/shard_0_1"), type=WriteItemType.BYTE_IO,
                       bytes_io_data=BytesIOWriteData(nbytes=10))]
    plans = [mcore_plan(items=items, planner_data={}, mcore_data=mcore_data)]
    if version == "0.15":
        md = mcore_md(mcore_data=mcore_data, **vars(md))
    else:
        md.mcore_data = mcore_data
    md.all_local_plans = plans
    data = pickle.dumps(md)
    assert b"MCoreSavePlan" in data and (version == "0.14") != (b"MCoreMetadata" in data)
    path.write_bytes(data)
    monkeypatch.undo()  # reading must not need the classes
    src = DistCheckpointSource.from_dir(tmp_path / "model_weights", strip_prefix="model.")
    assert len(src.keys()) == 3 + 6 * L
    assert torch.equal(src.load("output_layer.weight"), tensors["model.output_layer.weight"])
    assert torch.equal(src.load("decoder.layers.2.mlp.linear_fc1.weight"), tensors[P + "mlp.linear_fc1.weight"][2])


def test_metadata_naming_other_megatron_classes_is_refused(tmp_path: Any) -> None:
    """Only the two record classes are allowed from Megatron's module, never code."""
    write_gpt(DirectorySink(str(tmp_path)), gpt_tensors())
    path = tmp_path / "model_weights" / ".metadata"
    mod = b"megatron.core.dist_checkpointing.strategies.torch"
    for name in (b"TorchDistSaveShardedStrategy", b"_get_filesystem_reader"):
        data = pickle.PROTO + bytes([4]) + b"\x8c" + bytes([len(mod)]) + mod + b"\x8c" + bytes([len(name)]) \
            + name + b"\x93)\x81." 
        path.write_bytes(data)
        with pytest.raises(UnsafePickleError, match=name.decode()):
            DistCheckpointSource.from_dir(tmp_path / "model_weights")


def test_chunks_split_along_a_second_axis(tmp_path: Any) -> None:
    qkv = torch.randn(L, QKV, H).bfloat16()
    proj = torch.randn(L, H, H)
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "")
    w.declare("model.decoder.layers.qkv", tuple(qkv.shape), qkv.dtype)
    w.declare("model.decoder.layers.proj", tuple(proj.shape), proj.dtype)
    jobs = []
    for l in range(L):
        for r, (a, b) in enumerate([(0, 10), (10, 17), (17, 24)]):  # uneven TP-like pieces
            jobs.append(("model.decoder.layers.qkv", (l, a, 0), qkv[l:l + 1, a:b]))
        for a in range(0, H, 4):
            jobs.append(("model.decoder.layers.proj", (l, 0, a), proj[l:l + 1, :, a:a + 4]))
    random.Random(5).shuffle(jobs)
    for k, off, t in jobs:
        w.write_chunk(k, off, t)
    w.close()
    sd = torch_load(str(tmp_path), {"model.decoder.layers.qkv": qkv, "model.decoder.layers.proj": proj}, [])
    assert torch.equal(sd["model.decoder.layers.qkv"], qkv) and torch.equal(sd["model.decoder.layers.proj"], proj)
    src = DistCheckpointSource.from_dir(tmp_path, strip_prefix="model.")
    for l in range(L):
        assert torch.equal(src.load(f"decoder.layers.{l}.qkv"), qkv[l])
        assert torch.equal(src.load(f"decoder.layers.{l}.proj"), proj[l])
    whole = DistCheckpointSource.from_dir(tmp_path, unstack=False)
    assert whole.keys() == ["model.decoder.layers.qkv", "model.decoder.layers.proj"]
    assert torch.equal(whole.load("model.decoder.layers.proj"), proj)


def test_row_chunks_load_as_pieces_of_the_mapped_file(tmp_path: Any) -> None:
    """Megatron's TP=2 chunking: fc1's gate and up halves per rank (mlp.py L276-333 at
    core_v0.16.1), vocabulary rows per rank; rows-only splits are deferred views of the data
    files (copied file to file by the writers), other splits are assembled per layer."""
    from nemo_convert.tensors.file_map import file_origin
    from nemo_convert.tensors.pieces import Pieces, materialize

    fc1, emb, proj = torch.randn(L, 2 * F, H), torch.randn(V, H), torch.randn(L, H, H)
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "")
    for k, t in (("fc1", fc1), ("emb", emb), ("proj", proj)):
        w.declare(f"model.decoder.layers.{k}" if k != "emb" else "model.emb", tuple(t.shape), t.dtype)
    jobs = [("model.emb", (r * V // 2, 0), emb[r * V // 2:(r + 1) * V // 2]) for r in (1, 0)]
    for l in range(L):
        for r in range(2):
            for half in range(2):
                a = half * F + r * F // 2
                jobs.append(("model.decoder.layers.fc1", (l, a, 0), fc1[l:l + 1, a:a + F // 2]))
            jobs.append(("model.decoder.layers.proj", (l, 0, r * H // 2), proj[l:l + 1, :, r * H // 2:(r + 1) * H // 2]))
    random.Random(3).shuffle(jobs)
    for k, off, t in jobs:
        w.write_chunk(k, off, t)
    w.close()
    src = DistCheckpointSource.from_dir(tmp_path, strip_prefix="model.")
    for l in range(L):
        lazy = src.load_lazy(f"decoder.layers.{l}.fc1")
        assert isinstance(lazy, Pieces) and len(lazy.parts) == 4
        assert all(file_origin(p) is not None for p in lazy.parts)
        assert torch.equal(materialize(lazy), fc1[l]) and torch.equal(src.load(f"decoder.layers.{l}.fc1"), fc1[l])
        got = src.load_lazy(f"decoder.layers.{l}.proj")  # split along columns: one assembled tensor
        assert isinstance(got, torch.Tensor) and torch.equal(got, proj[l])
    lazy = src.load_lazy("emb")
    assert isinstance(lazy, Pieces) and torch.equal(materialize(lazy), emb)


@pytest.mark.parametrize("kept", [None, 1])
def test_chunks_spanning_several_layers(tmp_path: Any, monkeypatch: Any, kept: int | None) -> None:
    """Each layer reads its rows of chunks that hold several layers; also when the reader
    keeps one chunk layout only (read again after another chunk's)."""
    from nemo_convert.formats.dist_checkpoint import distckpt_read

    if kept is not None:
        monkeypatch.setattr(distckpt_read, "_CHUNKS_KEPT", kept)
    t = torch.randn(4, 6, 2)
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "")
    w.declare("decoder.layers.w", (4, 6, 2), torch.float32)
    w.write_chunk("decoder.layers.w", (0, 0, 0), t[0:3, :4])
    w.write_chunk("decoder.layers.w", (0, 4, 0), t[0:3, 4:])
    w.write_chunk("decoder.layers.w", (3, 0, 0), t[3:])
    w.close()
    src = DistCheckpointSource.from_dir(tmp_path)
    for l in range(4):
        assert torch.equal(src.load(f"decoder.layers.{l}.w"), t[l])
    if kept is not None:
        assert len(src._layouts) == 1
        assert torch.equal(src.load("decoder.layers.0.w"), t[0])


def test_per_layer_layout_with_split_fc1(tmp_path: Any) -> None:
    g = torch.Generator().manual_seed(7)
    tensors = {}
    for l in range(2):
        tensors[f"module.decoder.layers.{l}.mlp.linear_fc1.weight_w"] = torch.randn(F, H, generator=g).bfloat16()
        tensors[f"module.decoder.layers.{l}.mlp.linear_fc1.weight_v"] = torch.randn(F, H, generator=g).bfloat16()
        tensors[f"module.decoder.layers.{l}.mlp.linear_fc2.weight"] = torch.randn(H, F, generator=g).bfloat16()
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "weights")
    for k, t in tensors.items():
        w.declare(k, tuple(t.shape), t.dtype)
        w.write_chunk(k, (0, 0), t)
    w.close()
    src = DistCheckpointSource.from_dir(tmp_path / "weights", strip_prefix="module.")
    assert src.keys() == [f"decoder.layers.{l}.mlp.{m}" for l in range(2)
                          for m in ("linear_fc1.weight", "linear_fc2.weight")]
    for l in range(2):
        name = f"decoder.layers.{l}.mlp.linear_fc1.weight"
        assert src.info(name).shape == (2 * F, H)
        want = torch.cat([tensors[f"module.{name}_w"], tensors[f"module.{name}_v"]], 0)
        assert torch.equal(src.load(name), want)
        fc2 = f"decoder.layers.{l}.mlp.linear_fc2.weight"
        assert torch.equal(src.load(fc2), tensors["module." + fc2])


def test_members_read_in_place_from_one_file(tmp_path: Any) -> None:
    """A tar-like accessor: members are regions of one file, aligned or not."""
    sink = RecordingSink()
    tensors = gpt_tensors(4)
    write_gpt(sink, tensors, folder="")
    for pad in (512, 3):  # 512: tar-like alignment (mapped); 3: misaligned (rows read)
        blob, regions = bytearray(), {}
        path = str(tmp_path / f"archive{pad}")
        for name, data in sink.members.items():
            blob += b"\0" * pad
            regions[name] = (len(blob), len(data))
            blob += data
        with open(path, "wb") as f:
            f.write(blob)

        def open_region(name: str, path: str = path, regions: dict = regions) -> ByteRegion:
            off, n = regions[name]
            return ByteRegion(path, off, n)

        src = DistCheckpointSource(open_region, strip_prefix="model.")
        for l in range(L):
            want = tensors[P + "mlp.linear_fc2.weight"][l]
            assert torch.equal(src.load(f"decoder.layers.{l}.mlp.linear_fc2.weight"), want)
        assert torch.equal(src.load("embedding.word_embeddings.weight"), tensors["model.embedding.word_embeddings.weight"])
        src.close()


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_chunkings_round_trip(tmp_path_factory: Any, data: Any) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    t = torch.arange(torch.tensor(shape).prod().item(), dtype=torch.float32).reshape(shape)
    cuts = [sorted(set(data.draw(st.lists(st.integers(1, s - 1), max_size=2)) if s > 1 else [])) for s in shape]
    edges = [[0] + c + [s] for c, s in zip(cuts, shape)]
    boxes = [()]
    for e in edges:
        boxes = [b + ((a, z),) for b in boxes for a, z in itertools.pairwise(e)]
    root = str(tmp_path_factory.mktemp("rand"))
    w = DistCheckpointWriter(DirectorySink(root), "")
    w.declare("layers.x", shape, torch.float32)
    for box in data.draw(st.permutations(boxes)):
        w.write_chunk("layers.x", tuple(a for a, _ in box), t[tuple(slice(a, z) for a, z in box)])
    w.close()
    src = DistCheckpointSource.from_dir(root)
    for i in range(shape[0]):
        assert torch.equal(src.load(f"layers.{i}.x"), t[i])
    assert tiling_problems(shape, [(tuple(a for a, _ in b), tuple(z - a for a, z in b)) for b in boxes[1:]])[0] \
        or len(boxes) == 1


# ---------------------------------------------------------------------------- errors


def test_missing_metadata_json(tmp_path: Any) -> None:
    dcp.save({"a": torch.zeros(2)}, checkpoint_id=str(tmp_path), no_dist=True)
    with pytest.raises(InputError, match=r"is not a distributed checkpoint \(no metadata.json\)"):
        DistCheckpointSource.from_dir(tmp_path)


def test_zarr_is_refused_by_the_torch_dist_reader(tmp_path: Any) -> None:
    # zarr is read where a .nemo opens its model_weights/ (tests/test_zarr.py); the torch_dist
    # reader that Megatron directories and training checkpoints use says so
    (tmp_path / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr", "sharded_backend_version": 1}))
    with pytest.raises(InputError, match="zarr backend, which nemo-convert reads inside a .nemo"):
        DistCheckpointSource.from_dir(tmp_path)


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_malicious_metadata_pickle(tmp_path: Any, monkeypatch: Any) -> None:
    write_gpt(DirectorySink(str(tmp_path)), gpt_tensors())
    ckpt = tmp_path / "model_weights"
    (ckpt / ".metadata").write_bytes(pickle.dumps({"x": _Boom()}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafePickleError, match="posix.system|os.system"):
        DistCheckpointSource.from_dir(ckpt)
    assert not (tmp_path / "pwned").exists()
    (ckpt / ".metadata").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(InputError, match="not a torch distributed-checkpoint Metadata"):
        DistCheckpointSource.from_dir(ckpt)


def test_truncated_data_file(tmp_path: Any) -> None:
    write_gpt(DirectorySink(str(tmp_path)), gpt_tensors())
    data = tmp_path / "model_weights" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    # named when the checkpoint is opened (issue 20: inspect, which reads no tensor, said nothing)
    with pytest.raises(InputError, match=r"data file __0_0.distcp is truncated: .* needs bytes \[\d+, \d+\) but it "
                                         r"has \d+"):
        DistCheckpointSource.from_dir(tmp_path / "model_weights", strip_prefix="model.")


def test_inspect_checks_the_data_files_against_metadata(tmp_path: Any, cli: Any) -> None:
    """``inspect`` exited 0 on a truncated ``.distcp``; the sizes ``.metadata`` records are
    checked now (a stat per file; no tensor is read)."""
    from tiny_models import make_tiny_llama

    from nemo_convert import api

    hf = make_tiny_llama(str(tmp_path / "hf"))
    nemo = tmp_path / "m.nemo"
    api.import_hf(hf, str(nemo), packed=False)
    assert cli("inspect", str(nemo), "-q")[0] == 0
    data = nemo / "model_weights" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-1])
    code, _, err = cli("inspect", str(nemo))
    assert code == 2 and err.startswith(f"nemo-convert: error: {nemo}:model_weights: data file __0_0.distcp is "
                                        "truncated: ") and err.count("\n") == 1


def test_corrupted_chunk_is_an_input_error(tmp_path: Any) -> None:
    w = DistCheckpointWriter(DirectorySink(str(tmp_path)), "")
    w.declare("a", (4,), torch.float32)
    w.write_chunk("a", (0,), torch.ones(4))
    w.close()
    data = tmp_path / "__0_0.distcp"
    data.write_bytes(b"\x00" * data.stat().st_size)
    with pytest.raises(InputError, match="cannot read a chunk of a"):
        DistCheckpointSource.from_dir(tmp_path).load("a")


def test_metadata_pickle_is_byte_identical_to_torchs() -> None:
    """Writing never imports torch.distributed.checkpoint; the stand-in pickle must equal
    pickle.dumps of torch's own Metadata for the same records."""
    import pickle

    from torch.distributed.checkpoint import filesystem as dcp_fs

    from nemo_convert.errors import ShapeError
    from nemo_convert.formats.dist_checkpoint import distckpt as d
    from nemo_convert.formats.dist_checkpoint.dcp_pickle import metadata_bytes

    assert d.DCP_VERSION == getattr(dcp_fs, "CURRENT_DCP_VERSION", d.DCP_VERSION)
    rec = d.DistRecords(
        tensors={"a": ((2, 3), torch.bfloat16), "b": ((4,), torch.float32), "c": ((3, 2, 2), torch.float16)},
        chunks=[d.ChunkRecord("a", (1, 0), (1, 3), "__0_0.distcp", 64, 10),
                d.ChunkRecord("a", (0, 0), (1, 3), "__0_0.distcp", 0, 10),
                d.ChunkRecord("b", (0,), (4,), "__1_0.distcp", 0, 20),
                d.ChunkRecord("c", (0, 0, 0), (3, 1, 2), "__1_0.distcp", 64, 30),
                d.ChunkRecord("c", (0, 1, 0), (3, 1, 2), "__1_0.distcp", 128, 30)],
        objects=[d.ObjectRecord("x._extra_state/shard_0_2", "__2_0.distcp", 0, 5),
                 d.ObjectRecord("x._extra_state/shard_1_2", "__2_0.distcp", 64, 5)])
    tensors, objects = d.metadata_entries(rec, ShapeError)
    assert metadata_bytes(tensors, objects, d.DCP_VERSION) == pickle.dumps(torch_metadata(rec))



def moe_like_records(experts: int = 64, layers: int = 8, ranks: int = 3) -> Any:
    """A large MoE-like record set: per layer a ``[E, 2F, H]`` and an ``[E, H, F]`` expert
    key written one expert (chunk) at a time, round-robin over several data files, plus
    dense tensors of several dtypes, a BYTE_IO object per layer and ``_extra_state``
    shards — over a thousand chunk records, a pickle of several 64 KiB frames."""
    from nemo_convert.formats.dist_checkpoint import distckpt as d

    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    chunks, objects, pos = [], [], [0] * ranks

    def add(key: str, offsets: tuple[int, ...], sizes: tuple[int, ...], n: int) -> None:
        r = len(chunks) % ranks
        chunks.append(d.ChunkRecord(key, offsets, sizes, f"__{r}_0.distcp", pos[r], n))
        pos[r] += n + 300  # lengths past one and two bytes, as real offsets grow

    add("embedding.word_embeddings.weight", (0, 0), (4096, 768), 4096 * 768 * 2)
    tensors["embedding.word_embeddings.weight"] = ((4096, 768), torch.bfloat16)
    for layer in range(layers):
        p = f"decoder.layers.{layer}."
        tensors[p + "mlp.router.weight"] = ((experts, 768), torch.float32)
        add(p + "mlp.router.weight", (0, 0), (experts, 768), experts * 768 * 4)
        for name, shape in (("linear_fc1.weight", (experts, 3072, 768)), ("linear_fc2.weight", (experts, 768, 1536))):
            key = p + "mlp.experts." + name
            tensors[key] = (shape, torch.bfloat16)
            for e in range(experts):
                add(key, (e, 0, 0), (1, *shape[1:]), shape[1] * shape[2] * 2)
        tensors[p + "self_attention.linear_qkv.layer_norm_weight"] = ((768,), torch.float16)
        for half in range(2):  # a tensor in two chunks
            add(p + "self_attention.linear_qkv.layer_norm_weight", (384 * half,), (384,), 768)
        objects.append(d.ObjectRecord(p + "self_attention.core_attention._extra_state/shard_0_1",
                                      f"__{layer % ranks}_0.distcp", 2**33 + layer, 9))
        objects += [d.ObjectRecord(f"{p}mlp.experts.linear_fc1._extra_state/shard_{e}_{experts}",
                                   f"__{e % ranks}_0.distcp", 70000 * e, 5) for e in range(0, experts, 8)]
    return d.DistRecords(tensors=tensors, chunks=chunks, objects=objects)


def test_metadata_pickle_is_byte_identical_to_torchs_for_many_chunks() -> None:
    """The fast (C-pickler) writer and the stand-in fallback both equal pickle.dumps of
    torch's own Metadata for a large MoE-like record set (several frames)."""
    from nemo_convert.formats.dist_checkpoint import dcp_pickle
    from nemo_convert.formats.dist_checkpoint import distckpt as d

    rec = moe_like_records()
    tensors, objects = d.metadata_entries(rec, ShapeError)
    assert sum(len(c) for *_, c in tensors) > 1000 and len(objects) > 20
    want = pickle.dumps(torch_metadata(rec))
    assert len(want) > 2 * 65536
    assert dcp_pickle.metadata_bytes(tensors, objects, d.DCP_VERSION) == want
    assert dcp_pickle._metadata_stub(tensors, objects, d.DCP_VERSION) == want


def _random_entries(n_tensors: int, n_objects: int, seed: int, max_chunks: int = 3,
                    big: bool = False) -> tuple[list[Any], list[Any]]:
    """Random ``metadata_entries``-shaped records: 0-4-d shapes, 1..max_chunks chunks, two
    data files (one path object each, and on odd seeds a fresh equal string per chunk),
    three dtypes; ``big``: ints past 32 bits and keys past 255 bytes."""
    import random

    r = random.Random(seed)
    files = ["__0_0.distcp", "__1_0.distcp"]
    tensors = []
    for i in range(n_tensors):
        nd = r.choice([0, 1, 2, 3, 4])
        shape = tuple(r.choice([1, 3, 300, 70000, 3_000_000_000 if big else 5]) for _ in range(nd))
        chunks = [(tuple(r.randint(0, 70000) for _ in range(nd)), shape,
                   r.choice(files) if seed % 2 == 0 else "".join(r.choice(files)),
                   r.randint(0, 2**40 if big else 300), r.randint(0, 70000))
                  for _ in range(r.randint(1, max_chunks) if nd else 1)]
        key = f"decoder.layers.{i}.w" + ("x" * r.choice([0, 300]) if big else "")
        tensors.append((key, shape, r.choice([torch.bfloat16, torch.float32, torch.float8_e4m3fn]), chunks))
    objects = [(f"o/{i}", r.choice(files), r.randint(0, 1000), r.randint(0, 9)) for i in range(n_objects)]
    return tensors, objects


@pytest.mark.parametrize("args", [(0, 0, 0), (1, 0, 1), (0, 1, 2), (2, 1, 3), (500, 3, 4), (999, 1, 5),
                                  (1000, 0, 6), (998, 2, 7), (3000, 5, 9), (30, 0, 10, 1200),
                                  (1500, 7, 11, 3, True)])
def test_metadata_stream_equals_the_c_pickler(args: tuple[Any, ...]) -> None:
    """The record-by-record writer gives the C pickler's bytes (itself pinned to torch's
    above): frames of 64 KiB split at the same opcode, dict and list batches of 1000 (a dict
    of exactly 1000 items ends with an empty batch), one-item containers, memo indices past
    255, ints past 8/16/32 bits, keys past 255 bytes, equal paths as one or many objects."""
    from nemo_convert.formats.dist_checkpoint import dcp_emit, dcp_pickle

    tensors, objects = _random_entries(*args)
    assert dcp_emit.streamable(tensors, objects, "0.16")
    got = dcp_emit.metadata_stream(tensors, objects, "0.16")
    assert got == dcp_pickle._metadata_pickled(tensors, objects, "0.16")
    assert dcp_pickle.metadata_bytes(tensors, objects, "0.16") == got
    # handed on a frame at a time (what write_dist_metadata streams into its member): the same bytes
    frames: list[bytes | bytearray] = []
    rest = dcp_emit.metadata_stream(tensors, objects, "0.16", frames.append)
    assert b"".join(frames) + rest == got
    assert bool(frames) == (len(got) > 70_000)  # frames of 64 KiB: a small pickle is all "rest"
    frames.clear()
    dcp_pickle.write_metadata(frames.append, tensors, objects, "0.16")
    assert b"".join(frames) == got


def test_metadata_stream_negative_control() -> None:
    """The comparison above can fail: one offset changed gives other bytes."""
    from nemo_convert.formats.dist_checkpoint import dcp_emit, dcp_pickle

    tensors, objects = _random_entries(50, 1, 0)
    key, shape, dtype, chunks = tensors[7]
    other = [*tensors[:7], (key, shape, dtype, [(*chunks[0][:3], chunks[0][3] + 1, chunks[0][4]), *chunks[1:]]),
             *tensors[8:]]
    assert dcp_emit.metadata_stream(other, objects, "0.16") != dcp_pickle._metadata_pickled(tensors, objects, "0.16")


@pytest.mark.parametrize("odd", ["size", "Metadata", "torch", "bfloat16", "__0_0.distcp", "0.16"])
def test_metadata_stream_declines_strings_that_could_share_a_memo_entry(odd: str) -> None:
    """A key equal to a fixed string, a path or the version could be the same object and
    share its memo entry: the C pickler writes those, the same bytes."""
    from nemo_convert.formats.dist_checkpoint import dcp_emit, dcp_pickle

    tensors, objects = _random_entries(3, 0, 0)
    tensors[1] = (odd, *tensors[1][1:])
    assert not dcp_emit.streamable(tensors, objects, "0.16")
    assert dcp_pickle.metadata_bytes(tensors, objects, "0.16") == dcp_pickle._metadata_pickled(tensors, objects, "0.16")
    frames: list[bytes | bytearray] = []
    dcp_pickle.write_metadata(frames.append, tensors, objects, "0.16")
    assert frames == [dcp_pickle._metadata_pickled(tensors, objects, "0.16")]  # at once


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_metadata_read_from_a_region_of_a_file(tmp_path: Any, protocol: int) -> None:
    """``.metadata`` is unpickled from a file object over its region (a frame at a time,
    never whole in memory): the same records as from its bytes, for protocol 2 too
    (protocol 2 names classes by ``GLOBAL``, which ends in newlines: ``RegionReader.readline``),
    bytes around it untouched."""
    from nemo_convert.formats.dist_checkpoint.distckpt_meta import load_metadata

    rec = moe_like_records(experts=4, layers=2, ranks=2)
    data = pickle.dumps(torch_metadata(rec), protocol=protocol)
    path = tmp_path / "member"
    path.write_bytes(b"x\n" * 50 + data + b"\ntrailing\n")
    with ByteRegion(str(path), 100, len(data)).open() as f:
        got = load_metadata(f, "f")
        assert f.tell() == len(data)  # read to the STOP opcode, not past the region
    want = load_metadata(data, "b")
    assert got.state_dict_metadata.keys() == want.state_dict_metadata.keys()
    assert {k._key(): (v.relative_path, v.offset, v.length) for k, v in got.storage_data.items()} == {
        k._key(): (v.relative_path, v.offset, v.length) for k, v in want.storage_data.items()}
    assert len(got.storage_data) == len(rec.chunks) + len(rec.objects)
    assert got.version == want.version


def test_region_reader_readline(tmp_path: Any) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b"ab\n" + b"c" * 600 + b"\nd\nlast")
    with ByteRegion(str(path), 1, len(b"ab\n" + b"c" * 600 + b"\nd\nlast") - 1).open() as f:
        assert f.readline() == b"b\n"
        assert f.readline(5) == b"ccccc"
        assert f.readline() == b"c" * 595 + b"\n"
        assert f.readline() == b"d\n"
        assert f.readline() == b"last"
        assert f.readline() == b""


def test_metadata_pickle_falls_back_when_a_key_looks_like_a_module() -> None:
    """A key spelled like the look-alike module name cannot corrupt the pickle: the fast
    writer sees the name twice and falls back to the stand-in pickler."""
    from nemo_convert.formats.dist_checkpoint import dcp_pickle
    from nemo_convert.formats.dist_checkpoint import distckpt as d

    odd = dcp_pickle._MD_FAST.__name__
    for names in ([odd], [dcp_pickle._FS_FAST.__name__], ["a", odd + "x"], ["\x8c%" + odd]):
        rec = d.DistRecords(tensors={n: ((2,), torch.float32) for n in names},
                            chunks=[d.ChunkRecord(n, (0,), (2,), "__0_0.distcp", 0, 8) for n in names],
                            objects=[d.ObjectRecord(odd + "._extra_state", "__0_0.distcp", 64, 5)])
        tensors, objects = d.metadata_entries(rec, ShapeError)
        assert dcp_pickle.metadata_bytes(tensors, objects, d.DCP_VERSION) == pickle.dumps(torch_metadata(rec))
    rec = d.DistRecords(tensors={}, chunks=[], objects=[])
    assert dcp_pickle.metadata_bytes([], [], d.DCP_VERSION) == pickle.dumps(torch_metadata(rec))

def torch_metadata(records: Any) -> Any:
    """torch's own ``Metadata`` for ``records`` (the reference our stand-in pickle must equal)."""
    from torch.distributed.checkpoint import filesystem as dcp_fs
    from torch.distributed.checkpoint import metadata as md

    from nemo_convert.formats.dist_checkpoint import distckpt as d

    tensors, objects = d.metadata_entries(records, ShapeError)
    state: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for key, shape, dtype, chunks in tensors:
        state[key] = md.TensorStorageMetadata(
            properties=md.TensorProperties(dtype=dtype), size=torch.Size(shape),
            chunks=[md.ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(siz))
                    for off, siz, _, _, _ in chunks])
        for i, (off, _, path, offset, length) in enumerate(chunks):
            storage[md.MetadataIndex(key, off, i)] = dcp_fs._StorageInfo(path, offset, length)
    for key, path, offset, length in objects:
        state[key] = md.BytesStorageMetadata()
        storage[md.MetadataIndex(key)] = dcp_fs._StorageInfo(path, offset, length)
    return md.Metadata(state_dict_metadata=state, planner_data={k: (k,) for k in state},
                       storage_data=storage, storage_meta=None, version=d.DCP_VERSION)


@pytest.mark.slow  # a fresh interpreter
def test_reading_a_dist_nemo_never_imports_torch_distributed_checkpoint(tmp_path: Any) -> None:
    """torch.distributed.checkpoint costs ~0.9 s to import; reading .metadata uses stand-ins."""
    import subprocess
    import sys

    from nemo_convert import api
    from nemo_convert.examples import make_tiny_llama

    make_tiny_llama(str(tmp_path / "hf"), num_hidden_layers=2)
    api.import_hf(str(tmp_path / "hf"), str(tmp_path / "m.nemo"))
    code = ("import sys; from nemo_convert import api; "
            f"api.reshard({str(tmp_path / 'm.nemo')!r}, {str(tmp_path / 'r.nemo')!r}, tp=2); "
            f"api.export_hf({str(tmp_path / 'r.nemo')!r}, {str(tmp_path / 'back')!r}); "
            "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.checkpoint')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_metadata_stand_ins_read_torchs_own_pickle() -> None:
    """A pickle of torch's real Metadata (incl. StorageMeta and a save plan) reads into the
    stand-ins with the same fields; MetadataIndex keys compare on (fqn, offset) only."""
    from torch.distributed.checkpoint import metadata as md
    from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

    from nemo_convert.formats.dist_checkpoint import distckpt as d
    from nemo_convert.formats.dist_checkpoint.distckpt_meta import MetadataIndex, load_metadata

    rec = d.DistRecords(tensors={"a": ((2, 3), torch.bfloat16)},
                        chunks=[d.ChunkRecord("a", (1, 0), (1, 3), "__0_0.distcp", 64, 10),
                                d.ChunkRecord("a", (0, 0), (1, 3), "__0_0.distcp", 0, 10)],
                        objects=[d.ObjectRecord("x._extra_state", "__1_0.distcp", 0, 5)])
    real = torch_metadata(rec)
    real.storage_meta = md.StorageMeta(checkpoint_id="/ckpt", save_id="s")
    real.all_local_plans = [SavePlan(items=[WriteItem(index=md.MetadataIndex("x"), type=WriteItemType.BYTE_IO)])]
    got = load_metadata(pickle.dumps(real), ".metadata")
    assert got.state_dict_metadata["a"].properties.dtype is torch.bfloat16
    assert [tuple(c.offsets) for c in got.state_dict_metadata["a"].chunks] == [(0, 0), (1, 0)]
    assert got.storage_data[MetadataIndex("a", (1, 0), index=7)].offset == 64
    assert got.storage_data[MetadataIndex("x._extra_state")].relative_path == "__1_0.distcp"
    assert got.storage_data[MetadataIndex("a", [0, 0])].offset == 0
    assert MetadataIndex("a", (2, 0)) not in got.storage_data
    assert got.storage_meta.checkpoint_id == "/ckpt"


@pytest.mark.parametrize("kept", [None, (1, 0)])
def test_overlapping_chunks_are_found_by_dim0_offset_exactly_as_by_scanning(kept, monkeypatch):
    """``_overlapping`` searches the chunks sorted by their dim-0 offset (one key stacks a
    chunk per layer and expert, and every entry asks): it returns exactly the chunks a
    scan of every chunk finds, in ``.metadata`` order — for regular per-entry chunks,
    irregular grids (columns with different row cuts), empty chunks and 0-d tensors; also
    when the cache keeps one key only (sorted again each time another key was asked)."""
    import random
    from collections import OrderedDict

    from nemo_convert.formats.dist_checkpoint import distckpt_read

    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource, _Chunk, _Part

    def scan(src, part):
        starts, sizes = src._box(part)
        return [c for c in src._raw[part.raw][2]
                if all(co < s + n and s < co + cn for co, cn, s, n in zip(c.offsets, c.sizes, starts, sizes))]

    rnd = random.Random(0)
    src = DistCheckpointSource.__new__(DistCheckpointSource)
    if kept is not None:
        monkeypatch.setattr(distckpt_read, "_KEYS_KEPT", kept[0])
        monkeypatch.setattr(distckpt_read, "_SORT_AGAIN", kept[1])
    src._by_start = OrderedDict()
    src._raw = {}

    def cuts(n):
        inner = sorted(rnd.sample(range(1, n), rnd.randint(0, min(4, n - 1))))
        return list(zip([0, *inner], [*inner, n]))

    for k in range(30):  # irregular: every column block has its own row cuts
        rows_, cols = rnd.randint(1, 12), rnd.randint(1, 9)
        chunks = [_Chunk((a, c0), (b - a, c1 - c0), "f", 0, 0) for c0, c1 in cuts(cols) for a, b in cuts(rows_)]
        chunks.append(_Chunk((rnd.randrange(rows_), 0), (0, cols), "f", 0, 0))  # an empty chunk
        rnd.shuffle(chunks)
        src._raw[f"t{k}"] = ((rows_, cols), torch.float32, chunks)
    src._raw["stacked"] = ((6, 4, 3), torch.float32, [_Chunk((i, e, 0), (1, 1, 3), "f", 0, 0)
                                                       for e in range(4) for i in range(6)])
    src._raw["scalar"] = ((), torch.float32, [_Chunk((), (), "f", 0, 0)])
    parts = [_Part(raw, ()) for raw in src._raw]
    parts += [_Part(raw, (i,)) for raw, (shape, _, _) in src._raw.items() if shape for i in range(shape[0])]
    parts += [_Part("stacked", (i, e)) for i in range(6) for e in range(4)]
    for part in parts:
        assert src._overlapping(part) == scan(src, part), part
    if kept is not None:
        assert list(src._by_start) == ["stacked"]


def test_the_one_dim_tiling_shortcut_agrees_with_the_grid(monkeypatch):
    """Every key is checked for exact tiling on write; chunks along one dimension (layers,
    experts, a TP split) are answered without the grid. Whenever the shortcut says "tiled",
    the grid finds neither gaps nor overlaps (random boxes, many along one dimension)."""
    from nemo_convert.formats.dist_checkpoint import distckpt

    rnd = random.Random(1)
    shortcut, said_tiled = distckpt._tiles_along_one_dim, 0
    for _ in range(3000):
        shape = tuple(rnd.randint(0, 5) for _ in range(rnd.randint(1, 3)))
        boxes = []
        for _ in range(rnd.randint(0, 5)):
            off = tuple(rnd.randint(0, e) for e in shape)
            size = tuple(rnd.randint(0, e - o) for o, e in zip(off, shape))
            if rnd.random() < 0.7:  # along one dimension, full in the others
                d = rnd.randrange(len(shape))
                off = tuple(o if k == d else 0 for k, o in enumerate(off))
                size = tuple(s if k == d else shape[k] for k, s in enumerate(size))
            boxes.append((off, size))
        if shortcut(shape, boxes):
            said_tiled += 1
            monkeypatch.setattr(distckpt, "_tiles_along_one_dim", lambda *a: False)
            assert distckpt.tiling_problems(shape, boxes) == ([], []), (shape, boxes)
            monkeypatch.setattr(distckpt, "_tiles_along_one_dim", shortcut)
    assert said_tiled > 20
    assert not shortcut((4, 3), [((0, 0), (2, 3)), ((2, 0), (2, 3)), ((2, 0), (2, 3))])  # an overlap
    assert tiling_problems((4, 3), [((0, 0), (2, 3)), ((3, 0), (1, 3))]) == (["[2:3, 0:3]"], [])


def test_extra_state_bytes_are_torch_saves_own():
    """``[None]`` is saved once per process and reused: the bytes are ``torch.save``'s."""
    from nemo_convert.formats.dist_checkpoint.distckpt_write import _object_bytes

    buf = io.BytesIO()
    torch.save([None], buf)
    assert _object_bytes([None]) == buf.getvalue() == _object_bytes([None])
    buf = io.BytesIO()
    torch.save([None, None], buf)
    assert _object_bytes([None, None]) == buf.getvalue()


def test_chunk_layout_templates_give_the_layouts_of_a_full_read(tmp_path: Any, monkeypatch: Any) -> None:
    """A chunk archive that differs from one read before only in its tensor's bytes (and
    their CRC) takes that one's layout, moved; anything else is read in full — shapes of
    one byte length, a torch.save archive, and archives changed outside their data, which
    then read exactly as without templates (refused, or their own layout)."""
    from nemo_convert.formats.dist_checkpoint import distckpt_chunk
    from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter
    from nemo_convert.tensors.file_map import FileMap

    path = str(tmp_path / "chunks.bin")
    tensors = [torch.randn(4, 8).to(torch.bfloat16), torch.randn(8, 4).to(torch.bfloat16),
               torch.randn(4, 8).to(torch.bfloat16), torch.randn(8, 4).to(torch.bfloat16), torch.randn(3, 5)]
    spans = []
    with open(path, "wb") as f:
        for t in tensors:
            start = f.tell()
            TorchSaveWriter(f).save_tensor(t, flush=False)
            spans.append((start, f.tell() - start))
        start = f.tell()
        torch.save(torch.randn(4, 8).to(torch.bfloat16), f)
        spans.append((start, f.tell() - start))
    raw = bytearray(open(path, "rb").read())
    bad = []  # copies of the third archive changed in its index, its directory's CRC, its local header
    crc = raw[spans[2][0] + 14:spans[2][0] + 18]  # the data record's CRC, in its local header
    central = raw.find(b"PK\x01\x02", spans[2][0]) + 16
    assert raw[central:central + 4] == crc
    for where in (raw.find(b"BFloat16Storage", spans[2][0]), central, spans[2][0] + 14):
        start = len(raw)
        raw += raw[spans[2][0]:spans[2][0] + spans[2][1]]
        raw[start + where - spans[2][0]] ^= 0x01
        bad.append((start, spans[2][1]))
    with open(path, "wb") as f:
        f.write(raw)
    fmap = FileMap(path)

    full_reads: list[int] = []
    read = distckpt_chunk.read_tensor_archive
    monkeypatch.setattr(distckpt_chunk, "read_tensor_archive",
                        lambda region, mapped=None: full_reads.append(region.offset) or read(region, mapped))

    def layouts() -> list[Any]:
        distckpt_chunk._TEMPLATES.clear()
        full_reads.clear()
        return [distckpt_chunk.read_layout(ByteRegion(path, o, n), fmap.view(o, n)) for o, n in spans + bad]

    got = layouts()
    assert full_reads == [o for i, (o, _) in enumerate(spans + bad) if i not in (2, 3)]  # 2, 3: from templates
    monkeypatch.setattr(distckpt_chunk, "_TEMPLATES", {})
    monkeypatch.setattr(distckpt_chunk, "_remember", lambda *a: None)
    want = layouts()
    assert got == want
    assert [g.shape if g else None for g in got[:5]] == [(4, 8), (8, 4), (4, 8), (8, 4), (3, 5)]
    assert got[-3] is None  # the index's CRC fails: refused, as without templates
    assert got[-2] is not None and got[-2].crc32 == got[2].crc32 ^ 1  # the directory's CRC is the record's
    fmap.close()


def test_objects_written_in_batches_are_the_same_bytes_and_load(tmp_path: Any, monkeypatch: Any) -> None:
    """The BYTE_IO objects are gathered with their padding and written in batches: a
    batch size smaller than one object gives the same files, which torch's reader loads."""
    from nemo_convert.formats.dist_checkpoint import distckpt_write

    tensors = gpt_tensors()
    write_gpt(DirectorySink(str(tmp_path / "big")), tensors)
    monkeypatch.setattr(distckpt_write, "_OBJECTS_BATCH", 7)
    write_gpt(DirectorySink(str(tmp_path / "small")), tensors)
    for name in (".metadata", "__0_0.distcp"):
        assert (tmp_path / "big" / "model_weights" / name).read_bytes() == \
            (tmp_path / "small" / "model_weights" / name).read_bytes()
    sd = torch_load(str(tmp_path / "small" / "model_weights"), tensors, extra_state_keys())
    assert all(sd[k] == [None] for k in extra_state_keys()) and len(extra_state_keys()) > 1
