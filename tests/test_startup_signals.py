"""An interrupt while the program is still loading is one line and exit 130 (issue 20, item 3).

Before, Ctrl-C in the first seconds of a run (while the command line, torch and the plugins
are imported) printed a 34–87-line ``KeyboardInterrupt`` traceback, and ``SIGTERM`` there
ended the process silently with 143. Now :mod:`nemo_convert.cli.startup` installs its
handlers before those imports.

The moments are found, not guessed: ``/proc/<pid>/status`` says when the process starts
catching ``SIGTERM`` (the start-up guard is in place: Python itself only catches
``SIGINT``), and ``/proc/<pid>/maps`` when torch's shared library is being loaded (the
longest part of the start). The signal is sent at each of these moments, and at fixed delays
after the first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tiny_models import make_tiny_llama

pytestmark = [pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc"), pytest.mark.slow]

LINE = "nemo-convert: interrupted; no output was written\n"
SCRIPT = os.path.join(os.path.dirname(sys.executable), "nemo-convert")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("startup") / "hf"))


def _catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _loading_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch" in f.read()


def _run_until(argv: list[str], moment: str, sig: int, delay: float = 0.0) -> subprocess.CompletedProcess:
    """Start ``argv``, wait for ``moment`` ("guard": the handlers are in place; "torch": torch
    is being loaded) plus ``delay`` seconds, send ``sig``; the finished process."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    test = _catches_sigterm if moment == "guard" else _loading_torch
    deadline = time.monotonic() + 120
    try:
        while not test(proc.pid):
            assert proc.poll() is None, "the program ended before the moment came"
            assert time.monotonic() < deadline
            time.sleep(0.002)
    except FileNotFoundError:  # /proc/<pid> gone: it ended
        pass
    time.sleep(delay)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("sig,moment,how", [
    (signal.SIGINT, "guard", "script"), (signal.SIGINT, "torch", "module"), (signal.SIGTERM, "guard", "module"),
    (signal.SIGTERM, "torch", "script"), (signal.SIGHUP, "torch", "module")])
def test_an_interrupt_while_loading_is_one_line_and_130(hf, tmp_path, sig, moment, how):
    out = str(tmp_path / "m.nemo")
    argv = ([SCRIPT] if how == "script" else [sys.executable, "-m", "nemo_convert"]) + ["import", hf, "-o", out]
    run = _run_until(argv, moment, sig)
    assert (run.returncode, run.stderr, run.stdout) == (130, LINE, "")
    assert os.listdir(tmp_path) == []


def test_json_gets_the_error_object_too(hf, tmp_path):
    argv = [sys.executable, "-m", "nemo_convert", "import", hf, "-o", str(tmp_path / "m.nemo"), "--json"]
    run = _run_until(argv, "torch", signal.SIGINT)
    assert run.returncode == 130 and run.stderr == LINE
    assert json.loads(run.stdout) == {"error": "interrupted; no output was written", "kind": "interrupted"}


@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0])
def test_no_moment_of_the_start_gives_a_traceback(hf, tmp_path, delay):
    """After the guard is in place, whenever Ctrl-C lands — still loading, or already
    running the command — it is one line and 130 (or, too late, the finished output)."""
    out = tmp_path / "m.nemo"
    run = _run_until([SCRIPT, "import", hf, "-o", str(out)], "guard", signal.SIGINT, delay)
    assert "Traceback" not in run.stderr
    if run.returncode == 130:
        assert run.stderr.endswith(LINE) and not out.exists()
    else:  # the command had finished: the output is complete
        assert run.returncode == 0 and out.is_file(), run.stderr
