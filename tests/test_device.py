"""``--device``: where the transforms of import, export and reshard run.

Without a GPU the device path is forced on the CPU (``Compute(staged=True)``: the same
copy-in / transform / copy-out code, with real copies) and must give byte-identical
outputs; views (renames, copies, splits) must not be moved; ``--device cuda`` must fail
up front with one line. The ``gpu`` tests compare CUDA against the CPU byte for byte and
run only where ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
import torch

from nemo_convert import api
from nemo_convert.compute import CPU, Compute, OnDevice, resolve_device
from nemo_convert.engine import apply_dtype
from nemo_convert.errors import InputError
from nemo_convert.formats.hf.hf import open_hf
from tiny_models import make_tiny_llama

LAYERS = 4
#: GQA (4 heads, 2 groups); a vocabulary of 1000 is padded at TP=2 (divisible_by 8 → 1008).
GEOM = dict(num_hidden_layers=LAYERS, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64)
FFN, HIDDEN, VOCAB = 64, 32, 1000

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")


@dataclass(frozen=True)
class Recording(Compute):
    """The forced device path, remembering the shape of every tensor sent to the device."""

    sent: list[tuple[int, ...]] = field(default_factory=list)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        self.sent.append(tuple(t.shape))
        return super().to_device(t)


def staged() -> Recording:
    return Recording(staged=True)


def contents(path: str) -> dict[str, bytes]:
    """Every file's bytes: ``{"": bytes}`` for a file, ``{relative path: bytes}`` for a folder."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {"": f.read()}
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def assert_same_bytes(a: str, b: str) -> None:
    ca, cb = contents(a), contents(b)
    assert sorted(ca) == sorted(cb)
    for k in ca:
        assert ca[k] == cb[k], f"{k or os.path.basename(a)} differs"


