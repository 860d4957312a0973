"""Several processes (torchrun, gloo) split a conversion by output part; the result is
byte-identical to a one-process run."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys

import pytest

from nemo_convert.examples import make_tiny_llama

pytestmark = pytest.mark.slow  # torchrun processes


def run(args: list[str], cwd: str, procs: int = 1) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if procs == 1:
        cmd = [sys.executable, "-m", "nemo_convert", *args, "-q"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
               "--standalone", "-m", "nemo_convert", *args, "-q"]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def same_tree(a: str, b: str) -> None:
    cmp = filecmp.dircmp(a, b)
    assert not cmp.left_only and not cmp.right_only and not cmp.diff_files, (cmp.left_only, cmp.right_only,
                                                                               cmp.diff_files)
    for f in cmp.common_files:
        assert filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), f


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp")
    make_tiny_llama(str(d / "hf"), num_hidden_layers=4)
    run(["import", "hf", "-o", "one.nemo"], str(d))
    return d


def test_two_process_import_is_byte_identical(work):
    run(["import", "hf", "-o", "two.nemo"], str(work), procs=2)
    assert filecmp.cmp(work / "one.nemo", work / "two.nemo", shallow=False)
    assert not [p for p in os.listdir(work) if p.startswith(".")]  # no staging or parts left


def test_two_process_export_and_reshard_are_byte_identical(work):
    run(["export", "one.nemo", "-o", "back1", "--max-shard-size", "100KB"], str(work))
    run(["export", "one.nemo", "-o", "back2", "--max-shard-size", "100KB"], str(work), procs=2)
    assert len([f for f in os.listdir(work / "back1") if f.endswith(".safetensors")]) > 2
    same_tree(str(work / "back1"), str(work / "back2"))
    run(["reshard", "one.nemo", "-o", "r1.nemo", "--tp", "2", "--pp", "2", "--layout", "legacy"], str(work))
    run(["reshard", "one.nemo", "-o", "r2.nemo", "--tp", "2", "--pp", "2", "--layout", "legacy"], str(work),
        procs=2)
    assert filecmp.cmp(work / "r1.nemo", work / "r2.nemo", shallow=False)


def test_two_process_moe_import_and_export_are_byte_identical(tmp_path):
    """A mixed dense/MoE stack (per-layer dist keys, experts ``[E, …]``) split over two
    processes: the same bytes as one process, the same HF folder back."""
    from test_family_matrix import make_model

    make_model(str(tmp_path / "hf"), "qwen3_moe", num_hidden_layers=4, mlp_only_layers=[1])
    run(["import", "hf", "-o", "one.nemo"], str(tmp_path))
    run(["import", "hf", "-o", "two.nemo"], str(tmp_path), procs=2)
    assert filecmp.cmp(tmp_path / "one.nemo", tmp_path / "two.nemo", shallow=False)
    run(["export", "one.nemo", "-o", "back1", "--max-shard-size", "100KB"], str(tmp_path))
    run(["export", "two.nemo", "-o", "back2", "--max-shard-size", "100KB"], str(tmp_path), procs=2)
    same_tree(str(tmp_path / "back1"), str(tmp_path / "back2"))


def test_a_failure_is_reported_once_by_process_0(work):
    """Issue 20, item 4: every process used to print the error, then torchrun its report.
    Now process 0 alone prints the line; each process leaves it in torchrun's error file,
    so torchrun's report shows it (not a link to its docs) and names process 0, exit code 2,
    as the root cause. torchrun itself still prints its ChildFailedError traceback and exits
    1 whatever code its processes chose (docs/cli.md says so)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           "-m", "nemo_convert", "import", "hf", "-o", "one.nemo", "--json"]
    r = subprocess.run(cmd, cwd=str(work), env=env, capture_output=True, text=True, timeout=300)
    line = "nemo-convert: error: one.nemo exists; pass --overwrite to replace it"
    assert r.returncode == 1  # torchrun's, for any failure
    ours = [x for x in r.stderr.splitlines() if x.startswith("nemo-convert:")]
    assert ours == [line], r.stderr
    assert r.stdout.splitlines() == ['{"error": "one.nemo exists; pass --overwrite to replace it", '
                                     '"kind": "OutputExistsError"}']
    report = r.stderr[r.stderr.index("Root Cause"):]
    assert "rank      : 0 (local_rank: 0)" in report and "exitcode  : 2 " in report, report
    assert f"traceback : {line}" in report
    assert "To enable traceback see" not in r.stderr
