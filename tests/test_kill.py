"""Killing a conversion never leaves a partial output.

Real ``nemo-convert import`` and ``export`` runs of a ~80 MB Llama (random bf16 written
with safetensors directly) are stopped at many moments:

* ``SIGKILL`` — after fixed delays (0.05–1 s; a fresh ``python -m nemo_convert``), and at
  write events (the staging entry appears; it holds 25 %, 75 %, 100 % of the final bytes;
  the target appears). Afterwards the target is absent or complete (a ``.nemo`` opens and
  its tensors equal the reference conversion and the source; an HF folder loads with
  safetensors and transformers and equals the source), never partial. Only hidden staging
  entries may remain, and ``cleanup_stale_staging(folder, max_age_s=0)`` removes them.
* ``SIGTERM`` / ``SIGINT`` mid-write — exit code 130 within 5 s, one line on stderr,
  neither target nor staging left.
* "disk full" (``RLIMIT_FSIZE`` smaller than the output) — exit code 2, one line on
  stderr, neither target nor staging left.

Event-driven runs are forked from a *zygote*: a Python process that has imported torch
and nemo-convert once and forks a child per run, which executes ``python -m
nemo_convert`` (``runpy``) exactly as the command line does. This saves the seconds of
interpreter and torch start-up per run that would otherwise blow the time budget; the
fixed-delay kills and one disk-full run use a genuinely fresh interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nemo_convert import api
from nemo_convert.formats.io.staging import cleanup_stale_staging

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals, fork and /proc: Linux only"),
              pytest.mark.slow]  # child processes killed at chosen moments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGING = re.compile(r"^\.(?P<base>.+)\.nemo-convert-(partial|old)-(?P<pid>\d+)-[0-9a-f]+$")
INTERRUPTED = "nemo-convert: interrupted; no output was written"
DIMS = {"hidden": 640, "inter": 1792, "layers": 4, "heads": 8, "kv": 4, "vocab": 16000}  # ~39 M params, ~78 MB of bf16
SHARD = "20MB"  # export writes several shards, so a kill can land between them


# ------------------------------------------------------------------------------- model
def make_llama(folder: str, *, hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int) -> str:
    """A Llama HF folder of random bf16 weights, written with safetensors directly (far
    faster than building the transformers model)."""
    os.makedirs(folder)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
           "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv * hd, hidden),
            p + "self_attn.v_proj.weight": (kv * hd, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,)})
    g = torch.Generator().manual_seed(0)
    tensors = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return folder


def sha256_tree(path: str) -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
            out[os.path.relpath(full, path)] = h.hexdigest()
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a tensor, so NaNs compare equal to themselves."""
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.uint8)


# Tensors a Llama import copies 1:1 (the others are fused: q/k/v, gate/up).
ONE_TO_ONE = {"embedding.word_embeddings.weight": "model.embed_tokens.weight",
              "output_layer.weight": "lm_head.weight", "decoder.final_layernorm.weight": "model.norm.weight",
              "decoder.layers.0.mlp.linear_fc2.weight": "model.layers.0.mlp.down_proj.weight",
              "decoder.layers.3.self_attention.linear_proj.weight": "model.layers.3.self_attn.o_proj.weight"}


class Model:
    def __init__(self, base: str) -> None:
        self.hf = make_llama(os.path.join(base, "hf"), **DIMS)
        self.nemo = os.path.join(base, "reference.nemo")
        api.import_hf(self.hf, self.nemo)
        self.nemo_size = os.path.getsize(self.nemo)
        self.hf_size = os.path.getsize(os.path.join(self.hf, "model.safetensors"))
        with safe_open(os.path.join(self.hf, "model.safetensors"), "pt") as f:
            self.source = {k: f.get_tensor(k) for k in f.keys()}
        with api.open_checkpoint(self.nemo) as ck:
            self.reference = {k: ck.source.load(k).clone() for k in ck.source.keys()}
        for nemo_name, hf_name in ONE_TO_ONE.items():
            assert torch.equal(bits(self.reference[nemo_name]), bits(self.source[hf_name]))
        self.hf_digest = sha256_tree(self.hf)
        self.nemo_digest = sha256_tree(os.path.dirname(self.nemo))["reference.nemo"]

    def check_complete_nemo(self, path: str) -> None:
        with api.open_checkpoint(path) as ck:
            assert sorted(ck.source.keys()) == sorted(self.reference)
            for k, ref in self.reference.items():
                assert torch.equal(bits(ck.source.load(k)), bits(ref)), k
        for nemo_name, hf_name in ONE_TO_ONE.items():
            assert torch.equal(bits(self.reference[nemo_name]), bits(self.source[hf_name]))

    def check_complete_hf(self, folder: str) -> None:
        from transformers import AutoConfig

        assert AutoConfig.from_pretrained(folder).hidden_size == DIMS["hidden"]
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        assert sorted(weight_map) == sorted(self.source)
        for shard in sorted(set(weight_map.values())):
            with safe_open(os.path.join(folder, shard), "pt") as f:
                for k in f.keys():
                    assert torch.equal(bits(f.get_tensor(k)), bits(self.source[k])), k


