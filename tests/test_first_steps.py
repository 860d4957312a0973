"""What a new user trips over (issue 16): a command pointed at the wrong kind of checkpoint
says what it was given and which command takes it; ``inspect`` reads ``.qnemo`` folders."""

from __future__ import annotations

import json
import os

import pytest

from nemo_convert import api
from nemo_convert.formats.detect import detect
from tiny_models import make_tiny_llama
from tiny_multimodal import make_tiny_clip

ERROR = "nemo-convert: error:"


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """One checkpoint of each kind: HF folder, .nemo, .qnemo folder, a Lightning-like .ckpt, CLIP .nemo."""
    from nemo_convert.qnemo import quantize

    base = tmp_path_factory.mktemp("kinds")
    hf = make_tiny_llama(str(base / "hf"))
    api.import_hf(hf, str(base / "m.nemo"))
    quantize(hf, str(base / "m.qnemo"), algo="none", tp=2)
    ckpt = base / "train" / "step=1.ckpt"
    ckpt.parent.mkdir()
    import torch

    torch.save({"state_dict": {}}, str(ckpt))
    clip = make_tiny_clip(str(base / "clip-hf"))
    api.import_hf(clip, str(base / "clip.nemo"))
    return {"hf": hf, "nemo": str(base / "m.nemo"), "qnemo": str(base / "m.qnemo"), "ckpt": str(ckpt),
            "clip": str(base / "clip.nemo"), "base": str(base)}


def test_detector_names_each_kind(kinds):
    assert detect(kinds["hf"]).kind == "hf"
    assert detect(kinds["nemo"]).kind == "nemo"
    assert detect(kinds["qnemo"]).kind == "qnemo"
    assert detect(kinds["ckpt"]).kind == "training"
    assert detect(os.path.dirname(kinds["ckpt"])).kind == "training"
    assert detect(kinds["base"] + "/nothing").kind == "missing"
    assert detect(kinds["base"]).kind == "unknown"  # a folder of checkpoints is not one


def test_a_compressed_qnemo_is_recognised(kinds, cli, tmp_path):
    from nemo_convert.qnemo import quantize

    tar = str(tmp_path / "m.qnemo")
    quantize(kinds["hf"], tar, algo="none", compress=True)
    assert detect(tar).kind == "qnemo"
    code, _, err = cli("export", tar, "-o", str(tmp_path / "out"))
    assert code == 2 and "this is a .qnemo" in err
    code, _, err = cli("inspect", tar)
    assert code == 2 and "extract it first" in err


@pytest.mark.parametrize("argv, says", [
    (("export", "{hf}", "-o", "{out}"), "this is a Hugging Face folder, not a .nemo; to convert it into a .nemo "
                                        "use `nemo-convert import`"),
    (("reshard", "{hf}", "-o", "{out}", "--tp", "2"), "this is a Hugging Face folder, not a .nemo"),
    (("import", "{nemo}", "-o", "{out}"), "this is a .nemo checkpoint, not a Hugging Face model folder; to "
                                          "convert it into a Hugging Face folder use `nemo-convert export`"),
    (("import", "{qnemo}", "-o", "{out}"), "this is a .qnemo (a TensorRT-LLM checkpoint written by quantize)"),
    (("verify", "{qnemo}", "{hf}"), "this is a .qnemo"),
    (("export", "{ckpt}", "-o", "{out}"), "this is a training checkpoint, not a .nemo; to convert it into a "
                                          ".nemo use `nemo-convert from-ckpt`"),
    (("inspect", "{ckpt}"), "`nemo-convert from-ckpt`"),
    (("inspect", "{base}"), "nor any checkpoint nemo-convert reads"),
    (("from-ckpt", "{hf}", "-o", "{out}"), "this is a Hugging Face folder, not a training checkpoint; to "
                                           "convert it into a .nemo use `nemo-convert import`"),
    (("quantize", "{qnemo}", "-o", "{out}", "--algo", "none"), "this is a .qnemo"),
    (("reshard", "{clip}", "-o", "{out}", "--pp", "2"), "this model family has no pipeline-parallel layout"),
], ids=["export-hf", "reshard-hf", "import-nemo", "import-qnemo", "verify-qnemo", "export-ckpt", "inspect-ckpt",
        "inspect-folder-of-things", "from-ckpt-hf", "quantize-qnemo", "reshard-clip-pp"])
