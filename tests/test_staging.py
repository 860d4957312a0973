"""Tests of atomic, staged outputs."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nemo_convert.errors import OutputExistsError
from nemo_convert.formats.io import staging as st
from nemo_convert.formats.io.staging import cleanup_stale_staging, install_signal_handlers, staged_output


def _hidden(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".nemo-convert-" in n)


def _old_nemo(target, *, folder: bool) -> None:
    """An existing .nemo at ``target`` (a tar, or the unpacked folder) with one extra member
    ``old.txt``: what --overwrite may replace."""
    import io
    import tarfile

    if folder:
        target.mkdir()
        (target / "model_config.yaml").write_bytes(b"a: 1\n")
        (target / "model_weights.ckpt").write_bytes(b"old")
        return
    with tarfile.open(str(target), "w") as tf:
        for name, data in (("model_config.yaml", b"a: 1\n"), ("old.txt", b"old")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_file_success_renames_into_place(tmp_path):
    target = tmp_path / "out.nemo"
    with staged_output(str(target), overwrite=False, is_dir=False, kind="nemo") as stage:
        assert os.path.dirname(stage) == str(tmp_path)
        name = os.path.basename(stage)
        assert name.startswith(".out.nemo.nemo-convert-partial-") and f"-{os.getpid()}-" in name
        assert not target.exists()
        with open(stage, "wb") as f:
            f.write(b"new")
    assert target.read_bytes() == b"new"
    assert _hidden(tmp_path) == []


def test_dir_success_and_parent_created(tmp_path):
    target = tmp_path / "sub" / "hf_out"
    with staged_output(str(target), overwrite=False, is_dir=True, kind="hf") as stage:
        assert os.path.isdir(stage)
        os.makedirs(os.path.join(stage, "a", "b"))
        with open(os.path.join(stage, "a", "b", "w.bin"), "wb") as f:
            f.write(b"w")
    assert (target / "a" / "b" / "w.bin").read_bytes() == b"w"
    assert _hidden(tmp_path / "sub") == []


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("is_dir", [False, True])
def test_failure_leaves_nothing(tmp_path, exc, is_dir):
    target = tmp_path / "out"
    with pytest.raises(exc):
        with staged_output(str(target), overwrite=False, is_dir=is_dir, kind="nemo") as stage:
            path = os.path.join(stage, "f") if is_dir else stage
            with open(path, "wb") as f:
                f.write(b"partial")
            raise exc()
    assert os.listdir(tmp_path) == []


def test_nothing_staged_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="not a file"):
        with staged_output(str(tmp_path / "out"), overwrite=False, is_dir=False, kind="nemo"):
            pass
    assert os.listdir(tmp_path) == []


def test_existing_target_without_overwrite(tmp_path):
    target = tmp_path / "out.nemo"
    _old_nemo(target, folder=False)
    old = target.read_bytes()
    entered = False
    with pytest.raises(OutputExistsError) as e:
        with staged_output(str(target), overwrite=False, is_dir=False, kind="nemo"):
            entered = True
    assert not entered
    assert str(e.value) == f"{target} exists; pass --overwrite to replace it"
    assert target.read_bytes() == old and os.listdir(tmp_path) == ["out.nemo"]


def test_target_appearing_meanwhile_is_not_clobbered(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(OutputExistsError):
        with staged_output(str(target), overwrite=False, is_dir=False, kind="nemo") as stage:
            open(stage, "wb").close()
            target.write_bytes(b"someone else's")
    assert target.read_bytes() == b"someone else's" and os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("old_dir", [False, True])
@pytest.mark.parametrize("new_dir", [False, True])
@pytest.mark.parametrize("exchange", [True, False])
def test_overwrite_replaces(tmp_path, monkeypatch, old_dir, new_dir, exchange):
    if not exchange:  # the fallback: rename aside, rename in, delete the old one
        real = st._renameat2
        monkeypatch.setattr(st, "_renameat2", lambda a, b, flags: errno.ENOSYS if flags == 2 else real(a, b, flags))
    target = tmp_path / "out"
    _old_nemo(target, folder=old_dir)
    old = b"" if old_dir else target.read_bytes()
    with staged_output(str(target), overwrite=True, is_dir=new_dir, kind="nemo") as stage:
        assert (target / "model_weights.ckpt").exists() if old_dir else target.read_bytes() == old
        with open(os.path.join(stage, "new.txt") if new_dir else stage, "wb") as f:
            f.write(b"new")
    if new_dir:
        assert os.listdir(target) == ["new.txt"]
    else:
        assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out"]


def test_overwrite_failure_keeps_old(tmp_path):
    target = tmp_path / "out"
    _old_nemo(target, folder=False)
    old = target.read_bytes()
    with pytest.raises(ValueError):
        with staged_output(str(target), overwrite=True, is_dir=False, kind="nemo") as stage:
            open(stage, "wb").write(b"half")
            raise ValueError
    assert target.read_bytes() == old and os.listdir(tmp_path) == ["out"]


_CHILD = textwrap.dedent("""
    import sys, time
    from nemo_convert.formats.io.staging import install_signal_handlers, staged_output
    install_signal_handlers()
    with staged_output(sys.argv[1], overwrite=False, is_dir=False, kind="nemo") as stage:
        with open(stage, "wb") as f:
            f.write(b"x" * 1000); f.flush()
            print("ready", flush=True)
            while True:
                f.write(b"x" * 1000); f.flush(); time.sleep(0.01)
""")


def _start_child(target: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, target], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


@pytest.mark.slow  # child processes
def test_sigkill_leaves_no_target_and_cleanup_removes_leftover(tmp_path):
    target = tmp_path / "out.nemo"
    child = _start_child(str(target))
    time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert not target.exists()
    leftovers = _hidden(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".out.nemo.nemo-convert-partial-")
    assert cleanup_stale_staging(str(tmp_path), max_age_s=3600) == []  # too young
    assert cleanup_stale_staging(str(tmp_path), max_age_s=0) == [str(tmp_path / leftovers[0])]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # child processes
def test_sigterm_runs_cleanup(tmp_path):
    target = tmp_path / "out.nemo"
    child = _start_child(str(target))
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=10)
    assert child.returncode != 0 and "Terminated" in err
    assert os.listdir(tmp_path) == []


def test_cleanup_spares_live_processes_and_other_files(tmp_path):
    mine = tmp_path / f".x.nemo.nemo-convert-partial-{os.getpid()}-abcd1234"
    mine.write_bytes(b"")
    unrelated = tmp_path / ".x.nemo-convert-partial"
    unrelated.write_bytes(b"")
    dead = tmp_path / ".x.nemo.nemo-convert-old-999999999-00ff"
    dead.mkdir()
    (dead / "f").write_bytes(b"")
    assert cleanup_stale_staging(str(tmp_path), max_age_s=0) == [str(dead)]
    assert sorted(os.listdir(tmp_path)) == sorted([mine.name, unrelated.name])
    assert cleanup_stale_staging(str(tmp_path / "missing")) == []


def test_signal_handlers_restore_and_respect_ignored():
    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        previous = install_signal_handlers()
        assert signal.SIGHUP not in previous and signal.SIGTERM in previous
        with pytest.raises(st.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    finally:
        signal.signal(signal.SIGHUP, old_hup)
    assert issubclass(st.Terminated, KeyboardInterrupt)
