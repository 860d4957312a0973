#!/usr/bin/env python
"""Scale in tensor count: import, export and reshard of a DeepSeek-V3-shaped checkpoint at
the real layer and expert counts with tiny widths, so that per-tensor overhead is all
there is to measure.

The source is generated as the hub stores DeepSeek-V3 (``deepseek-ai/DeepSeek-V3``'s
``config.json``, ``tests/data/hub_configs/deepseek_v3/DeepSeek-V3.json``, with only the
widths shrunk): 61 layers, the first 3 dense, 256 routed experts + 1 shared per MoE layer,
one multi-token-prediction layer (``model.layers.61.*``, README_WEIGHTS.md of the hub
repository), every linear weight of the layers in ``float8_e4m3fn`` beside its float32
``weight_scale_inv`` (one per 128 × 128 block, ``quantization_config`` as published),
norms, router, embedding and head in bf16, the router bias in float32, in ~160 safetensors
shards with an index (the hub has 163). At 256 experts that is 91,991 stored tensors
(45,995 after dequantization); the same model at 16 experts has 8,471 (4,235), so the cost
per tensor shows as the slope between the two.

Cases (each a fresh child process, measured by ``bench/memory.py``: CPU = user + system
time from ``wait4``, the child's whole life; ``ru_maxrss``; private memory sampled):

* ``baseline`` — ``import torch, nemo_convert.api`` and exit: the interpreter's floor;
* ``copy`` — the machine's per-tensor floor: every source shard read with
  ``safetensors.safe_open`` (each tensor built) and written again with
  ``safetensors.torch.save_file``, fsynced;
* ``import`` — ``api.import_hf(SRC, dist.nemo)`` (dist layout, fp8 dequantized on read);
* ``export`` — ``api.export_hf(dist.nemo, hf/)`` (bf16 safetensors shards);
* ``reshard`` — ``api.reshard(dist.nemo, tp2ep2.nemo, tp=2, ep=2)`` (dist → dist).

::

    python bench/bench_tensor_count.py                      # 16 and 256 experts, 3 measured runs each
    python bench/bench_tensor_count.py --experts 16 --repeat 1 --cases import
    python bench/bench_tensor_count.py --snapshot HEAD      # measure the committed code (git archive)

Prints a Markdown table (median over the measured runs after one discarded warm-up; the
load average at each run is kept) and writes ``results.json`` beside the work folder.
Generated sources are cached in ``bench/out/tensor_count/`` (git-ignored). See
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from memory import ChildRun, run_measured  # noqa: E402

HUB_CONFIG = os.path.join(REPO, "tests", "data", "hub_configs", "deepseek_v3", "DeepSeek-V3.json")
#: The tiny widths; every count (layers, dense layers, experts, shared experts, MTP layers) is the hub's.
TINY = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 8,
        "num_key_value_heads": 8, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 1280}
#: Stored tensors per source shard: the hub's 91,991 tensors lie in 163 shards.
PER_SHARD = 565
MIB = 1024 * 1024
CASES = ("copy", "import", "export", "reshard")
GENERATOR_VERSION = 1  # bump to regenerate cached sources


def hf_config(experts: int, mtp: bool = True) -> dict[str, Any]:
    with open(HUB_CONFIG, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg.update(TINY, n_routed_experts=experts)
    if experts < 64:  # 8 groups of at least 2, top-4 groups of top-8 experts: still a valid router
        cfg.update(n_group=4, topk_group=2, num_experts_per_tok=4)
    if not mtp:
        cfg["num_nextn_predict_layers"] = 0
    return cfg


def hf_tensors(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every logical tensor in the hub's order; kind is ``fp8`` (a
    linear weight stored with its ``weight_scale_inv``), ``bf16`` or ``f32``."""
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    ql, kvl, nope, rope, v = (cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                "qk_rope_head_dim", "v_head_dim"))
    fe, f, e = cfg["moe_intermediate_size"], cfg["intermediate_size"], cfg["n_routed_experts"]
    fs = fe * cfg["n_shared_experts"]
    layers, dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    out: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "bf16")]

    def mlp(p: str, ffn: int) -> list[tuple[str, tuple[int, ...], str]]:
        return [(p + "gate_proj.weight", (ffn, h), "fp8"), (p + "up_proj.weight", (ffn, h), "fp8"),
                (p + "down_proj.weight", (h, ffn), "fp8")]

    for i in range(layers + int(cfg.get("num_nextn_predict_layers") or 0)):
        p = f"model.layers.{i}."
        if i >= layers:  # an MTP layer: its own norms and projection, then a decoder layer
            out += [(p + "enorm.weight", (h,), "bf16"), (p + "hnorm.weight", (h,), "bf16"),
                    (p + "eh_proj.weight", (h, 2 * h), "bf16"), (p + "embed_tokens.weight", (cfg["vocab_size"], h),
                                                                 "bf16"),
                    (p + "shared_head.norm.weight", (h,), "bf16"),
                    (p + "shared_head.head.weight", (cfg["vocab_size"], h), "bf16")]
        out += [(p + "input_layernorm.weight", (h,), "bf16"), (p + "post_attention_layernorm.weight", (h,), "bf16"),
                (p + "self_attn.q_a_proj.weight", (ql, h), "fp8"), (p + "self_attn.q_a_layernorm.weight", (ql,), "bf16"),
                (p + "self_attn.q_b_proj.weight", (nh * (nope + rope), ql), "fp8"),
                (p + "self_attn.kv_a_proj_with_mqa.weight", (kvl + rope, h), "fp8"),
                (p + "self_attn.kv_a_layernorm.weight", (kvl,), "bf16"),
                (p + "self_attn.kv_b_proj.weight", (nh * (nope + v), kvl), "fp8"),
                (p + "self_attn.o_proj.weight", (h, nh * v), "fp8")]
        if i < dense:
            out += mlp(p + "mlp.", f)
        else:
            out += [(p + "mlp.gate.weight", (e, h), "bf16"), (p + "mlp.gate.e_score_correction_bias", (e,), "f32")]
            for x in range(e):
                out += mlp(f"{p}mlp.experts.{x}.", fe)
            out += mlp(p + "mlp.shared_experts.", fs)
    return out + [("model.norm.weight", (h,), "bf16"), ("lm_head.weight", (cfg["vocab_size"], h), "bf16")]