def test_wrong_kind_says_what_it_is_and_which_command(argv, says, kinds, cli, tmp_path):
    argv = [a.format(out=str(tmp_path / "out"), **kinds) for a in argv]
    code, out, err = cli(*argv)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(ERROR), err
    assert says in err
    assert not os.path.exists(tmp_path / "out")


def test_inspect_reads_a_qnemo_folder(kinds, cli):
    code, out, _ = cli("inspect", kinds["qnemo"], "--json")
    assert code == 0
    info = json.loads(out)
    assert info["format"] == "qnemo"
    assert [r["file"] for r in info["ranks"]] == ["rank0.safetensors", "rank1.safetensors"]
    assert info["config"]["mapping"]["tp_size"] == 2
    assert info["num_tensors"] == sum(r["tensors"] for r in info["ranks"]) > 0
    assert all(t["name"].startswith(("rank0/", "rank1/")) for t in info["tensors"])
    code, out, _ = cli("inspect", kinds["qnemo"])
    assert code == 0 and "rank1.safetensors:" in out
    # issue 20: not "family unknown", which says nothing about a TensorRT-LLM checkpoint
    assert out.splitlines()[0].endswith("qnemo, TensorRT-LLM checkpoint, architecture LlamaForCausalLM, 2 rank files, "
                                        f"{info['num_tensors']} tensors, 402.5 KiB") and "unknown" not in out


def test_quantize_counts_rank_files_in_english(kinds, cli, tmp_path):
    code, _, err = cli("quantize", kinds["nemo"], "-o", str(tmp_path / "q"), "--algo", "none")
    assert code == 0 and "TP 1 × PP 1 (1 rank file)," in err, err


def test_inspect_dot_does_not_search_subfolders(kinds, cli, monkeypatch):
    monkeypatch.chdir(os.path.dirname(kinds["ckpt"]) + "/..")  # holds m.nemo, hf/, … but is none of them
    code, _, err = cli("inspect", ".")
    assert code == 2 and "no member named" not in err and "nor any checkpoint" in err


# --------------------------------------------------------------------------- hub ids


def _cache_like_huggingface_hub(cache: str, repo_id: str, folder: str, commit: str, revision: str) -> str:
    """Put ``folder``'s files into ``cache`` the way ``hf_hub_download`` does — blobs named by
    their hash, snapshot symlinks, ``refs/<revision>`` — with huggingface_hub's own helpers."""
    import hashlib

    from huggingface_hub import file_download as fd

    storage = os.path.join(cache, fd.repo_folder_name(repo_id=repo_id, repo_type="model"))
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        blob = os.path.join(storage, "blobs", hashlib.sha256(data).hexdigest())
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        with open(blob, "wb") as f:
            f.write(data)
        pointer = os.path.join(storage, "snapshots", commit, name)
        os.makedirs(os.path.dirname(pointer), exist_ok=True)
        fd._create_symlink(blob, pointer, new_blob=False)
    fd._cache_commit_hash_for_specific_revision(storage, revision, commit)
    return storage


def test_hub_id_is_read_from_the_local_cache(kinds, cli, tmp_path, monkeypatch):
    from huggingface_hub import try_to_load_from_cache

    cache = str(tmp_path / "hf-home" / "hub")
    commit = "0123456789abcdef0123456789abcdef01234567"
    _cache_like_huggingface_hub(cache, "tiny-org/tiny-llama", kinds["hf"], commit, "main")
    found = try_to_load_from_cache("tiny-org/tiny-llama", "config.json", cache_dir=cache)
    assert isinstance(found, str) and commit in found  # huggingface_hub agrees on the layout
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.chdir(tmp_path)  # tiny-org/tiny-llama is no local path here
    code, out, err = cli("import", "tiny-org/tiny-llama", "-o", "x.nemo", "--json")
    assert code == 0, err
    assert json.loads(out)["tensors"] > 0
    code, _, err = cli("verify", "tiny-org/tiny-llama", kinds["nemo"], "-q")
    assert code == 0, err
    code, _, err = cli("import", "tiny-org/tiny-llama", "-o", "y.nemo", "--revision", commit, "-q")
    assert code == 0, err
    monkeypatch.setenv("HF_HUB_CACHE", cache)  # HF_HUB_CACHE wins over HF_HOME
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    code, _, err = cli("quantize", "tiny-org/tiny-llama", "-o", "z.qnemo", "--algo", "none", "-q")
    assert code == 0, err
    for extra in ((), ("--revision", commit)):  # issue 20: inspect takes a cached hub id too
        code, out, err = cli("inspect", "tiny-org/tiny-llama", "--json", *extra)
        assert code == 0, err
        info = json.loads(out)
        assert info["format"] == "hf" and info["family"] == "llama" and commit in info["path"]


