"""We read the zarr dist checkpoints NeMo saved (its default until Aug 2024) and NVIDIA published.

The fixtures under ``tests/data/zarr/`` were written by megatron-core 0.13.1's own zarr
strategy (``tests/data/zarr/make_fixtures.py``, README.md there): unpacked ``.nemo`` folders
of a tiny random Llama at fp32 and bf16, TP=1 and TP=2, and a Nemotron at bf16 TP=2. Here
they are read as folders and as ``.nemo`` tars (packed as NeMo packs them: an uncompressed
tar of the folder with arcname ``.``, nemo-formats.md §1.1), and ``inspect``, ``export``,
``verify`` and ``reshard`` must work on them: the export equals the HF source tensor for
tensor and logit for logit, and the reshard's torch_dist is what Megatron-Core 0.16.1 loads.

The format facts the reader relies on are pinned against the files themselves
(``test_the_fixtures_are_megatron_cores_layout``); hostile variants of them are refused with
one line, writing nothing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from typing import Any, Callable

import pytest
import torch
from test_hostile_inputs import fails_cleanly
from tiny_models import hf_tensors

from nemo_convert import api
from nemo_convert.errors import InputError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.zarr_read import ZarrCheckpointSource
from nemo_convert.tensors.base import ByteRegion
from nemo_convert.tensors.file_map import file_origin
from nemo_convert.tensors.pieces import Pieces

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zarr")
LLAMA = ["llama-tp1-fp32", "llama-tp2-fp32", "llama-tp1-bf16", "llama-tp2-bf16"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
L, H, NH, NG, F, VOCAB = 2, 32, 4, 2, 64, 96
FC2 = "model.decoder.layers.mlp.linear_fc2.weight"
FC1 = "model.decoder.layers.mlp.linear_fc1.weight"
EMB = "model.embedding.word_embeddings.weight"
IDS = torch.tensor([[1, 5, 9, 33, 70, 2, 60, 95, 7, 3, 64, 12]])  # within the 96-piece vocabulary


def fixture(name: str) -> str:
    return os.path.join(DATA, name)


def dtype_of(name: str) -> torch.dtype:
    return DTYPES[name.rsplit("-", 1)[1]]


def tp_of(name: str) -> int:
    return int(name.split("-")[1][2:])


def pack(folder: str, path: str) -> str:
    """A ``.nemo`` as NeMo's connector writes one: an uncompressed tar, arcname ``.``."""
    with tarfile.open(path, "w:") as tar:
        tar.add(folder, arcname=".")
    return path


def copy_fixture(name: str, tmp_path: Any) -> str:
    return shutil.copytree(fixture(name), str(tmp_path / name))


def zarray(folder: str, key: str) -> dict[str, Any]:
    with open(os.path.join(folder, "model_weights", key, ".zarray")) as f:
        return json.load(f)


def write_zarray(folder: str, key: str, meta: dict[str, Any]) -> None:
    with open(os.path.join(folder, "model_weights", key, ".zarray"), "w") as f:
        json.dump(meta, f, indent=4)


def source(family: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in hf_tensors(fixture(f"hf_{family}")).items()}


