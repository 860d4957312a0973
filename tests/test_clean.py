"""Partial outputs of killed runs are announced and removed on request (issue 20, item 5).

A run killed with ``SIGKILL`` leaves its hidden staging entry
(``.<name>.nemo-convert-partial-<pid>-<hex>``; 485 MB in the issue) that later runs never
mentioned. Now a run writing into that folder warns, naming the entries and their size and
``nemo-convert clean``; ``nemo-convert clean FOLDER`` removes our own partials whose process
is gone, and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest

from nemo_convert import api
from nemo_convert.formats.io.staging import PartialsWarning, find_partials
from tiny_models import make_tiny_llama


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def folder(tmp_path):
    """A folder with two partials of dead runs (a file and a several-process ``.parts``
    folder), one of this (running) process, and files of the user's that look close."""
    dead = _dead_pid()
    d = tmp_path / "models"
    d.mkdir()
    (d / f".a.nemo.nemo-convert-partial-{dead}-0a1b2c3d").write_bytes(b"\0" * 3000)
    parts = d / f".b.nemo.nemo-convert-partial-{dead}-00ff.parts"
    parts.mkdir()
    (parts / "__0_0.distcp").write_bytes(b"\0" * 2048)
    (d / f".c.nemo.nemo-convert-partial-{os.getpid()}-1234abcd").write_bytes(b"live")
    for name in (".a.nemo.nemo-convert-partial", ".notes", "notes.txt", f"x.nemo-convert-partial-{dead}-00"):
        (d / name).write_bytes(b"mine")
    return d


def _names(d) -> list[str]:
    return sorted(os.listdir(d))


def test_clean_removes_only_our_partials_of_gone_processes(folder, cli):
    before = _names(folder)
    code, out, err = cli("clean", str(folder), "--dry-run")
    assert code == 0 and _names(folder) == before
    assert "would remove 2 partial output(s), 4.9 KiB" in err
    code, out, err = cli("clean", str(folder), "--json")
    assert code == 0
    doc = json.loads(out)
    ours = [n for n in before if n.startswith((".a.nemo.nemo-convert-partial-", ".b."))]
    assert len(ours) == 2 and [os.path.basename(e["path"]) for e in doc["removed"]] == ours
    assert doc["bytes"] == 3000 + 2048 and doc["dry_run"] is False
    assert [e["reason"] for e in doc["kept"]] == [f"process {os.getpid()} is running"]
    assert _names(folder) == [n for n in before if n not in ours]
    assert ".a.nemo.nemo-convert-partial" in _names(folder)  # close, but not our name: kept
    code, _, err = cli("clean", str(folder))
    assert code == 0 and "removed 0 partial output(s)" in err and "kept" in err


def test_clean_older_than_keeps_young_entries(folder, cli):
    code, out, _ = cli("clean", str(folder), "--older-than", "3600", "--json")
    assert code == 0 and json.loads(out)["removed"] == []
    assert len(find_partials(str(folder))) == 3


def test_clean_refuses_what_is_not_a_folder(tmp_path, cli):
    code, _, err = cli("clean", str(tmp_path / "nope"))
    assert code == 2 and err == f"nemo-convert: error: {tmp_path / 'nope'}: no such folder; pass the folder the " \
                                "output was written into\n"
    (tmp_path / "f").write_text("x")
    code, _, err = cli("clean", str(tmp_path / "f"))
    assert code == 2 and "not a folder" in err
    code, _, err = cli("clean", str(tmp_path))
    assert code == 0 and err == f"no partial outputs in {tmp_path}\n"


def test_a_run_into_a_folder_with_partials_warns(folder, tmp_path, cli):
    hf = make_tiny_llama(str(tmp_path / "hf"))
    names = sorted(n for n in os.listdir(folder) if n.startswith((".a.nemo.nemo-convert-partial-", ".b.")))
    with pytest.warns(PartialsWarning) as caught:
        code, _, _ = cli("import", hf, "-o", str(folder / "m.nemo"))
    assert code == 0
    assert [str(w.message) for w in caught] == [
        f"{folder} holds 2 partial output(s) of killed runs (4.9 KiB): {names[0]} (2.9 KiB), {names[1]} (2.0 KiB); "
        f"remove them with `nemo-convert clean {folder}`"]
    with pytest.warns(PartialsWarning, match="2 partial output"):
        api.export_hf(str(folder / "m.nemo"), str(folder / "back"))
    with warnings.catch_warnings(record=True) as quiet:  # --quiet: errors only
        warnings.simplefilter("always")
        assert cli("export", str(folder / "m.nemo"), "-o", str(folder / "back2"), "-q")[0] == 0
    assert quiet == []
    assert cli("clean", str(folder), "-q")[0] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartialsWarning)
        assert cli("import", hf, "-o", str(folder / "m2.nemo"), "-q")[0] == 0


_CHILD = textwrap.dedent("""
    import sys, time
    from nemo_convert.formats.io.staging import staged_output
    with staged_output(sys.argv[1], overwrite=False, is_dir=False, kind="nemo") as stage:
        with open(stage, "wb") as f:
            f.write(b"x" * 100000); f.flush()
            print("ready", flush=True)
            time.sleep(600)
""")


@pytest.mark.slow  # child processes: one killed, then the command line as a user runs it
def test_a_sigkilled_run_is_announced_then_cleaned(tmp_path):
    out = tmp_path / "run" / "m.nemo"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(out)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    left = os.listdir(tmp_path / "run")
    assert len(left) == 1 and left[0].startswith(f".m.nemo.nemo-convert-partial-{child.pid}-")
    hf = make_tiny_llama(str(tmp_path / "hf"))

    def nemo_convert(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nemo_convert", *argv], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)

    run = nemo_convert("import", hf, "-o", "run/m.nemo")
    assert run.returncode == 0
    assert run.stderr.splitlines()[0] == (
        f"nemo-convert: warning: run holds 1 partial output(s) of killed runs (97.7 KiB): {left[0]} (97.7 KiB); "
        "remove them with `nemo-convert clean run`")
    run = nemo_convert("clean", "run")
    assert run.returncode == 0 and run.stderr.splitlines() == [
        f"removed run/{left[0]} (97.7 KiB; process {child.pid} is gone)", "removed 1 partial output(s), 97.7 KiB"]
    assert sorted(os.listdir(tmp_path / "run")) == ["m.nemo"]
    run = nemo_convert("import", hf, "-o", "run/m2.nemo")
    assert run.returncode == 0 and "warning" not in run.stderr