def stored_count(cfg: dict[str, Any]) -> tuple[int, int]:
    """(stored tensors, logical tensors) of the generated source."""
    t = hf_tensors(cfg)
    return len(t) + sum(k == "fp8" for _, _, k in t), len(t)


def generate(folder: str, experts: int, mtp: bool) -> None:  # child side
    import torch
    from safetensors.torch import save_file

    cfg = hf_config(experts, mtp)
    b0, b1 = cfg["quantization_config"]["weight_block_size"]
    g = torch.Generator().manual_seed(experts)
    stored: list[tuple[str, Any]] = []
    for name, shape, kind in hf_tensors(cfg):
        w = torch.randn(shape, generator=g)
        if kind == "fp8":
            stored.append((name, (w * 64).to(torch.float8_e4m3fn)))
            scale = torch.rand((-(-shape[0] // b0), -(-shape[1] // b1)), generator=g) * 1e-3 + 1e-4
            stored.append((name + "_scale_inv", scale))
        else:
            scale = 0.5 if name.endswith("bias") else 0.02
            stored.append((name, (w * scale).to(torch.float32 if kind == "f32" else torch.bfloat16)))
    main = dict(stored)
    copies = {"embed_tokens.weight": main["model.embed_tokens.weight"], "shared_head.head.weight": main["lm_head.weight"]}
    # the MTP layer's embedding and head are copies of the main ones (Megatron-Core shares them)
    stored = [(n, copies[n.split(".", 3)[3]].clone() if n.startswith("model.layers.") and n.split(".", 3)[3] in copies
               else t) for n, t in stored]
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shards = [stored[i:i + PER_SHARD] for i in range(0, len(stored), PER_SHARD)]
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):06d}.safetensors"
        save_file(dict(shard), os.path.join(tmp, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n, _ in shard})
    total = sum(t.numel() * t.element_size() for _, t in stored)
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(tmp, ".bench-source.json"), "w", encoding="utf-8") as f:
        json.dump({"version": GENERATOR_VERSION, "experts": experts, "mtp": mtp, "stored": len(stored),
                   "logical": len(hf_tensors(cfg)), "bytes": total, "shards": len(shards)}, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)


# ============================================================================ the cases (child side)
def case_copy(src: str, out: str) -> dict[str, Any]:
    """Every source shard read tensor by tensor with ``safe_open`` and written again with
    ``save_file`` (one output shard per input shard), fsynced: the floor of a Python
    program that touches each tensor once."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    os.makedirs(out)
    n = 0
    for fname in sorted(os.listdir(src)):
        if not fname.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(src, fname), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        path = os.path.join(out, fname)
        save_file(tensors, path, metadata={"format": "pt"})
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        n += len(tensors)
    return {"tensors_in": n, "tensors_out": n}


def _nemo_items(path: str) -> int:
    """Tensor entries of a dist ``.nemo``'s ``.metadata`` (``_extra_state`` items excluded)."""
    from nemo_convert.convert.checkpoint import open_checkpoint

    with open_checkpoint(path) as ck:
        return len(ck.source.keys())