# ------------------------------------------------------------------------------- zygote
_ZYGOTE = r"""
import json, os, resource, runpy, sys, time
import torch, torch.distributed.checkpoint  # noqa: F401 - the slow imports, paid once
import nemo_convert.api, nemo_convert.cli.main  # noqa: F401
from nemo_convert.plugins.manager import get_registry
get_registry()
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "run":
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd, suffix in ((1, ".out"), (2, ".err")):
                    os.dup2(os.open(req["log"] + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                if req.get("fsize"):
                    resource.setrlimit(resource.RLIMIT_FSIZE, (req["fsize"], req["fsize"]))
                sys.argv = ["nemo-convert", *req["argv"]]
                try:
                    runpy.run_module("nemo_convert", run_name="__main__", alter_sys=True)
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
    elif req["op"] == "wait":
        deadline, code = time.monotonic() + req["timeout"], None
        while True:
            done, status = os.waitpid(req["pid"], os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
        print(json.dumps({"code": code}), flush=True)
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)

    def ready(self) -> None:
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def _ask(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def start(self, argv: list[str], log: str, fsize: int | None = None) -> int:
        return int(self._ask(op="run", argv=argv, log=log, fsize=fsize)["pid"])

    def wait(self, pid: int, timeout: float) -> int | None:
        return self._ask(op="wait", pid=pid, timeout=timeout)["code"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def zygote() -> Any:
    z = Zygote()  # starts importing torch while the model is being built
    yield z
    z.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Any:
    m = Model(str(tmp_path_factory.mktemp("kill")))
    zygote.ready()
    yield m
    # no run changed its input
    assert sha256_tree(m.hf) == m.hf_digest
    assert sha256_tree(os.path.dirname(m.nemo))["reference.nemo"] == m.nemo_digest


# ------------------------------------------------------------------------------- helpers
def argv_for(cmd: str, model: Model, target: str) -> list[str]:
    if cmd == "import":
        return ["import", model.hf, "-o", target, "-q"]
    return ["export", model.nemo, "-o", target, "-q", "--max-shard-size", SHARD]


def final_size(cmd: str, model: Model) -> int:
    return model.nemo_size if cmd == "import" else model.hf_size


def staging_bytes(folder: str, target: str) -> int | None:
    """Bytes in the staging entry of ``target`` (a file or a folder), None if there is none."""
    prefix = f".{os.path.basename(target)}.nemo-convert-partial-"
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(prefix)]
    except FileNotFoundError:
        return None
    if not entries:
        return None
    total = 0
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                for sub, _, files in os.walk(e.path):
                    total += sum(os.path.getsize(os.path.join(sub, n)) for n in files
                                 if os.path.exists(os.path.join(sub, n)))
            else:
                total += e.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
    return total


def exited(pid: int) -> bool:
    """Whether ``pid`` has finished (a zombie awaiting its parent counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_until(pred: Callable[[], bool], pid: int, timeout: float = 120.0) -> bool:
    """Poll ``pred`` every ~1 ms until true (True) or the process ends first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if exited(pid):
            return pred()
        time.sleep(0.001)
    raise AssertionError(f"nothing happened within {timeout} s")


def leftovers(folder: str, target: str) -> list[str]:
    """The entries of ``folder`` other than ``target``: all must be its hidden staging."""
    base = os.path.basename(target)
    others = sorted(n for n in os.listdir(folder) if n != base)
    for n in others:
        m = STAGING.match(n)
        assert m and m["base"] == base, f"unexpected entry {n!r} beside {base}"
    return others


def check_after_kill(model: Model, cmd: str, folder: str, target: str) -> tuple[bool, list[str]]:
    """The target is absent or complete; only staging remains; cleanup removes it."""
    left = leftovers(folder, target)
    complete = os.path.lexists(target)
    if complete:
        (model.check_complete_nemo if cmd == "import" else model.check_complete_hf)(target)
    removed = cleanup_stale_staging(folder, max_age_s=0)
    assert sorted(os.path.basename(p) for p in removed) == left
    assert sorted(os.listdir(folder)) == ([os.path.basename(target)] if complete else [])
    return complete, left


def stderr_lines(log: str) -> list[str]:
    with open(log + ".err", errors="replace") as f:
        return [line for line in f.read().splitlines() if line.strip()]


# ------------------------------------------------------------------------------- SIGKILL
@pytest.mark.parametrize("cmd", ["import", "export"])
def test_sigkill_after_fixed_delays(tmp_path, model, cmd):
    """A fresh ``python -m nemo_convert`` killed after 0.05, 0.2, 0.5 and 1 s."""
    for i, delay in enumerate((0.05, 0.2, 0.5, 1.0)):
        folder = tmp_path / f"d{i}"
        folder.mkdir()
        target = str(folder / ("m.nemo" if cmd == "import" else "back"))
        child = subprocess.Popen([sys.executable, "-m", "nemo_convert", *argv_for(cmd, model, target)], cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        check_after_kill(model, cmd, str(folder), target)


EVENTS = ["staging-appears", "staging-25%", "staging-75%", "staging-100%", "target-appears"]


@pytest.mark.parametrize("cmd", ["import", "export"])
def test_sigkill_at_write_events(tmp_path, model, zygote, cmd):
    """Killed as the staging entry appears, when it holds 25/75/100 % of the output, and
    as the target appears: never a partial target; only staging left, and cleaned up."""
    size = final_size(cmd, model)
    outcomes = {}
    for event in EVENTS:
        folder = str(tmp_path / event)
        os.mkdir(folder)
        target = os.path.join(folder, "m.nemo" if cmd == "import" else "back")
        pid = zygote.start(argv_for(cmd, model, target), str(tmp_path / f"{event}.log"))
        try:
            if event == "target-appears":
                hit = wait_until(lambda t=target: os.path.lexists(t), pid)
            else:
                frac = {"staging-appears": 0.0, "staging-25%": 0.25, "staging-75%": 0.75, "staging-100%": 1.0}[event]
                hit = wait_until(lambda d=folder, t=target, want=frac * size:
                                 (staging_bytes(d, t) or -1) >= want or os.path.lexists(t), pid)
        finally:
            os.kill(pid, signal.SIGKILL)
            code = zygote.wait(pid, timeout=30)
        assert code is not None, "the killed run did not end"
        complete, left = check_after_kill(model, cmd, folder, target)
        outcomes[event] = (hit, code, complete, left)
    if os.environ.get("NEMO_CONVERT_KILL_DEBUG"):
        print(cmd, outcomes)
    # the kills did land mid-write: at least one left a staging entry and no target
    assert any(left and not complete for _, _, complete, left in outcomes.values()), outcomes




class Run:
    """How a run ended: exit code, seconds from the signal to the exit, stderr lines,
    what was left in the output folder."""

    def __init__(self, code: int | None, took: float, err: list[str], left: list[str]) -> None:
        self.code, self.took, self.err, self.left = code, took, err, left

    def __repr__(self) -> str:
        return f"Run(code={self.code}, took={self.took:.2f}, err={self.err[:3]}, left={self.left})"


_RUNS: dict[tuple[str, str], Run] = {}


def interrupted_run(tmp_path_factory: pytest.TempPathFactory, model: Model, zygote: Zygote, cmd: str,
                    sig: signal.Signals) -> Run:
    """``cmd`` sent ``sig`` once it has written a quarter of its output (once per pair)."""
    key = (cmd, sig.name)
    if key not in _RUNS:
        base = str(tmp_path_factory.mktemp(f"{cmd}-{sig.name}"))
        folder = os.path.join(base, "out")
        os.mkdir(folder)
        target = os.path.join(folder, "m.nemo" if cmd == "import" else "back")
        log = os.path.join(base, "run")
        pid = zygote.start(argv_for(cmd, model, target), log)
        try:
            landed = wait_until(lambda: (staging_bytes(folder, target) or 0) >= 0.25 * final_size(cmd, model), pid)
        finally:
            os.kill(pid, sig)
            sent = time.monotonic()
            code = zygote.wait(pid, timeout=5.0)
            took = time.monotonic() - sent
            if code is None:
                os.kill(pid, signal.SIGKILL)
                zygote.wait(pid, timeout=30)
        assert landed, "the run ended before a quarter was written: make the model bigger"
        _RUNS[key] = Run(code, took, stderr_lines(log), sorted(os.listdir(folder)))
    return _RUNS[key]


SIGNALS = pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])


@SIGNALS
@pytest.mark.parametrize("cmd", ["import", "export"])
def test_terminate_mid_write_leaves_nothing(tmp_path_factory, model, zygote, cmd, sig):
    run = interrupted_run(tmp_path_factory, model, zygote, cmd, sig)
    assert run.code is not None and run.took < 5.0, run  # prompt
    assert run.code != 0, run
    assert run.left == [], run  # neither target nor staging


@SIGNALS
@pytest.mark.parametrize("cmd", ["import", "export"])
def test_terminate_mid_write_reports_interrupted(tmp_path_factory, model, zygote, cmd, sig):
    run = interrupted_run(tmp_path_factory, model, zygote, cmd, sig)
    assert run.code == 130, run
    assert run.err == [INTERRUPTED], run


# ------------------------------------------------------------------------------- disk full
FSIZE = 16 * 1024 * 1024  # smaller than the 78 MB output: the write fails with EFBIG


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))


def disk_full_run(tmp_path_factory: pytest.TempPathFactory, model: Model, zygote: Zygote, cmd: str,
                  fresh: bool) -> Run:
    """``cmd`` under RLIMIT_FSIZE (once per command and way of starting)."""
    key = (cmd, "fresh" if fresh else "zygote")
    if key not in _RUNS:
        base = str(tmp_path_factory.mktemp(f"full-{cmd}"))
        folder = os.path.join(base, "out")
        os.mkdir(folder)
        target = os.path.join(folder, "m.nemo" if cmd == "import" else "back")
        if fresh:  # a fresh interpreter, the limit set by preexec_fn
            res = subprocess.run([sys.executable, "-m", "nemo_convert", *argv_for(cmd, model, target)], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size,
                                 check=False)
            code, err = res.returncode, [x for x in res.stderr.splitlines() if x.strip()]
        else:
            log = os.path.join(base, "run")
            code = zygote.wait(zygote.start(argv_for(cmd, model, target), log, fsize=FSIZE), timeout=120)
            err = stderr_lines(log)
        _RUNS[key] = Run(code, 0.0, err, sorted(os.listdir(folder)))
    return _RUNS[key]


DISK_FULL = pytest.mark.parametrize("cmd,fresh", [("import", True), ("import", False), ("export", False)],
                                    ids=["import-fresh-interpreter", "import", "export"])


@DISK_FULL
def test_disk_full_leaves_nothing(tmp_path_factory, model, zygote, cmd, fresh):
    run = disk_full_run(tmp_path_factory, model, zygote, cmd, fresh)
    assert run.code not in (None, 0), run
    assert run.left == [], run  # neither target nor staging


@pytest.mark.parametrize("cmd,fresh", [("import", True),
                                       ("import", False), ("export", False)],
                         ids=["import-fresh-interpreter", "import", "export"])
def test_disk_full_is_a_one_line_input_error(tmp_path_factory, model, zygote, cmd, fresh):
    run = disk_full_run(tmp_path_factory, model, zygote, cmd, fresh)
    assert run.code == 2, run
    assert len(run.err) == 1 and run.err[0].startswith("nemo-convert: error: "), run
    assert run.err[0].endswith("File too large"), run
