#!/usr/bin/env python
"""Import benchmark: HF Llama (bf16 safetensors) → ``.nemo``, against a streaming copy
(our physical limit) and a naive ``from_pretrained`` + ``torch.save`` + ``tarfile`` peer.

Every case runs in a fresh subprocess whose memory the parent samples from
``/proc/<pid>/smaps_rollup`` (see ``bench/memory.py`` for the definitions), so peaks are
per case. Each case is run once to warm the page cache (discarded), then ``--repeat``
times; the median time and the largest peaks of the measured runs are reported.

    python bench/bench_import.py                       # both sizes, every case
    python bench/bench_import.py --sizes 1.5 --cases copy,import --repeat 3

Results: a Markdown table on stdout, ``bench/out/results.md`` and ``bench/out/results.json``.
See ``bench/README.md`` and ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import mmap
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from memory import ChildRun, run_measured

ALL_CASES = ("copy", "import", "import-legacy", "naive")
CASE_LABELS = {
    "baseline": "interpreter baseline (torch + nemo_convert.api)",
    "baseline-hf": "interpreter baseline (torch + transformers Llama)",
    "copy": "(a) streaming copy",
    "import": "(b) import_hf, dist layout",
    "import-legacy": "(b) import_hf, legacy layout",
    "naive": "(c) naive peer",
}

# Llama shape of the generated checkpoints (a TinyLlama-1.1B-like model with GQA).
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 2048, 5632, 16, 4, 32000
HEAD_DIM = HIDDEN // HEADS
BF16 = 2
SHARD_BYTES = 512 * 1024**2  # source shards (a sharded folder with an index, like the Hub's)
MiB = 1024**2


# ============================================================================ model spec
def hf_tensors(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """The HF tensor names and shapes, in ``save_pretrained`` order."""
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "mlp.gate_proj.weight", (FFN, HIDDEN)),
            (p + "mlp.up_proj.weight", (FFN, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, FFN)),
        ]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def model_bytes(layers: int) -> int:
    return sum(_numel(s) for _, s in hf_tensors(layers)) * BF16


def layers_for(size_gb: float) -> int:
    fixed, per_layer = model_bytes(0), model_bytes(1) - model_bytes(0)
    return max(1, round((size_gb * 1e9 - fixed) / per_layer))


def largest_output_tensor_bytes() -> tuple[str, int]:
    """The largest single tensor of the ``.nemo`` (logical NeMo names; vocab 32000 needs no padding)."""
    cands = {
        "embedding.word_embeddings.weight / output_layer.weight": VOCAB * HIDDEN,
        "mlp.linear_fc1.weight": 2 * FFN * HIDDEN,
        "mlp.linear_fc2.weight": HIDDEN * FFN,
        "self_attention.linear_qkv.weight": (HEADS + 2 * KV_HEADS) * HEAD_DIM * HIDDEN,
    }
    name = max(cands, key=cands.__getitem__)
    return name, cands[name] * BF16


def hf_config(layers: int) -> dict[str, Any]:
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, hidden_act="silu", bos_token_id=1, eos_token_id=2)
    d = cfg.to_dict()
    d["architectures"] = ["LlamaForCausalLM"]
    d["dtype"] = d["torch_dtype"] = "bfloat16"
    return d


# ============================================================================ generation
def generate(folder: str, layers: int, *, seed: int = 0) -> dict[str, Any]:
    """Write a random bf16 Llama checkpoint shard by shard (≤ 512 MiB held at a time)."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    tensors = hf_tensors(layers)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        nb = _numel(shape) * BF16
        if shards[-1] and size + nb > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nb
    g = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    n = len(shards)
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        sd = {}
        for name, shape in shard:
            t = torch.empty(shape, dtype=torch.bfloat16)
            if name.endswith("norm.weight"):
                t.uniform_(0.5, 1.5, generator=g)
            else:
                t.normal_(0.0, 0.02, generator=g)
            sd[name] = t
            weight_map[name] = fname
        save_file(sd, os.path.join(folder, fname), metadata={"format": "pt"})
        del sd
    total = model_bytes(layers)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(layers), f, indent=2)
    marker = {"layers": layers, "bytes": total, "seed": seed, "shape": [HIDDEN, FFN, HEADS, KV_HEADS, VOCAB]}
    with open(os.path.join(folder, ".bench-model.json"), "w", encoding="utf-8") as f:
        json.dump(marker, f)
    return marker