def hidden_entries(folder: str) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(".")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny GQA Llama and its .nemo files (dist; legacy TP=2), made on the plain path. Read-only."""
    base = tmp_path_factory.mktemp("device_models")
    hf = make_tiny_llama(str(base / "hf"), **GEOM)
    api.import_hf(hf, str(base / "dist.nemo"))
    api.import_hf(hf, str(base / "tp2.nemo"), layout="legacy", parallel=api.Parallelism(2, 1))
    return {"hf": hf, "dist": str(base / "dist.nemo"), "tp2": str(base / "tp2.nemo")}


IMPORTS = {
    "dist": {},
    "dist-bf16": dict(dtype="bf16"),
    "legacy-tp2": dict(layout="legacy", parallel=api.Parallelism(2, 1)),
    "legacy-tp2-pp2-bf16": dict(layout="legacy", dtype="bf16", parallel=api.Parallelism(2, 2)),
    "dist-tp2-unpacked": dict(parallel=api.Parallelism(2, 1), packed=False),
}
EXPORTS = {"dist": ("dist", {}), "tp2-bf16": ("tp2", dict(dtype="bf16")), "dist-fp16": ("dist", dict(dtype="fp16"))}
RESHARDS = {
    "tp2-to-tp1": ("tp2", dict(tp=1, layout="legacy")),
    "dist-to-legacy-tp2-pp2": ("dist", dict(tp=2, pp=2, layout="legacy")),
    "tp2-to-dist": ("tp2", dict(layout="dist")),
}


def convert(kind: str, models: dict[str, str], out: str, device: object, case: str):  # type: ignore[no-untyped-def]
    if kind == "import":
        return api.import_hf(models["hf"], out, device=device, **IMPORTS[case])  # type: ignore[arg-type]
    if kind == "export":
        src, kw = EXPORTS[case]
        return api.export_hf(models[src], out, device=device, **kw)  # type: ignore[arg-type]
    src, kw = RESHARDS[case]
    return api.reshard(models[src], out, device=device, **kw)  # type: ignore[arg-type]


CASES = ([("import", c) for c in IMPORTS] + [("export", c) for c in EXPORTS] + [("reshard", c) for c in RESHARDS])


# -- (1) the forced device path writes the same bytes as the plain path ----------------------
@pytest.mark.parametrize("kind,case", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_forced_device_path_is_byte_identical(kind, case, models, tmp_path):
    plain, forced = str(tmp_path / "plain"), str(tmp_path / "forced")
    a = convert(kind, models, plain, "cpu", case)
    b = convert(kind, models, forced, staged(), case)
    assert_same_bytes(plain, forced)
    assert (a.tensors, a.bytes, a.notes, a.warnings) == (b.tensors, b.bytes, b.notes, b.warnings)


# -- (2) which tasks move ------------------------------------------------------------------
def _import_plan(hf: str, dtype: torch.dtype | None = None):  # type: ignore[no-untyped-def]
    reg = api.get_registry()
    ckpt = open_hf(hf)
    fam = reg.family_for_hf_config(ckpt.config)
    _, plan = api.plan_import(fam, ckpt.config, ckpt.source)
    apply_dtype(plan, dtype)
    return ckpt, plan


def test_only_tasks_that_build_tensors_are_placed_on_the_device(models):
    ckpt, plan = _import_plan(models["hf"])
    try:
        placed = staged().place(plan, ckpt.source)
        moved = {t.label for t in placed.tasks if isinstance(t.fn, OnDevice)}
        kept = {t.label for t in placed.tasks if not isinstance(t.fn, OnDevice)}
        assert moved == {"fuse_qkv", "fuse_gated"}
        assert kept == {"rename"}
        assert [t.outputs for t in placed.tasks] == [t.outputs for t in plan.tasks]
    finally:
        ckpt.close()


def test_a_cast_moves_renames_too(models):
    ckpt, plan = _import_plan(models["hf"], torch.bfloat16)  # the model is fp32
    try:
        placed = staged().place(plan, ckpt.source)
        assert all(isinstance(t.fn, OnDevice) for t in placed.tasks)
    finally:
        ckpt.close()


def test_the_plain_path_keeps_the_plan():
    assert Compute.of("cpu") == CPU and not CPU.active
    plan = object()
    assert CPU.place(plan, None) is plan  # type: ignore[arg-type]
    tp = api.get_registry().strategies().tensor
    assert CPU.tensor_parallel(tp) is tp  # the registry's strategy itself, not a device wrapper
    forced = staged()
    assert Compute.of(forced) is forced


def test_import_sends_only_the_fused_inputs(models, tmp_path):
    rec = staged()
    api.import_hf(models["hf"], str(tmp_path / "a.nemo"), device=rec)
    q, kv = (HIDDEN, HIDDEN), (HIDDEN // 2, HIDDEN)
    per_layer = sorted([q, kv, kv, (FFN, HIDDEN), (FFN, HIDDEN)])
    assert sorted(rec.sent) == sorted(per_layer * LAYERS)


def test_export_without_a_cast_moves_only_the_rank_merges(models, tmp_path):
    rec = staged()
    api.export_hf(models["dist"], str(tmp_path / "from-dist"), device=rec)
    assert rec.sent == []  # global tensors: the splits are views
    api.export_hf(models["tp2"], str(tmp_path / "from-tp2"), device=rec)
    # per-rank input: each TP rank's slice of every split tensor goes to the device to be
    # concatenated there (norms are replicated: nothing to merge)
    qkv, proj, fc1, fc2, vocab = (32, HIDDEN), (HIDDEN, 16), (FFN, HIDDEN), (HIDDEN, FFN // 2), (504, HIDDEN)
    assert sorted(rec.sent) == sorted([qkv, proj, fc1, fc2] * 2 * LAYERS + [vocab] * 2 * 2)


def test_export_with_a_cast_moves_every_tensor(models, tmp_path):
    rec = staged()
    rep = api.export_hf(models["dist"], str(tmp_path / "hf"), device=rec, dtype="bf16")
    assert len(rec.sent) == len(api.inspect_checkpoint(models["dist"])["tensors"]) > 0
    assert rep.tensors > len(rec.sent)  # the QKV and fc1 splits: one input, several outputs


def test_reshard_moves_only_the_splits_that_build_tensors(models, tmp_path):
    rec = staged()
    api.reshard(models["dist"], str(tmp_path / "dist.nemo"), device=rec, tp=2)  # dist stores global tensors
    assert rec.sent == []
    api.reshard(models["dist"], str(tmp_path / "tp2.nemo"), device=rec, tp=2, layout="legacy")
    # per TP rank file: each layer's gated fc1, and the padded embedding and output layer
    assert sorted(rec.sent) == sorted([(2 * FFN, HIDDEN)] * LAYERS * 2 + [(VOCAB, HIDDEN)] * 2 * 2)


# -- (3) no CUDA: one line, exit 2, nothing written ----------------------------------------------
@no_gpu
@pytest.mark.parametrize("command,src", [("import", "hf"), ("export", "dist"), ("reshard", "tp2")])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_device_cuda_without_cuda_fails_up_front(command, src, device, models, tmp_path, cli):
    out = tmp_path / "out"
    code, stdout, stderr = cli(command, models[src], "-o", str(out), "--device", device)
    assert code == 2 and stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nemo-convert: error: --device"), stderr
    assert "no CUDA device" in lines[0]
    assert not out.exists() and hidden_entries(str(tmp_path)) == []


@no_gpu
def test_the_api_and_quantize_refuse_cuda_with_the_same_error(models, tmp_path):
    for call in (lambda: api.import_hf(models["hf"], str(tmp_path / "a.nemo"), device="cuda"),
                 lambda: api.quantize(models["dist"], str(tmp_path / "q"), algo="none", device="cuda")):
        with pytest.raises(InputError, match="--device cuda: no CUDA device"):
            call()
    assert os.listdir(tmp_path) == []


def test_an_unknown_device_is_one_line(models, tmp_path, cli):
    code, _, stderr = cli("import", models["hf"], "-o", str(tmp_path / "a.nemo"), "--device", "tpu")
    assert code == 2 and stderr.strip() == "nemo-convert: error: --device tpu: expected cpu, cuda, cuda:N or auto"
    assert os.listdir(tmp_path) == []


# -- (4) auto: CUDA when there is one, else the CPU ----------------------------------------------
def test_device_auto_works_here(models, tmp_path, cli):
    code, _, stderr = cli("import", models["hf"], "-o", str(tmp_path / "auto.nemo"), "--device", "auto",
                          "--layout", "legacy", "--tp", "2", "-q")
    assert code == 0, stderr
    api.import_hf(models["hf"], str(tmp_path / "cpu.nemo"), layout="legacy", parallel=api.Parallelism(2, 1))
    assert_same_bytes(str(tmp_path / "cpu.nemo"), str(tmp_path / "auto.nemo"))


# -- resolving the option, with a pretend CUDA ----------------------------------------------------
@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return monkeypatch


def test_resolve_device_spellings(two_gpus):
    cuda = torch.device
    assert resolve_device(None) == resolve_device("cpu") == resolve_device(" CPU ") == cuda("cpu")
    assert resolve_device("cuda") == resolve_device("auto") == cuda("cuda", 0)
    assert resolve_device("cuda:1") == resolve_device(cuda("cuda", 1)) == cuda("cuda", 1)
    with pytest.raises(InputError, match=r"cuda:2 does not exist \(2 CUDA device"):
        resolve_device("cuda:2")
    for bad in ("gpu", "cuda:", "cuda:-1", "mps"):
        with pytest.raises(InputError, match="expected cpu, cuda, cuda:N or auto"):
            resolve_device(bad)


def test_under_torchrun_cuda_is_the_local_rank(two_gpus):
    two_gpus.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)  # an explicit index wins
    two_gpus.setenv("LOCAL_RANK", "3")  # more processes than GPUs: they share them round robin
    assert resolve_device("cuda") == torch.device("cuda", 1)


def test_auto_without_cuda_is_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(InputError, match="no CUDA device"):
        resolve_device("cuda:0")


# -- (5) on a real GPU: CUDA writes the same bytes as the CPU -----------------------------------
@gpu
@pytest.mark.parametrize("kind,case", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_cuda_is_byte_identical_to_cpu(kind, case, models, tmp_path):
    before = torch.cuda.memory_allocated()
    convert(kind, models, str(tmp_path / "cpu"), "cpu", case)
    rep = convert(kind, models, str(tmp_path / "cuda"), "cuda", case)
    assert_same_bytes(str(tmp_path / "cpu"), str(tmp_path / "cuda"))
    assert any(n.startswith("transforms on cuda") for n in rep.notes)
    assert torch.cuda.memory_allocated() == before  # nothing left on the device