def child_main(case: str, src: str, out: str, result: str, mtp: str) -> int:
    info: dict[str, Any] = {}
    import torch  # noqa: F401

    import nemo_convert.api as api

    if case == "gen":
        generate(src, int(out), mtp == "1")
        return 0
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if case == "copy":
        info = case_copy(src, out)
    elif case == "import":
        rep = api.import_hf(src, out, options={} if mtp == "1" else {"drop_mtp": True})
        info = {"tensors_out": rep.tensors, "notes": rep.notes}
    elif case == "export":
        rep = api.export_hf(src, out)
        info = {"tensors_out": rep.tensors}
    elif case == "reshard":
        rep = api.reshard(src, out, tp=2, ep=2)
        info = {"tensors_out": rep.tensors}
    elif case != "baseline":
        raise SystemExit(f"unknown case {case!r}")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    info["op_seconds"] = time.perf_counter() - t0
    info["op_cpu"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    with open(result, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return 0


# ============================================================================ the parent (torch-free)
CODE: str | None = None  # --snapshot: the code children import


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if CODE:
        env["PYTHONPATH"] = os.pathsep.join([CODE, os.path.join(CODE, "plugins")]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def snapshot(rev: str, work: str) -> str:
    """``git archive`` of ``rev`` into ``work/code-SHA`` (reused)."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    dest = os.path.join(work, f"code-{sha[:12]}")
    if not os.path.exists(os.path.join(dest, ".bench-snapshot")):
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        archive = subprocess.Popen(["git", "-C", REPO, "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {rev} failed")
        with open(os.path.join(dest, ".bench-snapshot"), "w", encoding="utf-8") as f:
            f.write(sha + "\n")
    return dest


def _rm(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def run_child(case: str, src: str, out: str, work: str, mtp: bool) -> ChildRun:
    result = os.path.join(work, "result.json")
    _rm(out)
    r = run_measured([sys.executable, os.path.abspath(__file__), "--_child", case, src, out, result,
                      "1" if mtp else "0"], result_path=result, env=child_env(), cwd=CODE)
    if r.returncode != 0:
        raise SystemExit(f"{case} failed ({r.returncode}): {r.stderr_tail}")
    return r


def ensure_source(work: str, experts: int, mtp: bool) -> tuple[str, dict[str, Any]]:
    src = os.path.join(work, f"dsv3-{experts}e{'' if mtp else '-nomtp'}")
    meta = os.path.join(src, ".bench-source.json")
    if os.path.exists(meta):
        with open(meta, encoding="utf-8") as f:
            got = json.load(f)
        if got.get("version") == GENERATOR_VERSION:
            return src, got
    print(f"generating {src} …", file=sys.stderr, flush=True)
    run_child("gen", src, str(experts), work, mtp)
    with open(meta, encoding="utf-8") as f:
        return src, json.load(f)


def _summary(runs: list[ChildRun], loads: list[float]) -> dict[str, Any]:
    res = [r.result for r in runs]
    return {"cpu": statistics.median(r.cpu_seconds for r in runs),
            "cpu_runs": [round(r.cpu_seconds, 3) for r in runs],
            "op_cpu": statistics.median(x["op_cpu"] for x in res),
            "wall": statistics.median(r.wall_seconds for r in runs),
            "op_wall": statistics.median(x["op_seconds"] for x in res),
            "ru_maxrss": max(r.memory.ru_maxrss for r in runs),
            "peak_private": max(r.memory.peak_private for r in runs),
            "tensors_in": res[0].get("tensors_in"), "tensors_out": res[0].get("tensors_out"),
            "loadavg": loads}


def measure(work: str, experts: int, cases: list[str], repeat: int, mtp: bool, keep: bool) -> dict[str, Any]:
    src, meta = ensure_source(work, experts, mtp)
    dist = os.path.join(work, f"dist-{experts}.nemo")
    out: dict[str, Any] = {"source": meta}
    base = [run_child("baseline", src, "", work, mtp) for _ in range(2)]
    out["baseline"] = _summary(base, [os.getloadavg()[0]])
    need_dist = any(c in ("export", "reshard") for c in cases)
    if need_dist and "import" not in cases and not os.path.exists(dist):
        run_child("import", src, dist, work, mtp)
    for case in cases:
        runs, loads = [], []
        for k in range(repeat + 1):  # run 0 warms the page cache and is discarded
            target = os.path.join(work, f"out-{case}") + (".nemo" if case in ("import", "reshard") else "")
            inp = dist if case in ("export", "reshard") else src
            loads.append(round(os.getloadavg()[0], 2))
            r = run_child(case, inp, target, work, mtp)
            if k:
                runs.append(r)
            if case == "import" and need_dist:
                _rm(dist)
                os.rename(target, dist)
            elif not keep:
                _rm(target)
        s = _summary(runs, loads[1:])
        s["tensors_in"] = s["tensors_in"] or (meta["stored"] if case == "import" else None)
        out[case] = s
        print(f"  {experts} experts {case}: cpu {s['cpu']:.2f} s (op {s['op_cpu']:.2f}), wall {s['wall']:.2f} s, "
              f"ru_maxrss {s['ru_maxrss'] / MIB:.0f} MiB, load {loads}", file=sys.stderr, flush=True)
    if "export" in cases or "reshard" in cases:
        out["dist_items"] = _dist_items(dist)
    if not keep:
        _rm(dist)
    return out


def _dist_items(path: str) -> int:
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[2]); import bench_tensor_count "
                        "as b; print(b._nemo_items(sys.argv[1]))", path, HERE], capture_output=True, text=True,
                       env=child_env(), cwd=CODE)
    return int(r.stdout.strip()) if r.returncode == 0 else -1


def markdown(res: dict[str, Any], cases: list[str]) -> str:
    counts = sorted(res["by_experts"], key=int)
    rows = ["| experts | case | stored tensors in | tensors (logical) | process CPU s | operation CPU s | wall s "
            "| CPU ms / tensor | ru_maxrss MiB | private − floor MiB |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in counts:
        r = res["by_experts"][e]
        logical = r["source"]["logical"]
        floor = r["baseline"]["peak_private"]
        rows.append(f"| {e} | baseline | | | {r['baseline']['cpu']:.2f} | | {r['baseline']['wall']:.2f} | | "
                    f"{r['baseline']['ru_maxrss'] / MIB:.0f} | |")
        for c in cases:
            s = r[c]
            stored = r["source"]["stored"] if c in ("copy", "import") else r.get("dist_items", "")
            rows.append(f"| {e} | {c} | {stored} | {logical} | {s['cpu']:.2f} | {s['op_cpu']:.2f} | {s['wall']:.2f} | "
                        f"{1000 * s['cpu'] / logical:.3f} | {s['ru_maxrss'] / MIB:.0f} | "
                        f"{(s['peak_private'] - floor) / MIB:.0f} |")
    if len(counts) >= 2:
        lo, hi = res["by_experts"][counts[0]], res["by_experts"][counts[-1]]
        dn = hi["source"]["logical"] - lo["source"]["logical"]
        rows += ["", f"Growth {counts[0]} → {counts[-1]} experts ({dn} more logical tensors, "
                 f"{hi['source']['stored'] - lo['source']['stored']} more stored):", "",
                 "| case | CPU ms / added tensor | ru_maxrss KiB / added tensor | process CPU ms / tensor at "
                 f"{counts[-1]} | ratio to copy (process CPU) |", "|---|---:|---:|---:|---:|"]
        for c in cases:
            d_cpu = (hi[c]["cpu"] - lo[c]["cpu"]) / dn * 1000
            d_rss = (hi[c]["ru_maxrss"] - lo[c]["ru_maxrss"]) / dn / 1024
            ratio = hi[c]["cpu"] / hi["copy"]["cpu"] if "copy" in hi else float("nan")
            rows.append(f"| {c} | {d_cpu:.3f} | {d_rss:.2f} | {1000 * hi[c]['cpu'] / hi['source']['logical']:.3f} | "
                        f"{ratio:.2f}× |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    global CODE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", default="16,256", help="routed expert counts (default 16,256)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"cases, in order (default {','.join(CASES)})")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per case after one warm-up (default 3)")
    ap.add_argument("--no-mtp", action="store_true", help="generate without the MTP layer")
    ap.add_argument("--snapshot", metavar="REV", help="measure git revision REV (a git archive copy)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs of the last run of each case")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out", "tensor_count"))
    ap.add_argument("--_child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return child_main(*args._child)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    if args.snapshot:
        CODE = snapshot(args.snapshot, work)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}")
    res: dict[str, Any] = {"by_experts": {}, "code": CODE or REPO, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "uptime_start": os.getloadavg(), "cases": cases, "repeat": args.repeat}
    for e in (int(x) for x in args.experts.split(",")):
        res["by_experts"][str(e)] = measure(work, e, cases, args.repeat, not args.no_mtp, args.keep)
    res["uptime_end"] = os.getloadavg()
    table = markdown(res, cases)
    print(table)
    with open(os.path.join(work, "results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(work, "results.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