def ensure_model(folder: str, layers: int) -> tuple[dict[str, Any], float]:
    """Reuse a checkpoint generated earlier with the same spec (``--keep``), else generate it."""
    want = {"layers": layers, "bytes": model_bytes(layers), "seed": 0, "shape": [HIDDEN, FFN, HEADS, KV_HEADS, VOCAB]}
    try:
        with open(os.path.join(folder, ".bench-model.json"), encoding="utf-8") as f:
            if json.load(f) == want:
                return want, 0.0
    except (OSError, ValueError):
        pass
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    # In a child process: the parent never imports torch, so its RSS stays small (a child's
    # ru_maxrss starts from its parent's RSS at fork, which Linux keeps across exec).
    subprocess.run([sys.executable, os.path.abspath(__file__), "--_generate", folder, "--_layers", str(layers)],
                   check=True, env=child_env())
    with open(os.path.join(folder, ".bench-model.json"), encoding="utf-8") as f:
        got = json.load(f)
    return got, time.perf_counter() - t0


def child_env() -> dict[str, str]:
    """The environment of every child: offline Hugging Face libraries (the source is local)."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1"})
    return env


# ============================================================================ the cases (child side)
def _safetensors_files(src: str) -> list[str]:
    with open(os.path.join(src, "model.safetensors.index.json"), encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(src, f) for f in files]


def case_copy(src: str, out: str) -> dict[str, Any]:
    """(a) Every tensor's bytes, from memory-mapped source shards into one new safetensors
    file: plain file I/O, no tensor is ever built. fsync at the end."""
    shards = []  # (path, data start, [(begin, end, name, dtype, shape)] in file order)
    for path in _safetensors_files(src):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        items = sorted((e["data_offsets"][0], e["data_offsets"][1], name, e["dtype"], e["shape"])
                       for name, e in header.items() if name != "__metadata__")
        shards.append((path, 8 + n, items))
    head: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for _, _, items in shards:
        for b, e, name, dt, shape in items:
            head[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + e - b]}
            pos += e - b
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    total = 0
    with open(out, "wb", buffering=0) as o:
        o.write(struct.pack("<Q", len(raw)) + raw)
        for path, base, items in shards:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                mv = memoryview(mm)
                for b, e, *_ in items:
                    view = mv[base + b: base + e]
                    done = 0
                    while done < len(view):  # a raw write may be short
                        done += o.write(view[done:])
                    total += len(view)
                    view.release()
                mv.release()
        os.fsync(o.fileno())
    return {"bytes": total}


def case_import(src: str, out: str, layout: str) -> dict[str, Any]:
    from nemo_convert import api

    rep = api.import_hf(src, out, layout=layout)
    return {"bytes": rep.bytes, "tensors": rep.tensors, "engine_seconds": rep.seconds}


def naive_remap(sd: dict[str, Any], cfg: Any, layers: Any = None) -> dict[str, Any]:
    """HF Llama state dict → NeMo (mcore) names, as NeMo's ``convert_llama_hf_to_nemo.py``
    does it (QKV fused per query group by repeated ``torch.cat``, fc1 = ``[gate; up]``)."""
    import torch

    heads, groups, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    head_size = getattr(cfg, "head_dim", None) or hidden // heads
    per = heads // groups
    out: dict[str, Any] = {"model.embedding.word_embeddings.weight": sd["model.embed_tokens.weight"]}
    for l in range(cfg.num_hidden_layers) if layers is None else layers:
        p, d = f"model.layers.{l}.", f"model.decoder.layers.{l}."
        q = sd[p + "self_attn.q_proj.weight"].view(heads, head_size, hidden)
        k = sd[p + "self_attn.k_proj.weight"].view(groups, head_size, hidden)
        v = sd[p + "self_attn.v_proj.weight"].view(groups, head_size, hidden)
        qkv = torch.empty((0, head_size, hidden), dtype=q.dtype)
        for i in range(groups):
            qkv = torch.cat((qkv, q[i * per:(i + 1) * per]))
            qkv = torch.cat((qkv, k[i:i + 1]))
            qkv = torch.cat((qkv, v[i:i + 1]))
        out[d + "self_attention.linear_qkv.weight"] = qkv.reshape(head_size * (heads + 2 * groups), hidden)
        out[d + "self_attention.linear_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
        out[d + "mlp.linear_fc1.weight"] = torch.cat((sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]))
        out[d + "mlp.linear_fc2.weight"] = sd[p + "mlp.down_proj.weight"]
        out[d + "self_attention.linear_qkv.layer_norm_weight"] = sd[p + "input_layernorm.weight"]
        out[d + "mlp.linear_fc1.layer_norm_weight"] = sd[p + "post_attention_layernorm.weight"]
    out["model.decoder.final_layernorm.weight"] = sd["model.norm.weight"]
    out["model.output_layer.weight"] = sd["lm_head.weight"]
    return out


def case_naive(src: str, out: str) -> dict[str, Any]:
    """(c) What NeMo's HF→NeMo script does, minus NeMo: load the whole HF model, remap its
    state dict, ``torch.save`` it into a temporary folder, tar the folder (``tarfile``)."""
    import tarfile
    import tempfile

    import torch
    import yaml
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    cfg = model.config
    nemo_sd = naive_remap(model.state_dict(), cfg)  # the HF model stays alive, as in NeMo's script
    nemo_cfg = {"mcore_gpt": True, "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
                "ffn_hidden_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
                "num_query_groups": cfg.num_key_value_heads, "kv_channels": HEAD_DIM,
                "padded_vocab_size": cfg.vocab_size, "precision": "bf16", "bias": False,
                "activation": "fast-swiglu", "normalization": "rmsnorm", "position_embedding_type": "rope",
                "share_embeddings_and_output_weights": False,
                "target": "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"}
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        torch.save(nemo_sd, os.path.join(tmp, "model_weights.ckpt"))
        with open(os.path.join(tmp, "model_config.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(nemo_cfg, f)
        with tarfile.open(out, "w:") as tar:
            tar.add(tmp, arcname=".")
    fd = os.open(out, os.O_RDONLY)  # fsync like the other cases, for a fair comparison
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": sum(t.numel() * t.element_size() for t in nemo_sd.values()), "tensors": len(nemo_sd)}


def child_main(case: str, src: str, out: str, result: str) -> int:
    t_start = time.perf_counter()
    c0 = time.process_time()
    info: dict[str, Any] = {}
    if case == "baseline":
        import torch

        import nemo_convert.api
    elif case == "baseline-hf":
        import torch
        import transformers
        from transformers.models.llama import modeling_llama  # noqa: F401
    elif case == "copy":
        t0, c0 = time.perf_counter(), time.process_time()
        info = case_copy(src, out)
    elif case in ("import", "import-legacy"):
        import torch

        import nemo_convert.api  # noqa: F401

        t0, c0 = time.perf_counter(), time.process_time()
        info = case_import(src, out, "legacy" if case == "import-legacy" else "dist")
    elif case == "naive":
        import torch  # noqa: F401
        import transformers  # noqa: F401

        t0, c0 = time.perf_counter(), time.process_time()
        info = case_naive(src, out)
    else:
        raise SystemExit(f"unknown case {case!r}")
    t_end, c_end = time.perf_counter(), time.process_time()
    if case.startswith("baseline"):
        t0, c0 = t_end, c_end
    info.update({"setup_seconds": t0 - t_start, "op_seconds": t_end - t0, "op_cpu_seconds": c_end - c0})
    with open(result, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return 0


# ============================================================================ verification (parent side)
def verify(src: str, out: str, layers: int) -> str:
    """Bit-exact spot checks of an output ``.nemo`` against the source: ``"ok"`` or the problem."""
    import torch

    from nemo_convert import api

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))

    last = layers - 1
    try:
        with api.open_checkpoint(src) as hf, api.open_checkpoint(out) as nemo:
            s, n = hf.source, nemo.source
            keys = set(n.keys())
            pre = "model." if "model.embedding.word_embeddings.weight" in keys else ""
            ref = naive_remap({k: s.load(k) for k in (
                "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                *(f"model.layers.{last}.{r}" for r in (
                    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                    "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")))},
                _Cfg(), layers=[last])
            for name, want in ref.items():
                got_name = pre + name[len("model."):]
                if got_name not in keys:
                    return f"missing {got_name}"
                if not same(n.load(got_name), want):
                    return f"{got_name} differs"
            expected = 3 + 6 * layers
            real = [k for k in keys if not k.endswith("_extra_state")]
            if len(real) != expected:
                return f"{len(real)} tensors, expected {expected}"
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported in the results, not fatal
        return f"error: {exc.__class__.__name__}: {exc}"


def verify_in_child(src: str, out: str, layers: int) -> str:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_verify", out, "--_src", src,
                           "--_layers", str(layers)], capture_output=True, text=True, env=child_env(), check=False)
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else f"error: {proc.stderr.strip()[-300:]}"


class _Cfg:
    """Just enough of a ``LlamaConfig`` for :func:`naive_remap`."""

    num_attention_heads, num_key_value_heads, hidden_size, head_dim = HEADS, KV_HEADS, HIDDEN, HEAD_DIM


# ============================================================================ running (parent side)
def _rm(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def run_case(case: str, src: str, out: str, work: str, interval: float) -> ChildRun:
    result = os.path.join(work, f".result-{case}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", case, "--_src", src, "--_out", out,
           "--_result", result]
    run = run_measured(cmd, result_path=result, interval=interval, timeout=900, env=child_env())
    if run.returncode != 0:
        raise RuntimeError(f"case {case} failed (exit {run.returncode}):\n{run.stderr_tail}")
    return run


def _summarise(case: str, runs: list[ChildRun], warmup: ChildRun | None, loads: list[float]) -> dict[str, Any]:
    op = [r.result.get("op_seconds", 0.0) for r in runs]
    return {
        "case": case,
        "label": CASE_LABELS[case],
        "repeats": len(runs),
        "op_seconds": statistics.median(op),
        "op_seconds_all": op,
        "op_seconds_best": min(op),
        "process_seconds": statistics.median(r.wall_seconds for r in runs),
        "setup_seconds": statistics.median(r.result.get("setup_seconds", 0.0) for r in runs),
        "cpu_seconds": statistics.median(r.cpu_seconds for r in runs),
        "op_cpu_seconds": statistics.median(r.result.get("op_cpu_seconds", 0.0) for r in runs),
        "peak_private": max(r.memory.peak_private for r in runs),
        "peak_rss": max(r.memory.peak_rss for r in runs),
        "ru_maxrss": max(r.memory.ru_maxrss for r in runs),
        "samples": min(r.memory.samples for r in runs),
        "rollup_samples": sum(r.memory.rollup_samples for r in runs),
        "max_rollup_delta": max(r.memory.max_rollup_delta for r in runs),
        "warmup_op_seconds": warmup.result.get("op_seconds") if warmup else None,
        "warmup_peak_private": warmup.memory.peak_private if warmup else None,
        "child": runs[-1].result,
        "timeline": runs[-1].memory.timeline,  # (t, private, rss) every 10th sample
        "loadavg_1m": loads,
    }


def measure(case: str, src: str | None, out: str | None, work: str, args: argparse.Namespace,
            verify_layers: int | None = None) -> dict[str, Any]:
    warm = None
    if not args.no_warmup:
        if out:
            _rm(out)
        warm = run_case(case, src or "-", out or "-", work, args.interval)
    runs, loads = [], []
    for _ in range(args.repeat):
        if out:
            _rm(out)
        loads.append(os.getloadavg()[0])
        runs.append(run_case(case, src or "-", out or "-", work, args.interval))
    row = _summarise(case, runs, warm, loads)
    if out is None:
        return row
    if os.path.exists(out):
        row["output_bytes"] = _du(out)
        if verify_layers is not None and case != "copy" and not args.no_verify:
            row["verify"] = verify_in_child(src, out, verify_layers)
    if not args.keep:
        _rm(out)
    return row


def _du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def machine_info(work: str) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    du = shutil.disk_usage(work)
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu, "cores": os.cpu_count(), "ram_bytes": mem, "disk_free_bytes": du.free,
        "disk_total_bytes": du.total, "kernel": platform.release(), "python": platform.python_version(),
        "torch": ver("torch"), "transformers": ver("transformers"), "safetensors": ver("safetensors"),
        "nemo_convert_commit": _git_rev(), "loadavg_at_start": os.getloadavg(),
    }


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", os.path.dirname(HERE), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", os.path.dirname(HERE), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


# ============================================================================ reporting
def _mib(n: float | None) -> str:
    return "–" if n is None else f"{n / MiB:,.0f}"


def ratios(size: dict[str, Any], baseline: dict[str, Any],
           baseline_hf: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """``{name: {"median": x, "best": y}}``: time ratios on the median and on the best
    run; memory ratios on the largest peak (the same number in both)."""
    rows = {r["case"]: r for r in size["rows"]}
    out: dict[str, dict[str, float]] = {}

    def t(num: str, den: str) -> dict[str, float]:
        return {"median": rows[num]["op_seconds"] / rows[den]["op_seconds"],
                "best": rows[num]["op_seconds_best"] / rows[den]["op_seconds_best"],
                "cpu": rows[num]["op_cpu_seconds"] / max(rows[den]["op_cpu_seconds"], 1e-9)}

    for c in ("import", "import-legacy"):
        if c in rows and "copy" in rows:
            out[f"{c}/copy time"] = t(c, "copy")
    for c in ("import", "import-legacy"):
        if c in rows and "naive" in rows:
            out[f"naive/{c} time"] = t("naive", c)
    for c in ("import", "import-legacy", "naive"):
        if c in rows:
            base = baseline_hf if c == "naive" and baseline_hf else baseline
            extra = (rows[c]["peak_private"] - base["peak_private"]) / size["largest_tensor_bytes"]
            out[f"{c} (private - baseline)/largest tensor"] = {"median": extra, "best": extra, "cpu": None}
    return out


TARGETS = {  # ratio key pattern -> (comparison, bound)
    "import/copy time": ("<=", 1.5), "import-legacy/copy time": ("<=", 1.5),
    "naive/import time": (">=", 4.0), "naive/import-legacy time": (">=", 4.0),
    "import (private - baseline)/largest tensor": ("<", 3.0),
    "import-legacy (private - baseline)/largest tensor": ("<", 3.0),
}


def _met(key: str, value: float) -> str:
    if key not in TARGETS:
        return ""
    op, bound = TARGETS[key]
    ok = value <= bound if op == "<=" else value >= bound if op == ">=" else value < bound
    return f"{op} {bound:g}: {'met' if ok else '**NOT met**'}"


def markdown(res: dict[str, Any]) -> str:
    m, st = res["machine"], res["settings"]
    lines = [
        "# nemo-convert import benchmark",
        "",
        f"- date: {m['date']}; commit {m['nemo_convert_commit']}",
        (f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / 1024**3:.1f} GiB RAM, "
         f"{m['disk_free_bytes'] / 1024**3:.0f} GiB disk free (workdir), kernel {m['kernel']}"),
        f"- python {m['python']}, torch {m['torch']}, transformers {m['transformers']}",
        f"- load average at start: {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
        (f"- runs: {st['cache']}; repeat {st['repeat']} (median time, max memory); "
         f"memory sampled every {st['interval'] * 1000:.0f} ms"),
        ("- private = resident anonymous memory (`Anonymous:` of /proc/PID/smaps_rollup = `RssAnon` of "
         "/proc/PID/status; excludes page cache and clean file-backed mmap pages); RSS = `VmRSS` (sampled); "
         "ru_maxrss = the kernel's high-water mark of RSS"),
        (f"- cross-check: largest |smaps_rollup Anonymous − status RssAnon| seen: "
         f"{res.get('max_rollup_delta', 0) / 1024:.0f} KiB"),
        ("- time = the operation inside the child (imports excluded; median of the measured runs); best = "
         "fastest run; GB/s = model bytes / time; op CPU = user + system CPU time of the operation; "
         "process = child start to exit (wall, and user + system CPU)"),
        ("- private − baseline: minus the torch + nemo_convert.api interpreter for (b), minus the "
         "torch + transformers interpreter for (c); the copy imports neither"),
        "",
        ("| model | case | time (s) | best (s) | GB/s | op CPU (s) | process (s) | process CPU (s) "
         "| peak private (MiB) | private − baseline (MiB) | peak RSS (MiB) | ru_maxrss (MiB) | output (MiB) | check |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for b in (res["baseline"], res.get("baseline-hf")):
        if b:
            lines.append(f"| – | {b['label']} | – | – | – | – | {b['process_seconds']:.2f} | {b['cpu_seconds']:.2f} "
                         f"| {_mib(b['peak_private'])} | – | {_mib(b['peak_rss'])} | {_mib(b['ru_maxrss'])} | – | |")
    for s in res["sizes"]:
        for r in s["rows"]:
            gbps = s["model_bytes"] / r["op_seconds"] / 1e9 if r["op_seconds"] else 0.0
            base = res.get("baseline-hf") if r["case"] == "naive" else res["baseline"]
            extra = "–" if r["case"] == "copy" or not base else _mib(r["peak_private"] - base["peak_private"])
            lines.append(
                f"| {s['model_bytes'] / 1e9:.2f} GB ({s['layers']} layers) | {r['label']} | {r['op_seconds']:.2f} "
                f"| {r['op_seconds_best']:.2f} | {gbps:.2f} | {r['op_cpu_seconds']:.2f} | {r['process_seconds']:.2f} "
                f"| {r['cpu_seconds']:.2f} | {_mib(r['peak_private'])} | {extra} | {_mib(r['peak_rss'])} "
                f"| {_mib(r['ru_maxrss'])} | {_mib(r.get('output_bytes'))} | {r.get('verify', '')} |")
    lines += [
        "",
        ("Ratios: time ratios on the median run, on the best run, and on the operation's CPU time "
         "(median); memory ratios on the largest peak."),
        "",
        "| model | largest output tensor (MiB) | ratio | median | best | CPU | target (on median) |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for s in res["sizes"]:
        for k, v in s["ratios"].items():
            cpu = "–" if v["cpu"] is None else f"{v['cpu']:.2f}"
            lines.append(f"| {s['model_bytes'] / 1e9:.2f} GB | {_mib(s['largest_tensor_bytes'])} | {k} "
                         f"| {v['median']:.2f} | {v['best']:.2f} | {cpu} | {_met(k, v['median'])} |")
    return "\n".join(lines) + "\n"


# ============================================================================ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.75,1.5", help="model sizes in GB (1e9 bytes), comma-separated")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out", "work"),
                    help="where checkpoints and outputs are written (needs ~2.5× the largest size free)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the generated checkpoints (reused by the next run) and the last outputs")
    ap.add_argument("--cases", default=",".join(ALL_CASES), help=f"comma-separated subset of {','.join(ALL_CASES)}")
    ap.add_argument("--repeat", type=int, default=1, help="measured runs per case (after one warm-up run)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up run (report the first run)")
    ap.add_argument("--no-verify", action="store_true", help="skip the bit-exact spot checks of the outputs")
    ap.add_argument("--interval", type=float, default=0.02, help="memory sampling interval in seconds")
    ap.add_argument("--results", default=os.path.join(HERE, "out"), help="folder for results.md / results.json")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_src", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    ap.add_argument("--_generate", help=argparse.SUPPRESS)
    ap.add_argument("--_verify", help=argparse.SUPPRESS)
    ap.add_argument("--_layers", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return child_main(args._child, args._src, args._out, args._result)
    if args._generate:
        generate(args._generate, args._layers)
        return 0
    if args._verify:
        print(verify(args._src, args._verify, args._layers))
        return 0

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in ALL_CASES]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}")
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.results, exist_ok=True)

    res: dict[str, Any] = {
        "machine": machine_info(work),
        "settings": {"sizes_gb": sizes, "cases": cases, "repeat": args.repeat, "interval": args.interval,
                     "cache": "warm (one discarded warm-up run per case)" if not args.no_warmup
                     else "first run (no warm-up; source possibly in page cache from generation)",
                     "model": {"hidden": HIDDEN, "ffn": FFN, "heads": HEADS, "kv_heads": KV_HEADS, "vocab": VOCAB,
                               "dtype": "bf16", "source_shard_bytes": SHARD_BYTES}},
        "definitions": {"private": "smaps_rollup Anonymous", "rss": "smaps_rollup Rss (sampled)",
                        "ru_maxrss": "wait4 rusage high-water mark"},
    }
    log = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    log("baselines")
    res["baseline"] = measure("baseline", None, None, work, args)
    if "naive" in cases:
        res["baseline-hf"] = measure("baseline-hf", None, None, work, args)

    res["sizes"] = []
    big_name, big = largest_output_tensor_bytes()
    for size in sizes:
        layers = layers_for(size)
        src = os.path.join(work, f"llama-{layers}L-bf16")
        log(f"model {size} GB: {layers} layers, {model_bytes(layers) / 1e9:.3f} GB → {src}")
        spec, gen_s = ensure_model(src, layers)
        if gen_s:
            log(f"  generated in {gen_s:.1f} s")
        entry: dict[str, Any] = {"size_gb": size, "layers": layers, "model_bytes": spec["bytes"], "source": src,
                                 "largest_tensor": big_name, "largest_tensor_bytes": big, "rows": []}
        for case in cases:
            out = os.path.join(work, f"out-{layers}L-{case}" + (".safetensors" if case == "copy" else ".nemo"))
            row = measure(case, src, out, work, args, verify_layers=layers)
            log(f"  {case:14s} {row['op_seconds']:7.2f} s  private {_mib(row['peak_private'])} MiB  "
                f"rss {_mib(row['peak_rss'])} MiB  {row.get('verify', '')}")
            entry["rows"].append(row)
        entry["ratios"] = ratios(entry, res["baseline"], res.get("baseline-hf"))
        res["sizes"].append(entry)
        if not args.keep:
            _rm(src)

    rows = [res["baseline"], *(r for sz in res["sizes"] for r in sz["rows"])]
    res["max_rollup_delta"] = max(r["max_rollup_delta"] for r in rows)
    md = markdown(res)
    print(md)
    with open(os.path.join(args.results, "results.md"), "w", encoding="utf-8") as f:
        f.write(md)
    with open(os.path.join(args.results, "results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
    log(f"wrote {os.path.join(args.results, 'results.md')} and results.json")
    if not args.keep:
        for name in os.listdir(work):
            if name.startswith(".result-"):
                _rm(os.path.join(work, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