# ====================================================================================== the producer's layout
@pytest.mark.parametrize("name", LLAMA + ["nemotron-tp2-bf16"])
def test_the_fixtures_are_megatron_cores_layout(name: str) -> None:
    """What megatron-core's zarr strategy wrote (strategies/zarr.py L167-189 at core_v0.13.1):
    one folder per stacked key, chunks = the sharding grid (one layer × one TP fragment),
    ``compressor``/``fill_value`` null, bf16 as the patched string ``"bfloat16"``; the
    ShardedObjects as ``<key>/shard_<layer>_<L>.pt`` (strategies/common.py L50-64)."""
    root = os.path.join(fixture(name), "model_weights")
    tp = tp_of(name)
    with open(os.path.join(root, "metadata.json")) as f:
        assert json.load(f) == {"sharded_backend": "zarr", "sharded_backend_version": 1, "common_backend": "torch",
                                "common_backend_version": 1}
    fc1 = zarray(fixture(name), FC1)
    gated = name.startswith("llama")
    assert fc1 == {"chunks": [1, (2 if gated else 1) * F // ((2 if gated else 1) * tp), H], "compressor": None,
                   "dtype": "bfloat16" if dtype_of(name) == torch.bfloat16 else "<f4", "fill_value": None,
                   "filters": None, "order": "C", "shape": [L, (2 if gated else 1) * F, H], "zarr_format": 2}
    # the gated fc1 is cut into 2·TP fragments (gate halves, then up halves): mlp.py's swiglu factory
    fragments = 2 * tp if gated else tp
    assert sorted(os.listdir(os.path.join(root, FC1))) == sorted(
        [".zarray"] + [f"{layer}.{r}.0" for layer in range(L) for r in range(fragments)])
    assert sorted(os.listdir(os.path.join(root, FC2))) == sorted(
        [".zarray"] + [f"{layer}.0.{r}" for layer in range(L) for r in range(tp)])
    assert zarray(fixture(name), "model.decoder.final_layernorm.weight")["chunks"] == [H]
    assert os.listdir(os.path.join(root, "model.decoder.final_layernorm.weight")) in ([".zarray", "0"],
                                                                                      ["0", ".zarray"])
    objects = sorted(os.listdir(os.path.join(root, "model.decoder.layers.self_attention.linear_qkv._extra_state")))
    assert objects == [f"shard_{layer}_{L}.pt" for layer in range(L)]


# ====================================================================================== reading
@pytest.mark.parametrize("name", LLAMA)
def test_each_layer_is_read_from_its_own_chunks_in_place(name: str) -> None:
    src = ZarrCheckpointSource.from_dir(os.path.join(fixture(name), "model_weights"), strip_prefix="model.")
    whole = ZarrCheckpointSource.from_dir(os.path.join(fixture(name), "model_weights"), unstack=False)
    try:
        tp, dtype = tp_of(name), dtype_of(name)
        assert len(src.keys()) == 3 + 6 * L and all(src.info(k).dtype == dtype for k in src.keys())
        assert len(src.extra_state_keys) == 4 * L and not src.ignored
        for k in src.keys():
            stacked = "decoder.layers." in k
            raw = "model." + (k.replace(f"layers.{k.split('.')[2]}.", "layers.") if stacked else k)
            want = whole.load(raw)[int(k.split(".")[2])] if stacked else whole.load(raw)
            assert torch.equal(src.load(k), want), k
        # one layer of a stacked key is one chunk file's bytes, mapped in place (TP=1) …
        qkv = src.load("decoder.layers.1.self_attention.linear_qkv.weight")
        if tp == 1:
            origin = file_origin(qkv)
            assert origin is not None and origin.path.endswith("linear_qkv.weight/1.0.0") and origin.offset == 0
        # … and Megatron's row fragments of fc1 are handed to writers as file pieces (no copy)
        lazy = src.load_lazy("decoder.layers.1.mlp.linear_fc1.weight")
        assert isinstance(lazy, Pieces) and len(lazy.parts) == 2 * tp
        paths = [file_origin(p).path for p in lazy.parts]  # type: ignore[union-attr]
        assert [p.rsplit("/", 1)[1] for p in paths] == [f"1.{r}.0" for r in range(2 * tp)]
    finally:
        src.close()
        whole.close()


def test_few_chunk_files_are_open_at_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unpacked folder has one file per chunk (thousands for Nemotron-4-340B): at most
    ``max_open_maps`` stay mapped, and what was handed out before stays valid."""
    monkeypatch.setattr(ZarrCheckpointSource, "max_open_maps", 2)
    src = ZarrCheckpointSource.from_dir(os.path.join(fixture("llama-tp2-fp32"), "model_weights"),
                                        strip_prefix="model.")
    try:
        held = {k: src.load(k) for k in src.keys()}
        assert len(src._maps) == 2
        fresh = ZarrCheckpointSource.from_dir(os.path.join(fixture("llama-tp2-fp32"), "model_weights"),
                                              strip_prefix="model.", mmap=False)
        assert all(torch.equal(held[k], fresh.load(k)) for k in held)
        fresh.close()
    finally:
        src.close()
    api.export_hf(fixture("llama-tp2-fp32"), str(tmp_path / "hf"))
    want, got = source("llama", torch.float32), hf_tensors(str(tmp_path / "hf"))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def _rechunk(folder: str, key: str, chunks: list[int], pad: float, separator: str = ".") -> torch.Tensor:
    """Rewrite array ``key`` of an unpacked fixture with other chunks (edge chunks padded with
    ``pad``, as zarr stores them whole), returning the array as first read."""
    root = os.path.join(folder, "model_weights")
    src = ZarrCheckpointSource.from_dir(root, unstack=False)
    full = src.load(key).clone()
    src.close()
    meta = zarray(folder, key)
    shutil.rmtree(os.path.join(root, key))
    os.makedirs(os.path.join(root, key))
    grid = [-(-s // c) for s, c in zip(full.shape, chunks)]
    for index in torch.cartesian_prod(*[torch.arange(g) for g in grid]).reshape(-1, len(grid)).tolist():
        chunk = torch.full(chunks, pad, dtype=full.dtype)
        region, target = full, chunk
        for d, (i, c) in enumerate(zip(index, chunks)):
            n = min(c, full.shape[d] - i * c)
            region, target = region.narrow(d, i * c, n), target.narrow(d, 0, n)
        target.copy_(region)
        path = os.path.join(root, key, separator.join(map(str, index)))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(chunk.contiguous().view(torch.uint8).numpy().tobytes())
    write_zarray(folder, key, {**meta, "chunks": chunks, **({"dimension_separator": "/"} if separator == "/" else {})})
    return full


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "read"])
def test_any_chunking_and_zarrs_edge_padding(tmp_path: Any, mmap: bool) -> None:
    folder = copy_fixture("llama-tp1-bf16", tmp_path)
    emb = _rechunk(folder, EMB, [40, 20], pad=float("nan"))  # edge chunks in both dims, NaN padding
    fc2 = _rechunk(folder, FC2, [2, 32, 64], pad=0.0)  # one chunk holding both layers
    qkv_key = "model.decoder.layers.self_attention.linear_qkv.weight"
    qkv = _rechunk(folder, qkv_key, [1, 24, 32], pad=float("nan"), separator="/")  # nested chunk files
    src = ZarrCheckpointSource.from_dir(os.path.join(folder, "model_weights"), strip_prefix="model.", mmap=mmap)
    try:
        assert torch.equal(src.load("embedding.word_embeddings.weight"), emb)
        for layer in range(L):
            assert torch.equal(src.load(f"decoder.layers.{layer}.mlp.linear_fc2.weight"), fc2[layer])
            assert torch.equal(src.load(f"decoder.layers.{layer}.self_attention.linear_qkv.weight"), qkv[layer])
    finally:
        src.close()
    # the export is the source's, bit for bit
    api.export_hf(folder, str(tmp_path / "hf"))
    want, got = source("llama", torch.bfloat16), hf_tensors(str(tmp_path / "hf"))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_chunk_holding_every_layer_is_read_one_layer_at_a_time(tmp_path: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = copy_fixture("llama-tp1-fp32", tmp_path)
    fc2 = _rechunk(folder, FC2, [L, H, F], pad=0.0)
    reads: list[int] = []
    real = ByteRegion.read

    def spy(self: ByteRegion, start: int = 0, size: int | None = None) -> bytes:
        data = real(self, start, size)
        if self.path.endswith("linear_fc2.weight/0.0.0"):
            reads.append(len(data))
        return data

    monkeypatch.setattr(ByteRegion, "read", spy)
    src = ZarrCheckpointSource.from_dir(os.path.join(folder, "model_weights"), strip_prefix="model.", mmap=False)
    try:
        assert torch.equal(src.load("decoder.layers.1.mlp.linear_fc2.weight"), fc2[1])
    finally:
        src.close()
    assert reads == [H * F * 4]  # one layer's bytes, never the stacked [L, …] tensor


def test_zero_dim_arrays_fill_values_and_extra_files(tmp_path: Any) -> None:
    folder = copy_fixture("llama-tp1-fp32", tmp_path)
    root = os.path.join(folder, "model_weights")
    os.makedirs(os.path.join(root, "model.scalar"))
    with open(os.path.join(root, "model.scalar", ".zarray"), "w") as f:
        json.dump({"chunks": [], "compressor": None, "dtype": "<f4", "fill_value": None, "filters": None,
                   "order": "C", "shape": [], "zarr_format": 2}, f)
    with open(os.path.join(root, "model.scalar", "0"), "wb") as f:
        f.write(torch.tensor([2.5]).numpy().tobytes())
    os.remove(os.path.join(root, FC2, "1.0.0"))  # a missing chunk reads as fill_value where there is one
    write_zarray(folder, FC2, {**zarray(folder, FC2), "fill_value": "NaN"})
    with open(os.path.join(root, "README.md"), "w") as f:  # not part of the weights: listed, not read
        f.write("hello")
    src = ZarrCheckpointSource.from_dir(root, strip_prefix="model.")
    try:
        assert src.load("scalar").shape == () and src.load("scalar").item() == 2.5
        assert torch.isnan(src.load("decoder.layers.1.mlp.linear_fc2.weight")).all()
        assert not torch.isnan(src.load("decoder.layers.0.mlp.linear_fc2.weight")).any()
        assert src.ignored == ["README.md"]
    finally:
        src.close()


# ====================================================================================== the commands
@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
@pytest.mark.parametrize("name", LLAMA)
def test_export_equals_the_source(tmp_path: Any, name: str, packed: bool) -> None:
    src = pack(fixture(name), str(tmp_path / "m.nemo")) if packed else fixture(name)
    rep = api.export_hf(src, str(tmp_path / "hf"))
    assert not rep.warnings, rep.warnings
    dtype = dtype_of(name)
    want, got = source("llama", dtype), hf_tensors(str(tmp_path / "hf"))
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == dtype and torch.equal(got[k], want[k]), k
    with open(tmp_path / "hf" / "config.json") as f:
        cfg = json.load(f)
    with open(os.path.join(fixture("hf_llama"), "config.json")) as f:
        src_cfg = json.load(f)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id"):
        assert cfg[key] == src_cfg[key], key
    assert cfg["rope_theta"] == src_cfg["rope_parameters"]["rope_theta"]
    assert cfg["torch_dtype"] == {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    with open(tmp_path / "hf" / "tokenizer.model", "rb") as a, \
            open(os.path.join(fixture("hf_llama"), "tokenizer.model"), "rb") as b:
        assert a.read() == b.read()


def _logits(folder: str, dtype: torch.dtype, cls: str = "LlamaForCausalLM") -> torch.Tensor:
    import transformers

    model, info = getattr(transformers, cls).from_pretrained(folder, torch_dtype=dtype, output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        return model.eval()(IDS).logits


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMA)
def test_exported_logits_are_the_sources(tmp_path: Any, name: str) -> None:
    """transformers runs the export and the source (cast to the fixture's dtype as
    ``from_pretrained(torch_dtype=…)`` casts it, which is how the fixture was made): Δ = 0."""
    api.export_hf(pack(fixture(name), str(tmp_path / "m.nemo")), str(tmp_path / "hf"))
    a, b = _logits(str(tmp_path / "hf"), dtype_of(name)), _logits(fixture("hf_llama"), dtype_of(name))
    assert torch.equal(a, b)


def test_inspect_says_zarr(cli: Any, tmp_path: Any) -> None:
    nemo = pack(fixture("llama-tp2-bf16"), str(tmp_path / "m.nemo"))
    code, out, err = cli("inspect", nemo, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["layout"] == "dist" and info["backend"] == "zarr" and info["family"] == "llama"
    assert info["num_tensors"] == 3 + 6 * L and info["config"]["vocab_size"] == VOCAB
    assert any("zarr" in n for n in info["notes"])
    code, out, err = cli("inspect", fixture("llama-tp2-bf16"))
    assert code == 0 and "(dist layout, zarr)" in out, err


@pytest.mark.parametrize("name", ["llama-tp1-fp32", "llama-tp2-bf16"])
def test_verify_against_the_source(cli: Any, tmp_path: Any, name: str) -> None:
    hf = fixture("hf_llama")
    if dtype_of(name) == torch.bfloat16:  # the source as a bf16 HF folder, written by transformers
        from transformers import LlamaForCausalLM

        hf = str(tmp_path / "hf-bf16")
        LlamaForCausalLM.from_pretrained(fixture("hf_llama"), torch_dtype=torch.bfloat16).save_pretrained(hf)
        shutil.copyfile(os.path.join(fixture("hf_llama"), "tokenizer.model"), os.path.join(hf, "tokenizer.model"))
    code, out, err = cli("verify", fixture(name), hf, "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"], (err, {k: v for k, v in report.items() if k != "tensors"})
    assert report["counts"] == {"equal": 21}


@pytest.mark.parametrize("tp", [1, 2])
def test_reshard_writes_torch_dist(cli: Any, tmp_path: Any, tp: int) -> None:
    """zarr → torch_dist (our writer): the way to NeMo 2 / Megatron-Bridge."""
    out = str(tmp_path / "dist.nemo")
    code, _, err = cli("reshard", pack(fixture("llama-tp2-bf16"), str(tmp_path / "m.nemo")), "-o", out,
                       "--tp", str(tp))
    assert code == 0, err
    with tarfile.open(out) as tar:
        meta = json.load(tar.extractfile("./model_weights/metadata.json"))  # type: ignore[arg-type]
    assert meta["sharded_backend"] == "torch_dist"
    api.export_hf(out, str(tmp_path / "hf"))
    want, got = source("llama", torch.bfloat16), hf_tensors(str(tmp_path / "hf"))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    code, _, err = cli("reshard", fixture("llama-tp1-fp32"), "-o", str(tmp_path / "mb"), "--to", "megatron-bridge")
    assert code == 0, err
    dist = DistCheckpointSource.from_dir(tmp_path / "mb" / "iter_0000000", strip_prefix="module.")
    try:
        assert torch.equal(dist.load("decoder.layers.1.mlp.linear_fc2.weight"),
                           source("llama", torch.float32)["model.layers.1.mlp.down_proj.weight"])
    finally:
        dist.close()


@pytest.mark.slow
def test_megatron_core_runs_the_reshard(tmp_path: Any) -> None:
    """Megatron-Core 0.16.1 loads the torch_dist ``.nemo`` resharded from a zarr one (at TP=2,
    two gloo processes) and its logits are transformers' on the source (tests/test_family_megatron.py's
    worker: its NeMo config, its local spec)."""
    pytest.importorskip("megatron.core")
    nemo = str(tmp_path / "m")
    api.reshard(fixture("llama-tp2-fp32"), nemo, tp=2, packed=False)
    import yaml

    with open(os.path.join(nemo, "model_config.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert "qkv_bias" not in cfg  # NeMo's config leaves it out: False (megatron_base_model.py, nemo-formats §2.6)
    cfg["qkv_bias"] = False  # what the worker reads
    with open(os.path.join(nemo, "model_config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    want = str(tmp_path / "want.pt")
    torch.save({"ids": IDS, "logits": _logits(fixture("hf_llama"), torch.float32)}, want)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(repo, "tests", "test_family_megatron.py"), "llama", nemo,
                           want, str(tmp_path), "2", "1"], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("MCORE")))


# ====================================================================================== Nemotron
def test_the_nemotron_fixture_is_read(cli: Any) -> None:
    code, out, err = cli("inspect", fixture("nemotron-tp2-bf16"), "--json")
    assert code == 0, err
    assert json.loads(out)["backend"] == "zarr"
    src = ZarrCheckpointSource.from_dir(os.path.join(fixture("nemotron-tp2-bf16"), "model_weights"),
                                        strip_prefix="model.")
    want = source("nemotron", torch.bfloat16)
    try:
        for layer in range(L):
            p, m = f"model.layers.{layer}.", f"decoder.layers.{layer}."
            for hf_name, name in (("input_layernorm", "self_attention.linear_qkv.layer_norm"),
                                  ("post_attention_layernorm", "mlp.linear_fc1.layer_norm")):
                assert torch.equal(src.load(m + name + "_weight"), want[p + hf_name + ".weight"])
                assert torch.equal(src.load(m + name + "_bias"), want[p + hf_name + ".bias"])
            assert torch.equal(src.load(m + "mlp.linear_fc1.weight"), want[p + "mlp.up_proj.weight"])
            assert torch.equal(src.load(m + "mlp.linear_fc2.weight"), want[p + "mlp.down_proj.weight"])
        assert torch.equal(src.load("decoder.final_layernorm.bias"), want["model.norm.bias"])
        assert torch.equal(src.load("embedding.word_embeddings.weight")[:VOCAB], want["model.embed_tokens.weight"])
    finally:
        src.close()


def test_the_nemotron_fixture_exports(tmp_path: Any) -> None:
    api.export_hf(fixture("nemotron-tp2-bf16"), str(tmp_path / "hf"))
    want, got = source("nemotron", torch.bfloat16), hf_tensors(str(tmp_path / "hf"))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    a = _logits(str(tmp_path / "hf"), torch.bfloat16, "NemotronForCausalLM")
    assert torch.equal(a, _logits(fixture("hf_nemotron"), torch.bfloat16, "NemotronForCausalLM"))


# ====================================================================================== hostile inputs
def _edit_zarray(key: str, **fields: Any) -> Callable[[str], None]:
    def edit(folder: str) -> None:
        write_zarray(folder, key, {**zarray(folder, key), **fields})
    return edit


def _remove(rel: str) -> Callable[[str], None]:
    def edit(folder: str) -> None:
        os.remove(os.path.join(folder, "model_weights", rel))
    return edit


def _write(rel: str, data: bytes) -> Callable[[str], None]:
    def edit(folder: str) -> None:
        with open(os.path.join(folder, "model_weights", rel), "wb") as f:
            f.write(data)
    return edit


def _truncate(rel: str, by: int) -> Callable[[str], None]:
    def edit(folder: str) -> None:
        path = os.path.join(folder, "model_weights", rel)
        os.truncate(path, os.path.getsize(path) - by)
    return edit


HOSTILE: dict[str, tuple[Callable[[str], None], str]] = {
    # .zarray lies about the shape: the chunk files do not fit it
    "shape-lie-chunks": (_edit_zarray(FC2, chunks=[1, 32, 32]), "a .zarray that lies about shape or dtype"),
    "shape-lie-grid": (_edit_zarray(FC2, shape=[2, 32, 128]), "chunk 0.0.1 is missing"),
    # … or about the dtype
    "dtype-lie-size": (_edit_zarray(FC2, dtype="<f2"), "a .zarray that lies about shape or dtype"),
    "dtype-unknown": (_edit_zarray(FC2, dtype="<f16"), "unsupported dtype '<f16'"),
    "dtype-big-endian": (_edit_zarray(FC2, dtype=">f4"), "(big-endian)"),
    "dtype-void": (_edit_zarray(FC2, dtype="<V2"), "bfloat16 saved without its patched name"),
    "compressor": (_edit_zarray(FC2, compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}),
                   "compressor 'blosc' is not supported"),
    "fortran-order": (_edit_zarray(FC2, order="F"), "order 'F' is not supported"),
    "zarr-v3": (_edit_zarray(FC2, zarr_format=3), "only zarr v2"),
    "negative-shape": (_edit_zarray(FC2, shape=[2, -32, 64]), "bad shape"),
    "not-json": (_write(FC2 + "/.zarray", b"{'shape': [2, 32, 64]"), "not a valid .zarray (not JSON"),
    "truncated-chunk": (_truncate(FC2 + "/1.0.0", 3), "truncated"),
    "empty-chunk": (_truncate(FC2 + "/0.0.0", H * F * 4), "0 bytes"),
    "missing-chunk": (_remove(FC2 + "/1.0.0"), "chunk 1.0.0 is missing (1 of 2 present)"),
    "chunk-outside-grid": (_write(FC2 + "/2.0.0", b"\0" * H * F * 4), "not a chunk of array"),
    "stray-file": (_write(FC2 + "/1.0.0.partial", b"x"), "not a chunk of array"),
    "no-zarray": (_remove(FC2 + "/.zarray"), "has no .zarray"),
}


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_zarr_is_refused_in_one_line_writing_nothing(tmp_path: Any, case: str, packed: bool) -> None:
    edit, match = HOSTILE[case]
    folder = copy_fixture("llama-tp1-fp32", tmp_path)
    edit(folder)
    src = pack(folder, str(tmp_path / "m.nemo")) if packed else folder
    (tmp_path / "out").mkdir()
    out = str(tmp_path / "out" / "hf")
    fails_cleanly(lambda: api.export_hf(src, out), InputError, out, src, match=match)
    fails_cleanly(lambda: api.reshard(src, str(tmp_path / "out" / "r.nemo")), InputError,
                  str(tmp_path / "out" / "r.nemo"), src, match=match)


@pytest.mark.parametrize("where", ["dotdot", "absolute"])
def test_zarr_keys_outside_the_archive_are_refused(tmp_path: Any, where: str) -> None:
    folder = fixture("llama-tp1-fp32")
    nemo = pack(folder, str(tmp_path / "m.nemo"))
    name = ("./model_weights/../../escaped.weight/.zarray" if where == "dotdot"
            else str(tmp_path / "escaped.weight" / ".zarray"))
    data = json.dumps(zarray(folder, FC2)).encode()
    with tarfile.open(nemo, "a:") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "out").mkdir()
    out = str(tmp_path / "out" / "hf")
    fails_cleanly(lambda: api.export_hf(nemo, out), InputError, out, nemo,
                  match="'..' in path" if where == "dotdot" else "absolute path")
    assert not (tmp_path / "escaped.weight").exists()


def test_a_chunk_linked_out_of_the_folder_is_refused(tmp_path: Any) -> None:
    folder = copy_fixture("llama-tp1-fp32", tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(b"\0" * H * F * 4)
    chunk = os.path.join(folder, "model_weights", FC2, "1.0.0")
    os.remove(chunk)
    os.symlink(outside, chunk)
    (tmp_path / "out").mkdir()
    out = str(tmp_path / "out" / "hf")
    fails_cleanly(lambda: api.export_hf(folder, out), InputError, out, folder,
                  match="symlink pointing outside the folder")
