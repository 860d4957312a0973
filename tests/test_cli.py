"""The ``nemo-convert`` command line: help for every command, JSON and quiet output, one-line
errors and exit codes, overwrite protection, ``inspect`` and ``plugins``."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile

import pytest
import torch

from nemo_convert.cli.main import build_parser
from nemo_convert.errors import NemoConvertError
from tiny_models import make_tiny_llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERROR_PREFIX = "nemo-convert: error:"


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every (sub)command path the parser knows, nested sub-commands included."""
    out: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append(prefix + (name,))
                out.extend(_commands(sub, prefix + (name,)))
    return out


COMMANDS = _commands(build_parser())


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nemo_convert", *args], capture_output=True, text=True,
                          check=False, timeout=120, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny HF Llama (GQA, head_dim ≠ H/nh) and its .nemo in both layouts. Read-only."""
    base = tmp_path_factory.mktemp("cli_models")
    hf = make_tiny_llama(str(base / "hf"), head_dim=24)
    from nemo_convert import api

    api.import_hf(hf, str(base / "dist.nemo"))
    api.import_hf(hf, str(base / "legacy.nemo"), layout="legacy")
    return {"hf": hf, "dist": str(base / "dist.nemo"), "legacy": str(base / "legacy.nemo")}


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
    """The end-to-end subprocess runs, started together: each spends most of its time
    importing torch, so side by side they take about half as long."""
    base = tmp_path_factory.mktemp("runs")
    argvs = {
        "json": ("import", models["hf"], "-o", str(base / "json.nemo"), "--layout", "legacy", "--json"),
        "quiet": ("import", models["hf"], "-o", str(base / "quiet.nemo"), "--quiet"),
        "bad": ("import", str(base / "nope"), "-o", str(base / "bad.nemo")),
        "debug": ("import", str(base / "nope"), "-o", str(base / "debug.nemo"), "--debug"),
    }
    procs = {k: subprocess.Popen([sys.executable, "-m", "nemo_convert", *a], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=ROOT) for k, a in argvs.items()}
    done = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=180)
        done[k] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    return base, done


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(ERROR_PREFIX), err
    assert "Traceback" not in err
    return lines[0]


def snapshot(path: str) -> tuple[bytes, int]:
    with open(path, "rb") as f:
        return f.read(), os.stat(path).st_mtime_ns


# --------------------------------------------------------------------------- help
def test_commands_are_discovered():
    names = {c[0] for c in COMMANDS}
    assert {"import", "export", "inspect", "plugins"} <= names


@pytest.mark.slow  # subprocesses
def test_top_level_help():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: nemo-convert" in proc.stdout
    for name in {c[0] for c in COMMANDS}:
        assert name in proc.stdout  # every command is listed


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_command_help(command, cli, capsys):
    with pytest.raises(SystemExit) as ei:
        cli(*command, "--help")
    assert ei.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: nemo-convert " + " ".join(command))
    assert len(out.strip().splitlines()) > 2
    assert err == ""


@pytest.mark.slow  # subprocesses
def test_version():
    from nemo_convert import __version__

    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"nemo-convert {__version__}"


def test_no_command_is_a_usage_error(cli):
    with pytest.raises(SystemExit) as ei:
        cli()
    assert ei.value.code == 2


# --------------------------------------------------------------------------- import / export
def test_import_and_export_json(models, tmp_path, cli):
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    code, out, _ = cli("import", models["hf"], "-o", nemo, "--json")
    assert code == 0
    rep = json.loads(out)  # stdout is exactly one JSON document
    assert rep["output"] == nemo and rep["family"] == "llama" and rep["layout"] == "dist"
    assert rep["tensors"] == 15  # 2 layers × 6 + embedding, final norm, output layer
    hf_bytes = sum(os.path.getsize(os.path.join(models["hf"], f)) for f in os.listdir(models["hf"])
                   if f.endswith(".safetensors"))
    assert 0 < rep["bytes"] < hf_bytes  # tensor bytes, without the safetensors header
    assert tarfile.is_tarfile(nemo)

    code, out, _ = cli("export", nemo, "-o", back, "--json")
    assert code == 0
    rep2 = json.loads(out)
    assert rep2["output"] == back and rep2["tensors"] == 21 and rep2["bytes"] == rep["bytes"]
    assert os.path.isfile(os.path.join(back, "config.json"))


@pytest.mark.slow  # subprocesses
def test_import_as_a_subprocess_with_json(runs):
    base, done = runs
    proc = done["json"]
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)  # nothing but the JSON document on stdout
    assert {"tensors", "bytes", "output"} <= set(rep) and rep["layout"] == "legacy"
    assert rep["output"] == str(base / "json.nemo") and os.path.isfile(rep["output"])


@pytest.mark.slow  # subprocesses
def test_quiet_prints_nothing(runs):
    base, done = runs
    proc = done["quiet"]
    assert proc.returncode == 0
    assert proc.stdout == "" and proc.stderr == ""
    assert tarfile.is_tarfile(base / "quiet.nemo")


def test_quiet_export_prints_nothing(models, tmp_path, cli):
    code, out, err = cli("export", models["dist"], "-o", str(tmp_path / "back"), "-q")
    assert (code, out, err) == (0, "", "")


def test_default_prints_a_summary_on_stderr(models, tmp_path, cli):
    code, out, err = cli("import", models["hf"], "-o", str(tmp_path / "m.nemo"))
    assert code == 0 and out == ""
    assert "wrote" in err and "15 tensors" in err and "family llama" in err


# --------------------------------------------------------------------------- errors
@pytest.mark.slow  # subprocesses
def test_bad_input_is_one_line_and_exit_2(runs):
    base, done = runs
    proc = done["bad"]
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert str(base / "nope") in line
    assert proc.stdout == ""
    assert not os.path.exists(base / "bad.nemo")


@pytest.mark.slow  # subprocesses
def test_debug_shows_a_traceback(runs):
    base, done = runs
    proc = done["debug"]
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "InputError" in proc.stderr
    assert not os.path.exists(base / "debug.nemo")


@pytest.mark.parametrize("argv", [
    ("export", "{tmp}/missing.nemo", "-o", "{tmp}/out"),
    ("inspect", "{tmp}/missing"),
    ("export", "{tmp}/not_a.nemo", "-o", "{tmp}/out"),
    ("inspect", "{tmp}/not_a.nemo", "--json"),
    ("import", "{tmp}/nope_hf", "-o", "{tmp}/out.nemo"),
    ("import", "{hf}", "-o", "{tmp}/out.nemo", "--family", "no-such-family"),
    ("export", "{dist}", "-o", "{tmp}/out", "--max-shard-size", "lots"),
], ids=["export-missing", "inspect-missing", "export-not-tar", "inspect-not-tar", "import-unknown-arch",
        "import-unknown-family", "export-bad-size"])
def test_errors_are_one_line(argv, models, tmp_path, cli):
    (tmp_path / "not_a.nemo").write_bytes(b"this is not a tar archive\n" * 40)
    (tmp_path / "nope_hf").mkdir()
    (tmp_path / "nope_hf" / "config.json").write_text(json.dumps(
        {"architectures": ["NopeForCausalLM"], "model_type": "nope"}))
    argv = [a.format(tmp=tmp_path, **models) for a in argv]
    code, out, err = cli(*argv)
    assert code == 2
    message = one_error_line(err)
    if "--json" in argv:  # the error is also the JSON document on stdout
        assert json.loads(out) == {"error": message.removeprefix(ERROR_PREFIX + " "), "kind": "InputError"}
    else:
        assert out == ""
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "out.nemo")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_existing_output_is_refused_then_overwritten(models, tmp_path, cli):
    nemo = tmp_path / "m.nemo"
    assert cli("import", models["hf"], "-o", str(nemo), "-q")[0] == 0
    before = snapshot(str(nemo))
    code, _, err = cli("import", models["hf"], "-o", str(nemo))
    assert code == 2
    assert one_error_line(err) == f"nemo-convert: error: {nemo} exists; pass --overwrite to replace it"
    assert snapshot(str(nemo)) == before
    assert sorted(os.listdir(tmp_path)) == ["m.nemo"]  # no staging leftovers

    code, _, _ = cli("import", models["hf"], "-o", str(nemo), "--overwrite", "-q")
    assert code == 0
    assert tarfile.is_tarfile(nemo)
    assert sorted(os.listdir(tmp_path)) == ["m.nemo"]


def test_a_file_that_is_not_a_nemo_is_never_overwritten(models, tmp_path, cli):
    nemo = tmp_path / "m.nemo"
    nemo.write_bytes(b"precious")
    for extra in ((), ("--overwrite",)):
        code, _, err = cli("import", models["hf"], "-o", str(nemo), *extra)
        assert code == 2
        assert one_error_line(err) == (
            f"nemo-convert: error: {nemo}: is a file that is not a .nemo checkpoint (not a tar archive); refusing "
            "to replace it (--overwrite replaces only a .nemo checkpoint or an empty folder): move it away or "
            "choose another output")
        assert nemo.read_bytes() == b"precious" and sorted(os.listdir(tmp_path)) == ["m.nemo"]


def test_existing_export_folder_is_refused_then_overwritten(models, tmp_path, cli):
    out = tmp_path / "back"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for extra in ((), ("--overwrite",)):  # a folder holding the user's files: never replaced
        code, _, err = cli("export", models["dist"], "-o", str(out), *extra)
        assert code == 2
        assert "holds files that are not a Hugging Face checkpoint (keep.txt)" in one_error_line(err)
        assert os.listdir(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"

    (out / "keep.txt").unlink()  # an empty folder is replaced; then our own output is
    for _ in range(2):
        code, _, _ = cli("export", models["dist"], "-o", str(out), "--overwrite", "-q")
        assert code == 0 and (out / "config.json").is_file()
    assert sorted(os.listdir(tmp_path)) == ["back"]


def test_ctrl_c_exits_130_with_one_line(models, tmp_path, cli, monkeypatch):
    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("nemo_convert.api.import_hf", interrupted)
    code, out, err = cli("import", models["hf"], "-o", str(tmp_path / "m.nemo"))
    assert code == 130
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nemo-convert:") and "interrupted" in lines[0]
    with pytest.raises(KeyboardInterrupt):  # --debug lets it through
        cli("import", models["hf"], "-o", str(tmp_path / "m.nemo"), "--debug")


def test_internal_error_exits_1_and_points_to_debug(models, tmp_path, cli, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr("nemo_convert.api.export_hf", broken)
    code, out, err = cli("export", models["dist"], "-o", str(tmp_path / "back"))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "something inside broke" in lines[0] and "--debug" in lines[0]
    with pytest.raises(RuntimeError):
        cli("export", models["dist"], "-o", str(tmp_path / "back"), "--debug")


def test_user_errors_carry_their_exit_code(models, tmp_path, cli, monkeypatch):
    class Custom(NemoConvertError):
        exit_code = 3

    def refuse(*a, **kw):
        raise Custom("refused for a reason")

    monkeypatch.setattr("nemo_convert.api.import_hf", refuse)
    code, _, err = cli("import", models["hf"], "-o", str(tmp_path / "m.nemo"))
    assert code == 3
    assert one_error_line(err) == f"{ERROR_PREFIX} refused for a reason"


# --------------------------------------------------------------------------- inspect
def _check_table(info: dict) -> None:
    assert info["num_tensors"] == len(info["tensors"]) > 0
    for t in info["tensors"]:
        assert set(t) >= {"name", "shape", "dtype", "bytes"}
        dtype = getattr(torch, t["dtype"])
        assert t["bytes"] == math.prod(t["shape"]) * dtype.itemsize, t
    assert info["total_bytes"] == sum(t["bytes"] for t in info["tensors"])


def test_inspect_json_hf_and_nemo(models, cli):
    code, out, _ = cli("inspect", models["hf"], "--json")
    assert code == 0
    hf = json.loads(out)
    assert hf["format"] == "hf" and hf["layout"] is None and hf["family"] == "llama"
    _check_table(hf)
    by_name = {t["name"]: t for t in hf["tensors"]}
    assert by_name["model.layers.0.self_attn.q_proj.weight"]["shape"] == [4 * 24, 64]
    assert by_name["model.layers.0.self_attn.k_proj.weight"]["dtype"] == "float32"

    totals = {}
    for layout in ("dist", "legacy"):
        code, out, _ = cli("inspect", models[layout], "--json")
        assert code == 0
        nemo = json.loads(out)
        assert nemo["format"] == "nemo" and nemo["layout"] == layout and nemo["family"] == "llama"
        _check_table(nemo)
        qkv = {t["name"]: t for t in nemo["tensors"]}["decoder.layers.1.self_attention.linear_qkv.weight"]
        assert qkv["shape"] == [(4 + 2 * 2) * 24, 64] and qkv["dtype"] == "float32"
        totals[layout] = nemo["total_bytes"]
        assert nemo["config"]["num_query_groups"] == 2 and nemo["config"]["kv_channels"] == 24
    assert totals["dist"] == totals["legacy"] == hf["total_bytes"]


def test_inspect_text_output(models, cli):
    code, out, _ = cli("inspect", models["dist"])
    assert code == 0
    assert "nemo" in out and "dist" in out and "llama" in out
    assert "decoder.layers.0.mlp.linear_fc1.weight" in out


# --------------------------------------------------------------------------- plugins
def test_plugins_json(cli):
    code, out, _ = cli("plugins", "--json")
    assert code == 0
    data = json.loads(out)
    fams = {r["name"]: r for r in data["model_families"]}
    assert fams["llama"]["distribution"] == "nemo-convert"
    assert "LlamaForCausalLM" in fams["llama"]["hf_architectures"]
    shard = {r["name"]: r for r in data["sharding_strategies"]}
    assert shard["tensor"]["axis"] == "tp" and shard["pipeline"]["axis"] == "pp"
    assert {shard["tensor"]["distribution"], shard["pipeline"]["distribution"]} == {"nemo-convert"}
    assert isinstance(data["tokenizer_patchers"], list)


def test_plugins_table(cli):
    code, out, _ = cli("plugins")
    assert code == 0
    assert "llama" in out and "nemo-convert" in out and "tensor" in out and "pipeline" in out
