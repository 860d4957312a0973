"""``from-ckpt``: Lightning training checkpoints (one ``.ckpt``, per-rank folders, dist
folders) become ``.nemo`` files whose tensors equal what ``import`` makes from the same HF
model, and export back to it bit-exactly; pickles never run code; training state is
dropped and sized; errors name what is wrong."""

from __future__ import annotations

import fractions
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")

from ckpt_builders import (
    CKPT_NAME,
    GEOM,
    RunsCommand,
    fake_omegaconf,
    lightning_common,
    lightning_save,
    nemo_config,
    nemo_tensors,
    omegaconf_tree,
    optimizer_size,
    rank_state,
    training_config,
    write_dcp_checkpoint,
    write_dist_checkpoint,
)
from pickle_fakes import omegaconf_modules

from nemo_convert import api
from nemo_convert.errors import ConfigError, InputError, UnsafePickleError
from tiny_models import hf_tensors
from nemo_convert.sharding.layout import rank_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = GEOM["vocab_size"]  # 300 = the SentencePiece model's size; make_vocab_size_divisible_by = 4
LAYERS = GEOM["num_hidden_layers"]



@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny HF Llama, its TP=1 import (the reference), and legacy per-rank imports."""
    from tiny_models import make_tiny_llama

    base = tmp_path_factory.mktemp("world")
    hf = make_tiny_llama(str(base / "hf"), **GEOM)
    ref = str(base / "ref.nemo")
    api.import_hf(hf, ref, layout="legacy")
    ranks = {}
    for tp, pp in ((2, 1), (2, 2)):
        ranks[(tp, pp)] = str(base / f"ref_tp{tp}pp{pp}.nemo")
        api.import_hf(hf, ranks[(tp, pp)], layout="legacy", parallel=api.Parallelism(tp, pp))
    return {"hf": hf, "ref": ref, "ref_tensors": nemo_tensors(ref), "cfg": nemo_config(ref),
            "hf_tensors": hf_tensors(hf), "ranks": ranks, "tokenizer": os.path.join(hf, "tokenizer.model"),
            "base": base}


def model_state(world) -> dict[str, torch.Tensor]:
    """The LightningModule state dict of the whole model: the import's logical tensors
    (read through ``api.open_checkpoint``) under ``model.``."""
    return {"model." + k: v for k, v in world["ref_tensors"].items()}


def assert_same_as_import(world, nemo: str) -> None:
    got = nemo_tensors(nemo)
    want = world["ref_tensors"]
    assert set(got) == set(want), set(got) ^ set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def assert_exports_back(world, nemo: str, tmp_path) -> None:
    back = str(tmp_path / ("back_" + os.path.basename(nemo)))
    api.export_hf(nemo, back)
    got, want = hf_tensors(back), world["hf_tensors"]
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    with open(os.path.join(back, "tokenizer.model"), "rb") as a, open(world["tokenizer"], "rb") as b:
        assert a.read() == b.read()
    with open(os.path.join(back, "config.json")) as f:
        assert json.load(f)["vocab_size"] == VOCAB


@pytest.fixture(scope="module")
def single(world):
    """A run folder ``run/checkpoints/<name>.ckpt`` with tokenizer.model beside it."""
    run = world["base"] / "single"
    ckdir = run / "checkpoints"
    ckdir.mkdir(parents=True)
    shutil.copy(world["tokenizer"], ckdir / "tokenizer.model")
    path = lightning_save(model_state(world), training_config(world["cfg"]), str(ckdir / CKPT_NAME))
    return path


@pytest.fixture(scope="module")
def per_rank(world):
    """``{(tp, pp): run folder}`` of per-rank Lightning checkpoints (one save per rank)."""
    out = {}
    for (tp, pp), nemo in world["ranks"].items():
        run = world["base"] / f"ranks_tp{tp}pp{pp}"
        run.mkdir()
        shutil.copy(world["tokenizer"], run / "tokenizer.model")
        cfg = training_config(world["cfg"], tp=tp, pp=pp)
        for p in range(pp):
            for t in range(tp):
                folder = rank_dir(t, p, pp)
                lightning_save(rank_state(nemo, folder), cfg, str(run / folder / CKPT_NAME))
        out[(tp, pp)] = str(run)
    return out


@pytest.fixture
def cli(cli):
    """conftest's ``cli``, with stderr's whitespace collapsed (rich wraps long lines)."""
    def call(*argv: str) -> tuple[int, str, str]:
        code, out, err = cli(*argv)
        return code, out, " ".join(err.split())
    return call


# ------------------------------------------------------------------------- one file
def test_single_ckpt(world, single, tmp_path):
    out = str(tmp_path / "m.nemo")
    rep = api.from_ckpt(single, out)
    assert rep.layout == "dist" and (rep.tp, rep.pp) == (1, 1) and rep.source_kind == "ckpt"
    assert_same_as_import(world, out)
    assert_exports_back(world, out, tmp_path)
    # training state: dropped and sized exactly
    n, nbytes = optimizer_size(single)
    assert n == 3 * len(world["ref_tensors"])  # Adam: step, exp_avg, exp_avg_sq per parameter
    assert rep.dropped_sections["optimizer_states"] == {"tensors": n, "bytes": nbytes}
    assert {"lr_schedulers", "loops", "callbacks"} <= set(rep.dropped_sections)
    # Transformer-Engine _extra_state entries: named and dropped, 4 linear modules per layer
    # (BytesIO blobs for the attention linears, 8-byte uint8 tensors for the MLP ones)
    assert len(rep.dropped) == 4 * LAYERS and all(k.endswith("._extra_state") for k in rep.dropped)
    assert rep.dropped_sections["state_dict (not model weights)"] == {"tensors": 2 * LAYERS, "bytes": 16 * LAYERS,
                                                                      "objects": 2 * LAYERS}
    assert rep.dropped_tensors == n + 2 * LAYERS and rep.dropped_bytes == nbytes + 16 * LAYERS
    assert rep.checkpoint == {"epoch": 1, "global_step": 1, "pytorch-lightning_version":
                              rep.checkpoint["pytorch-lightning_version"]}
    cfg = nemo_config(out)
    assert cfg["tokenizer"]["model"] == world["cfg"]["tokenizer"]["model"]  # same bytes, same nemo: name
    assert cfg["nemo_convert"]["vocab_size"] == VOCAB and rep.vocab_size == VOCAB
    assert cfg["nemo_convert"]["source_format"] == "ptl_ckpt"
    assert cfg["nemo_convert"]["training_checkpoint"]["global_step"] == 1
    assert cfg["optim"]["name"] == "fused_adam"  # the training config is kept as NeMo keeps it


def test_single_ckpt_to_megatron_bridge(world, single, tmp_path):
    ref, out = str(tmp_path / "m.nemo"), str(tmp_path / "mb")
    api.from_ckpt(single, ref)
    rep = api.from_ckpt(single, out, to="megatron-bridge")
    assert rep.layout == "megatron-bridge" and rep.dropped_tensors > 0
    assert os.listdir(os.path.join(out, "iter_0000000", "tokenizer")) == ["tokenizer.model"]
    with api.open_checkpoint(ref) as a, api.open_checkpoint(out) as b:
        assert b.format == "megatron-bridge" and sorted(a.source.keys()) == sorted(b.source.keys())
        for k in a.source.keys():
            assert torch.equal(a.source.load(k), b.source.load(k)), k


def test_single_ckpt_legacy_layout_and_reshard(world, single, tmp_path):
    out = str(tmp_path / "m.nemo")
    rep = api.from_ckpt(single, out, layout="legacy", tp=2, pp=2)
    assert rep.layout == "legacy" and (rep.tp, rep.pp) == (2, 2)
    for p in range(2):
        for t in range(2):
            folder = rank_dir(t, p, 2)
            got, want = rank_state(out, folder), rank_state(world["ranks"][(2, 2)], folder)
            assert set(got) == set(want)
            assert all(torch.equal(got[k], want[k]) for k in want), folder
    assert_same_as_import(world, out)


def test_run_restored_from_a_nemo_keeps_our_section(world, tmp_path):
    """A run started from a .nemo we wrote: the config keeps our section and nemo: refs."""
    cfg = training_config(world["cfg"], keep_section=True, tokenizer=world["cfg"]["tokenizer"]["model"])
    assert cfg["tokenizer"]["model"].startswith("nemo:")
    ckpt = lightning_save(model_state(world), cfg, str(tmp_path / "run" / "last.ckpt"))
    shutil.copy(world["tokenizer"], tmp_path / "run" / "tokenizer.model")  # the de-hashed name
    out = str(tmp_path / "m.nemo")
    rep = api.from_ckpt(ckpt, out)
    assert_same_as_import(world, out)
    assert_exports_back(world, out, tmp_path)
    assert nemo_config(out)["nemo_convert"]["tokenizer_files"] == world["cfg"]["nemo_convert"]["tokenizer_files"]
    assert rep.vocab_size == VOCAB


# ------------------------------------------------------------------- per-rank files
@pytest.mark.parametrize("tp,pp", [(2, 1), (2, 2)])
def test_per_rank_folders(world, per_rank, tmp_path, tp, pp):
    run = per_rank[(tp, pp)]
    out = str(tmp_path / "m.nemo")
    rep = api.from_ckpt(run, out)
    assert rep.source_kind == "per-rank" and (rep.source_tp, rep.source_pp) == (tp, pp)
    assert rep.layout == "dist" and (rep.tp, rep.pp) == (1, 1)
    assert len(rep.source_files) == tp * pp
    assert rep.vocab_size == VOCAB  # 304 stored rows, 300 from tokenizer.model
    assert_same_as_import(world, out)
    assert_exports_back(world, out, tmp_path)
    want = [optimizer_size(f) for f in rep.source_files]
    assert rep.dropped_sections["optimizer_states"] == {"tensors": sum(n for n, _ in want),
                                                        "bytes": sum(b for _, b in want)}
    # legacy output keeps the run's parallelism: the rank files are the input slices again
    legacy = str(tmp_path / "legacy.nemo")
    rep = api.from_ckpt(run, legacy, layout="legacy")
    assert (rep.tp, rep.pp) == (tp, pp)
    for p in range(pp):
        for t in range(tp):
            folder = rank_dir(t, p, pp)
            got, want_state = rank_state(legacy, folder), rank_state(world["ranks"][(tp, pp)], folder)
            assert set(got) == set(want_state)
            assert all(torch.equal(got[k], want_state[k]) for k in want_state), folder


def test_per_rank_folders_merge_with_the_registered_strategies(world, per_rank, tmp_path, monkeypatch):
    """The training-checkpoint reader merges rank slices with the registry's TP strategy
    and lays out the stages with its PP strategy (not the built-ins directly)."""
    from test_sharding_plugins import counting_registry

    reg, mine = counting_registry(monkeypatch)
    out = str(tmp_path / "m.nemo")
    api.from_ckpt(per_rank[(2, 2)], out, registry=reg)
    assert mine.tp.calls["merge"] > 0 and mine.pp.calls > 0
    assert_same_as_import(world, out)


def test_checkpoint_name_among_several(world, per_rank, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(per_rank[(2, 1)], run)
    for t in range(2):
        shutil.copy(run / rank_dir(t, 0, 1) / CKPT_NAME, run / rank_dir(t, 0, 1) / "megatron_gpt--step=0.ckpt")
    with pytest.raises(InputError, match="2 checkpoints.*--checkpoint-name") as exc:
        api.from_ckpt(str(run), str(tmp_path / "m.nemo"))
    assert CKPT_NAME in str(exc.value) and "megatron_gpt--step=0.ckpt" in str(exc.value)
    os.remove(run / rank_dir(1, 0, 1) / "megatron_gpt--step=0.ckpt")
    with pytest.raises(InputError, match="not in every rank folder"):
        api.from_ckpt(str(run), str(tmp_path / "m.nemo"))
    with pytest.raises(InputError, match="missing from rank folder"):
        api.from_ckpt(str(run), str(tmp_path / "m.nemo"), checkpoint_name="megatron_gpt--step=0.ckpt")
    rep = api.from_ckpt(str(run), str(tmp_path / "m.nemo"), checkpoint_name=CKPT_NAME)
    assert rep.source_files[0].endswith(CKPT_NAME)
    assert_same_as_import(world, str(tmp_path / "m.nemo"))


def test_incomplete_rank_grid(per_rank, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(per_rank[(2, 2)], run)
    shutil.rmtree(run / "tp_rank_01_pp_rank_001")
    with pytest.raises(InputError, match="incomplete.*tp_rank_01_pp_rank_001"):
        api.from_ckpt(str(run), str(tmp_path / "m.nemo"))
    assert not (tmp_path / "m.nemo").exists()


def test_one_rank_file_is_not_the_model(per_rank, tmp_path):
    one = os.path.join(per_rank[(2, 1)], "mp_rank_00", CKPT_NAME)
    with pytest.raises(InputError, match="one model-parallel rank.*--checkpoint-name"):
        api.from_ckpt(one, str(tmp_path / "m.nemo"))


# ------------------------------------------------------------------- dist checkpoints
def _padded(world, rows: int) -> dict[str, torch.Tensor]:
    """The reference tensors with the embedding and output layer padded as at TP=2."""
    out = dict(world["ref_tensors"])
    for k in ("embedding.word_embeddings.weight", "output_layer.weight"):
        t = out[k]
        out[k] = torch.cat([t, torch.zeros(rows - t.shape[0], *t.shape[1:], dtype=t.dtype)])
    return out


@pytest.mark.parametrize("writer", ["ours", "torch_dcp"])
def test_dist_checkpoint(world, tmp_path, writer):
    cfg = training_config(world["cfg"], tp=2)
    common = lightning_common(model_state(world), cfg, str(tmp_path))
    ckdir = tmp_path / "checkpoints"
    folder = ckdir / "megatron_gpt--val_loss=1.23-step=1-last"
    logical = _padded(world, 304)
    opt = (write_dist_checkpoint if writer == "ours" else write_dcp_checkpoint)(str(folder), logical, common)
    shutil.copy(world["tokenizer"], ckdir / "tokenizer.model")  # beside the dist folder
    out = str(tmp_path / "m.nemo")
    rep = api.from_ckpt(str(folder), out)
    assert rep.source_kind == "dist" and rep.source_tp == 2 and rep.vocab_size == VOCAB
    assert_same_as_import(world, out)
    assert_exports_back(world, out, tmp_path)
    assert rep.dropped_sections["optimizer"] == {"tensors": opt[0], "bytes": opt[1]}
    if writer == "ours":
        assert rep.dropped_sections["_extra_state"]["objects"] == 2 * LAYERS
    assert rep.checkpoint["global_step"] == 1
    # the checkpoints folder holding just this one, with the .ckpt name NeMo gives it
    rep2 = api.from_ckpt(str(ckdir), str(tmp_path / "m2.nemo"), checkpoint_name=folder.name + ".ckpt",
                         layout="legacy")
    assert rep2.source_kind == "dist" and (rep2.tp, rep2.pp) == (2, 1)
    assert_same_as_import(world, str(tmp_path / "m2.nemo"))


# ---------------------------------------------------------------------- pickle safety
def test_malicious_ckpt_is_refused(world, tmp_path, cli):
    marker = tmp_path / "MARKER"
    path = str(tmp_path / "evil.ckpt")
    torch.save({"state_dict": model_state(world),
                "hyper_parameters": {"cfg": training_config(world["cfg"])},
                "callbacks": {"ModelCheckpoint": RunsCommand(f"touch {marker}")}}, path)
    with pytest.raises(UnsafePickleError, match=r"posix\.system"):
        api.from_ckpt(path, str(tmp_path / "m.nemo"))
    code, _, err = cli("from-ckpt", path, "-o", str(tmp_path / "m.nemo"))
    assert code == 2 and "posix.system" in err and "--trust-pickle" in err
    assert not marker.exists() and not (tmp_path / "m.nemo").exists()
    # the same checkpoint in a dist folder's common.pt
    folder = tmp_path / "dist"
    write_dist_checkpoint(str(folder), world["ref_tensors"], {})
    torch.save({"hyper_parameters": {"cfg": training_config(world["cfg"])},
                "loops": RunsCommand(f"touch {marker}")}, folder / "common.pt")
    with pytest.raises(UnsafePickleError, match=r"posix\.system"):
        api.from_ckpt(str(folder), str(tmp_path / "m.nemo"))
    assert not marker.exists()
    torch.load(path, weights_only=False)  # proof that the file is live: plain torch.load runs it
    assert marker.exists()


def test_trust_pickle_is_an_explicit_opt_in(world, single, tmp_path, cli):
    ck = torch.load(single, weights_only=False)
    ck["callbacks"]["Custom"] = {"ratio": fractions.Fraction(1, 3)}
    ck["hyper_parameters"]["cfg"]["custom_ratio"] = fractions.Fraction(1, 3)
    ck["hyper_parameters"]["cfg"]["lr_scale"] = np.float32(0.5)  # allow-listed: becomes a float
    path = str(tmp_path / "custom.ckpt")
    torch.save(ck, path)
    shutil.copy(world["tokenizer"], tmp_path / "tokenizer.model")
    with pytest.raises(UnsafePickleError, match=r"fractions\.Fraction"):
        api.from_ckpt(path, str(tmp_path / "m.nemo"))
    code, _, err = cli("from-ckpt", path, "-o", str(tmp_path / "m.nemo"), "--trust-pickle")
    assert code == 0 and "--trust-pickle" in err and "arbitrary code" in err
    assert "written as text: cfg.custom_ratio" in err
    assert_same_as_import(world, str(tmp_path / "m.nemo"))
    cfg = nemo_config(str(tmp_path / "m.nemo"))
    assert cfg["custom_ratio"] == "Fraction(1, 3)" and cfg["lr_scale"] == 0.5


@pytest.mark.slow  # a fresh interpreter
def test_omegaconf_config_without_omegaconf(world, single, tmp_path):
    ck = torch.load(single, weights_only=False)
    before = omegaconf_modules()  # a real OmegaConf may be imported
    with fake_omegaconf() as classes:
        ck["hyper_parameters"] = {"cfg": omegaconf_tree(classes, ck["hyper_parameters"]["cfg"])}
        ck["hparams_type"] = classes["DictConfig"]
        path = str(tmp_path / "omega.ckpt")
        torch.save(ck, path)
    # the stand-ins are gone and whatever was there is back
    assert omegaconf_modules() == before
    shutil.copy(world["tokenizer"], tmp_path / "tokenizer.model")
    out = str(tmp_path / "m.nemo")
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["omegaconf"] = None  # importing omegaconf now fails
        try:
            import omegaconf
        except ImportError:
            pass
        else:
            raise SystemExit("omegaconf importable")
        from nemo_convert import api
        rep = api.from_ckpt({path!r}, {out!r})
        print(json.dumps({{"config_from": rep.config_from, "family": rep.family}}))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"config_from": "hyper_parameters.cfg",
                                                               "family": "llama"}
    assert_same_as_import(world, out)
    assert nemo_config(out)["optim"]["betas"] == [0.9, 0.98]


# ------------------------------------------------------------------ config and tokenizer
def test_hparams_file(world, tmp_path):
    from lightning.pytorch.core.saving import save_hparams_to_yaml

    run = tmp_path / "run"
    ckpt = lightning_save(model_state(world), None, str(run / "checkpoints" / "last.ckpt"))
    out = str(tmp_path / "m.nemo")
    with pytest.raises(ConfigError, match="no hyper_parameters.*--hparams"):
        api.from_ckpt(ckpt, out)
    hparams = str(run / "hparams.yaml")
    save_hparams_to_yaml(hparams, {"cfg": training_config(world["cfg"])})
    with pytest.raises(ConfigError, match=f"found {hparams}"):
        api.from_ckpt(ckpt, out)
    with pytest.raises(InputError, match="tokenizer file 'tokenizer.model'.*not found"):
        api.from_ckpt(ckpt, out, hparams=hparams)
    shutil.copy(world["tokenizer"], run / "tokenizer.model")  # relative to the hparams file
    rep = api.from_ckpt(ckpt, out, hparams=hparams)
    assert rep.config_from == hparams
    assert_same_as_import(world, out)
    assert_exports_back(world, out, tmp_path)


def test_hparams_yaml_is_read_safely(world, tmp_path):
    import yaml

    marker = tmp_path / "MARKER"
    cfg = training_config(world["cfg"])
    text = yaml.safe_dump({"cfg": cfg}, sort_keys=False)
    tuples = tmp_path / "tuples.yaml"  # Lightning dumps hparams with yaml.dump: tuples get a tag
    tuples.write_text(yaml.dump({"cfg": dict(cfg, optim=dict(cfg["optim"], betas=(0.9, 0.98)))}))
    assert "!!python/tuple" in tuples.read_text()
    ckpt = lightning_save(model_state(world), None, str(tmp_path / "last.ckpt"))
    shutil.copy(world["tokenizer"], tmp_path / "tokenizer.model")
    api.from_ckpt(ckpt, str(tmp_path / "m.nemo"), hparams=str(tuples))
    assert nemo_config(str(tmp_path / "m.nemo"))["optim"]["betas"] == [0.9, 0.98]
    evil = tmp_path / "evil.yaml"
    evil.write_text(text.replace("cfg:\n", f"cfg:\n  x: !!python/object/apply:os.system ['touch {marker}']\n", 1))
    with pytest.raises(InputError, match="python/object/apply:os.system"):
        api.from_ckpt(ckpt, str(tmp_path / "m2.nemo"), hparams=str(evil))
    assert not marker.exists()


def test_missing_tokenizer_can_be_allowed(world, tmp_path):
    ckpt = lightning_save(model_state(world), training_config(world["cfg"], tokenizer="/nowhere/t.model"),
                          str(tmp_path / "last.ckpt"))
    with pytest.raises(InputError, match="/nowhere/t.model.*--allow-missing-tokenizer"):
        api.from_ckpt(ckpt, str(tmp_path / "m.nemo"))
    rep = api.from_ckpt(ckpt, str(tmp_path / "m.nemo"), allow_missing_tokenizer=True)
    assert any("/nowhere/t.model" in w for w in rep.warnings)
    assert any("vocabulary size is unknown" in w for w in rep.warnings)  # nothing tells the vocab now
    assert nemo_config(str(tmp_path / "m.nemo"))["tokenizer"]["model"] is None
    assert_same_as_import(world, str(tmp_path / "m.nemo"))  # no padding at TP=1


def test_several_checkpoints_in_a_folder(world, single, tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("a.ckpt", "b-last.ckpt"):
        shutil.copy(single, folder / name)
    shutil.copy(world["tokenizer"], folder / "tokenizer.model")
    with pytest.raises(InputError, match="2 checkpoints: a.ckpt, b-last.ckpt.*--checkpoint-name"):
        api.from_ckpt(str(folder), str(tmp_path / "m.nemo"))
    rep = api.from_ckpt(str(folder), str(tmp_path / "m.nemo"), checkpoint_name="b-last.ckpt")
    assert rep.source_files == [str(folder / "b-last.ckpt")]


# ------------------------------------------------------------------------------- CLI
def test_cli_summary_and_json(world, single, tmp_path, cli):
    out = str(tmp_path / "m.nemo")
    code, stdout, err = cli("from-ckpt", single, "-o", out, "--json")
    assert code == 0, err
    rep = json.loads(stdout)
    n, nbytes = optimizer_size(single)
    assert rep["dropped_sections"]["optimizer_states"] == {"tensors": n, "bytes": nbytes}
    assert rep["dropped_tensors"] == n + 2 * LAYERS and rep["layout"] == "dist" and rep["family"] == "llama"
    code, _, err = cli("from-ckpt", single, "-o", out)
    assert code == 2 and "exists" in err
    code, _, err = cli("from-ckpt", single, "-o", out, "--overwrite", "--layout", "legacy")
    assert code == 0
    assert "dropped training state" in err and f"optimizer_states {n} tensors" in err
    assert_same_as_import(world, out)


# ---------------------------------------------------------------------------- memory
def test_training_state_is_never_read(world, tmp_path):
    """A checkpoint whose optimizer state dwarfs the weights converts with private memory
    far below that state's size: tensors are memory-mapped and the dropped ones untouched."""
    state = model_state(world)
    big = torch.ones(16 * 2**20)  # 64 MiB of "optimizer state", twice
    path = str(tmp_path / "big.ckpt")
    torch.save({"state_dict": state, "hyper_parameters": {"cfg": training_config(world["cfg"])},
                "optimizer_states": [{"state": {0: {"exp_avg": big, "exp_avg_sq": big.clone()}}}]}, path)
    del big
    fd = os.open(path, os.O_RDONLY)  # written pages stay dirty until written back
    os.fsync(fd)
    os.close(fd)
    shutil.copy(world["tokenizer"], tmp_path / "tokenizer.model")
    out = str(tmp_path / "m.nemo")

    def anon() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) * 1024

    base, peak, done = anon(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], anon())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rep = api.from_ckpt(path, out)
    finally:
        done.set()
        sampler.join()
    grew = max(peak[0], anon()) - base
    assert rep.dropped_bytes == 2 * 64 * 2**20
    assert grew < 32 * 2**20, f"private memory grew by {grew / 2**20:.0f} MiB"
    assert_same_as_import(world, out)