def test_a_mistyped_folder_is_not_taken_for_a_hub_id(cli, tmp_path, monkeypatch):
    """Issue 20: ``import nope -o x.nemo`` suggested ``hf download nope``. A bare name that is
    neither a local path nor cached is a missing file; an ``org/name`` still gets the hint."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    for argv in (("import", "nope", "-o", "x.nemo"), ("inspect", "nope"), ("verify", "nope", "nope2")):
        code, _, err = cli(*argv)
        assert code == 2 and err == "nemo-convert: error: nope: no such file or folder\n", (argv, err)
    assert os.listdir(tmp_path) == []


def test_uncached_hub_id_names_the_download_command(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("import", "meta-llama/Llama-3.2-1B", "-o", "x.nemo")
    assert code == 2 and err.count("\n") == 1, err
    assert "is not in the hub cache" in err and "`hf download meta-llama/Llama-3.2-1B`" in err
    assert "huggingface-cli download meta-llama/Llama-3.2-1B" in err
    code, out, err = cli("import", "meta-llama/Llama-3.2-1B", "--revision", "v1", "-o", "x.nemo")
    assert "`hf download meta-llama/Llama-3.2-1B --revision v1`" in err
    assert os.listdir(tmp_path) == ["empty-cache"] or not os.listdir(tmp_path)


# --------------------------------------------------------------------------- output defects


def test_plugins_and_verify_fit_80_columns_when_piped(kinds, cli, monkeypatch, tmp_path):
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = cli("plugins")
    assert code == 0 and "llava (LlavaForConditionalGeneration)" in out
    assert max(map(len, out.splitlines())) <= 80, out
    other = make_tiny_llama(str(tmp_path / "other"), seed=1)
    code, out, _ = cli("verify", kinds["hf"], other, "--top", "3")
    assert code == 1
    assert max(map(len, out.splitlines())) <= 80, out
    assert "  model.embed_tokens.weight" in out.splitlines()  # names whole, on their own line
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal keeps the tables
    code, out, _ = cli("verify", kinds["hf"], other, "--top", "3")
    assert "┃ tensor" in out


def test_json_errors_are_a_json_object_on_stdout(cli, tmp_path):
    code, out, err = cli("inspect", str(tmp_path / "missing"), "--json")
    assert code == 2 and err.startswith(ERROR)
    assert json.loads(out) == {"error": f"{tmp_path / 'missing'}: no such file or folder", "kind": "InputError"}
    (tmp_path / "empty").mkdir()
    code, out, _ = cli("import", str(tmp_path / "empty"), "-o", str(tmp_path / "x.nemo"), "--json")
    assert code == 2 and json.loads(out)["kind"] == "InputError"
    code, out, _ = cli("inspect", str(tmp_path / "missing"))
    assert out == ""  # without --json, stdout stays empty


def test_many_unconsumed_tensors_are_summarised_by_pattern():
    from nemo_convert.errors import MappingError

    keys = [f"model.layers.{i}.block_sparse_moe.experts.{e}.w{w}.weight"
            for i in range(4) for e in range(64) for w in (1, 2, 3)]
    msg = str(MappingError("the checkpoint does not match", unconsumed=keys))
    assert "768 tensors" in msg and "model.layers.*.block_sparse_moe.experts.*.w1.weight (×256)" in msg
    assert len(msg) < 500
    assert str(MappingError("x", unconsumed=["a.0.b", "a.1.b"])) == "x; source tensors not consumed: a.0.b, a.1.b"


def test_duplicate_token_error_names_the_cli_flag(tmp_path, cli):
    from tiny_models import make_tiny_llama as make

    hf = make(str(tmp_path / "hf"))
    tok = os.path.join(hf, "tokenizer.model")
    code, _, err = cli("tokenizer", "add-tokens", tok, "-o", str(tmp_path / "p.model"), "--tokens", "<unk>")
    assert code == 2 and "--skip-existing" in err and "pass skip_existing" not in err


def test_torchrun_bar_and_summary_say_what_they_count(capsys):
    import argparse

    from rich.console import Console

    from nemo_convert.cli.common import report
    from nemo_convert.cli.progress import make_progress
    from nemo_convert.convert.common import ConversionReport
    from nemo_convert.workers import Workers

    import io

    args = argparse.Namespace(quiet=False, json=False, workers=Workers(0, 2))
    bar = make_progress(args)
    bar._console = Console(file=io.StringIO(), width=80, color_system=None)
    for phase in ("calibrate", "write"):
        bar.start(phase, 1_500_000_000, 1234)
        bar.advance(700_000_000, 600)
        if phase == "write":  # issue 20: at 80 columns the bar was squashed by its label
            with bar._console.capture() as cap:
                bar._console.print(bar._bar.get_renderable())
            line = cap.get()
            assert line.count("\n") == 1 and line.startswith("write ━━━━━━━━━━"), line
            assert "600/1234 tensors" in line, line
        bar.finish()
    assert bar._console.file.getvalue().count("note: the bar shows process 0's share of the work of 2 processes; "
                                              "the summary counts all") == 1
    report(args, ConversionReport("out.nemo", "llama", 10, 1000, 1.0), "wrote")
    assert "all 2 processes together (the bar showed process 0's share)" in capsys.readouterr().err


# --------------------------------------------------------------------------- a failed run leaves nothing


def test_errors_name_the_output_not_the_staging_path(kinds, cli, tmp_path, monkeypatch):
    import errno

    from nemo_convert.formats.io import staging

    real_mkdir = os.mkdir

    def read_only(path, *a, **kw):  # type: ignore[no-untyped-def]
        if ".nemo-convert-partial-" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_mkdir(path, *a, **kw)

    monkeypatch.setattr(staging.os, "mkdir", read_only)
    out = str(tmp_path / "made" / "for" / "it" / "back")
    code, _, err = cli("export", kinds["nemo"], "-o", out)
    assert code == 2
    assert err == f"nemo-convert: error: {out}: Read-only file system\n"
    assert not os.path.exists(tmp_path / "made")  # the folders created for the output are gone too


def test_an_interrupted_run_removes_the_folders_it_created(kinds, cli, tmp_path, monkeypatch):
    from nemo_convert.formats.io import staging

    (tmp_path / "mine").mkdir()

    def interrupt(*a, **kw):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(staging, "_install", interrupt)
    code, _, err = cli("import", kinds["hf"], "-o", str(tmp_path / "mine" / "new" / "deeper" / "m.nemo"))
    assert code == 130 and "interrupted" in err
    assert os.listdir(tmp_path) == ["mine"] and os.listdir(tmp_path / "mine") == []  # ours stays


@pytest.mark.slow
def test_an_interrupt_while_exiting_prints_no_traceback():
    import subprocess
    import sys

    code = ("import os, signal, sys, time\n"
            "from nemo_convert.cli.main import main\n"
            "sys.argv = ['nemo-convert', 'plugins', '-q']\n"
            "code = main()\n"
            "os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the process exits\n"
            "time.sleep(0.2)\n"
            "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- demo


@pytest.mark.slow
def test_demo_from_ckpt_cleans_its_temporary_folder(cli, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, err = cli("demo", "--from-ckpt", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["from_ckpt"] and result["tensors_identical"] and result["logits_identical"]
    assert result["nemo"].endswith("tiny-llama-from-ckpt.nemo") and not result["kept"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith("nemo-convert-demo-")]  # our folder is gone


def test_demo_workdir_is_never_a_folder_of_the_users(kinds, cli, tmp_path):
    """Issue 20: ``demo --workdir`` wrote its files into an existing model folder. A folder
    holding anything but the demo's own files is refused before anything is generated."""
    import shutil

    model = tmp_path / "my-model"
    shutil.copytree(kinds["hf"], model)
    before = sorted(os.listdir(model))
    code, _, err = cli("demo", "--workdir", str(model))
    assert code == 2 and err == (f"nemo-convert: error: --workdir {model}: holds files that are not the demo's "
                                 f"({', '.join(before)}); the demo writes tiny-llama-hf/, tiny-llama.nemo and more "
                                 "into it: name a new or empty folder\n")
    assert sorted(os.listdir(model)) == before
    (tmp_path / "a-file").write_text("x")
    assert cli("demo", "--workdir", str(tmp_path / "a-file"))[0] == 2


