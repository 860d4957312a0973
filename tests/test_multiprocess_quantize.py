"""``torchrun … -m nemo_convert quantize``: rank file ``i`` is written by process ``i mod
world``, calibration runs once in process 0, process 0 writes the rest; the ``.qnemo`` is
byte-identical to a one-process run, and a failure anywhere leaves nothing behind."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys

import pytest
import torch

from nemo_convert.examples import make_tiny_llama
from nemo_convert.qnemo import quantize

#: hidden/ffn fit int4 groups of 64 at TP 2; the vocabulary (321) is padded at TP 2.
GEOMETRY = {"vocab_size": 321, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2}
CALIB = {"calib_size": 4, "calib_seq_len": 32, "calib_batch_size": 4}

#: A process 1 that fails (disk full) while writing its rank files.
FAIL_IN_PROCESS_1 = """
import os, sys
from nemo_convert.qnemo.produce import Producer
if os.environ["RANK"] == "1":
    produced, real = [], Producer.__call__
    def failing(self, item):
        produced.append(item.key)
        if len(produced) == 5:
            raise OSError(28, "No space left on device")
        return real(self, item)
    Producer.__call__ = failing
from nemo_convert.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def torchrun(args: list[str], cwd: str, *, script: str | None = None) -> subprocess.CompletedProcess[str]:
    """``nemo-convert quantize ARGS -q`` under torchrun with two processes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    target = [script] if script else ["-m", "nemo_convert"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", *target,
           "quantize", *args, "-q"]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def cli_args(out: str, *, algo: str, tp: int, pp: int, compress: bool = False, kv_cache: str = "none",
             group_size: int = 128) -> list[str]:
    args = ["hf", "-o", out, "--algo", algo, "--tp", str(tp), "--pp", str(pp), "--kv-cache", kv_cache,
            "--group-size", str(group_size), "--calib-size", str(CALIB["calib_size"]),
            "--calib-seq-len", str(CALIB["calib_seq_len"]), "--calib-batch-size", str(CALIB["calib_batch_size"])]
    return args + (["--compress"] if compress else [])


def same_output(a: str, b: str) -> None:
    if os.path.isfile(a):
        assert filecmp.cmp(a, b, shallow=False)
        return
    cmp = filecmp.dircmp(a, b)
    assert not cmp.left_only and not cmp.right_only, (cmp.left_only, cmp.right_only)
    for f in cmp.common_files:
        assert filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), f


def hidden(folder: str) -> list[str]:
    """Staging entries, parts folders, calibration exports left beside the outputs."""
    return [p for p in os.listdir(folder) if p.startswith(".")]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpq")
    make_tiny_llama(str(d / "hf"), dtype=torch.bfloat16, **GEOMETRY)
    return d


# The one-process references run here; the torchrun processes run with OMP_NUM_THREADS=1.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # torchrun processes


CASES = {
    "none-tp2-pp2-folder": {"algo": "none", "tp": 2, "pp": 2},
    "int8_wo-tp2-tar": {"algo": "int8_wo", "tp": 2, "pp": 1, "compress": True},
    "fp8-kv-tp2-folder": {"algo": "fp8", "tp": 2, "pp": 1, "kv_cache": "fp8"},
    "int4_awq-tp2-pp2-tar": {"algo": "int4_awq", "tp": 2, "pp": 2, "compress": True, "group_size": 64},
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_write_the_same_bytes_as_one(work, case):
    kw = CASES[case]
    one = str(work / f"{case}-1.qnemo")
    rep = quantize(str(work / "hf"), one, **kw, **CALIB)
    assert len([f for f in rep.files if f.startswith("rank")]) >= 2
    r = torchrun(cli_args(f"{case}-2.qnemo", **kw), str(work))
    assert r.returncode == 0, r.stderr[-3000:]
    same_output(one, str(work / f"{case}-2.qnemo"))
    assert not hidden(str(work))


def assert_failed_cleanly(r: subprocess.CompletedProcess[str], folder: str, out: str, *expected: str) -> None:
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("nemo-convert: ")]
    assert errors and all(line.startswith("nemo-convert: error: ") for line in errors), r.stderr[-3000:]
    for text in expected:
        assert any(text in line for line in errors), (text, errors)
    assert not os.path.lexists(os.path.join(folder, out))
    assert not hidden(folder)


def test_an_error_of_process_0_during_calibration_stops_every_process(work):
    r = torchrun(cli_args("late.qnemo", algo="fp8", tp=2, pp=1) + ["--calib-data", "missing.txt"], str(work))
    assert_failed_cleanly(r, str(work), "late.qnemo", "missing.txt: no such calibration file")


def test_an_unwritable_output_stops_every_process(work):
    (work / "a-file").write_text("not a folder")
    r = torchrun(cli_args("a-file/out.qnemo", algo="none", tp=2, pp=1, compress=True), str(work))
    assert_failed_cleanly(r, str(work), "a-file/out.qnemo", "a-file")
    assert (work / "a-file").read_text() == "not a folder"


@pytest.mark.parametrize("compress", [False, True], ids=["folder", "tar"])
def test_a_failure_of_process_1_while_writing_leaves_nothing(work, compress):
    script = work / "fail_in_process_1.py"
    script.write_text(FAIL_IN_PROCESS_1)
    r = torchrun(cli_args("broken.qnemo", algo="int8_wo", tp=2, pp=2, compress=compress), str(work),
                 script=str(script))
    assert_failed_cleanly(r, str(work), "broken.qnemo", "No space left on device")