@pytest.mark.slow
def test_demo_lines_do_not_wrap_when_piped(cli, tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    work = tmp_path / ("a-long-folder-name-" * 4) / "demo"
    code, _, err = cli("demo", "--workdir", str(work), "--from-ckpt")
    assert code == 0, err
    lines = err.splitlines()
    assert "tensors bit-identical: True; logits identical: True" in lines
    assert any(line.startswith("from-ckpt → ") and line.endswith("training-state tensors)") for line in lines)
    assert (work / "checkpoints" / "megatron_gpt--step=1-last.ckpt").is_file()  # --workdir is kept
    code, _, err = cli("demo", "--workdir", str(work), "-q")  # a demo's own folder is used again
    assert code == 0, err


# --------------------------------------------------------------------------- calibration


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    import torch

    return make_tiny_llama(str(tmp_path_factory.mktemp("bf16") / "hf"), dtype=torch.bfloat16)


def test_quiet_and_json_calibration_print_nothing_else(bf16_llama, cli, tmp_path):
    code, out, err = cli("quantize", bf16_llama, "-o", str(tmp_path / "a.qnemo"), "--algo", "fp8", "--json")
    assert code == 0
    assert err == ""  # no transformers "Loading weights" bar, log lines or warnings
    cal = json.loads(out)["calibration"]
    assert (cal["samples"], cal["seq_len"], cal["device"]) == (16, 256, "cpu")
    assert cal["sized"].startswith("default on the CPU for ")
    code, out, err = cli("quantize", bf16_llama, "-o", str(tmp_path / "b.qnemo"), "--algo", "fp8",
                         "--kv-cache", "fp8", "-q")
    assert code == 0 and out == "" and err == ""


def test_calibration_says_what_it_ran(bf16_llama, cli, tmp_path):
    code, _, err = cli("quantize", bf16_llama, "-o", str(tmp_path / "a.qnemo"), "--algo", "fp8")
    assert code == 0
    assert "Loading weights" not in err
    assert "calibration: 16 rows × 256 tokens of built-in text on cpu in " in err
    code, out, err = cli("quantize", bf16_llama, "-o", str(tmp_path / "b.qnemo"), "--algo", "fp8",
                         "--calib-size", "3", "--calib-seq-len", "40", "--json")
    cal = json.loads(out)["calibration"]
    assert (cal["samples"], cal["seq_len"], cal["tokens"], cal["sized"]) == (3, 40, 120, "given")


def test_default_calibration_size_follows_model_and_device():
    import torch

    from nemo_convert.qnemo.calibration import calibration_size

    tiny = calibration_size(n_params=200_000, num_layers=2, hidden=64, max_positions=4096,
                            device=torch.device("cpu"))
    assert (tiny.samples, tiny.seq_len) == (16, 256)
    big = calibration_size(n_params=1_200_000_000, num_layers=16, hidden=2048, max_positions=131072,
                           device=torch.device("cpu"))
    assert (big.samples, big.seq_len) == (4, 256) and big.est_seconds > 60
    short = calibration_size(n_params=200_000, num_layers=2, hidden=64, max_positions=128,
                             device=torch.device("cpu"))
    assert short.seq_len == 128
    gpu = calibration_size(n_params=1_200_000_000, num_layers=16, hidden=2048, max_positions=131072,
                           device=torch.device("cuda"))
    assert (gpu.samples, gpu.seq_len) == (64, 512)


def test_a_tokenizer_error_is_one_line(bf16_llama, cli, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(bf16_llama, broken)
    os.remove(broken / "tokenizer.model")
    (broken / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizerFast"}))
    (broken / "tokenizer.json").write_text("{ this is not a tokenizer\n")
    code, out, err = cli("quantize", str(broken), "-o", str(tmp_path / "x.qnemo"), "--algo", "fp8")
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(ERROR) and "cannot load a tokenizer" in err, err
    assert not os.path.exists(tmp_path / "x.qnemo")


def test_json_usage_errors_are_a_json_object_too(cli, capsys):
    with pytest.raises(SystemExit) as exc:
        cli("inspect", "x", "--json", "--no-such-flag")
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert json.loads(out) == {"error": "unrecognized arguments: --no-such-flag", "kind": "usage"}


def test_a_missing_file_is_not_taken_for_a_hub_id(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("verify", "missing.nemo", "other.nemo")
    assert code == 2 and err == "nemo-convert: error: missing.nemo: no such file or folder\n"
