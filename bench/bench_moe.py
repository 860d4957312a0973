#!/usr/bin/env python
"""Mixture-of-experts import benchmark: memory stays flat in the number of experts, and
the import runs near the streaming copy of the same bytes.

A tiny-but-wide Mixtral (bf16, one safetensors file per expert tensor as the Hub writes
them, ``block_sparse_moe.experts.{e}.w1/w3/w2``) at 16 and 64 experts is imported to a
dist ``.nemo`` (every layer's experts one ``[L, E, …]`` key, written one expert at a
time). Each case runs in a fresh child whose private memory the parent samples
(``bench/memory.py``); the parent never imports torch.

    python bench/bench_moe.py                         # 16 and 64 experts, 3 measured runs each
    python bench/bench_moe.py --experts 64 --repeat 5

Prints a Markdown table: per expert count, the model's bytes, the private-memory growth of
the import over the interpreter floor (``import torch, nemo_convert.api``), and the import
time against a streaming copy (``bench_import.case_copy``) of the same source, median of
the measured runs (one warm-up run discarded). See ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_import import case_copy, child_env  # noqa: E402
from memory import run_measured  # noqa: E402

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 768, 1536, 2, 12, 4, 4096
MIB = 1024 * 1024


def hf_config(experts: int) -> dict[str, Any]:
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": HIDDEN,
            "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": None, "vocab_size": VOCAB, "num_local_experts": experts,
            "num_experts_per_tok": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "hidden_act": "silu",
            "tie_word_embeddings": False, "sliding_window": None, "dtype": "bfloat16", "router_aux_loss_coef": 0.02,
            "router_jitter_noise": 0.0, "output_router_logits": False, "attention_dropout": 0.0,
            "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2}


def hf_shapes(experts: int) -> list[tuple[str, tuple[int, ...]]]:
    d = HIDDEN // HEADS
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (HIDDEN,)), (p + "post_attention_layernorm.weight", (HIDDEN,)),
                (p + "self_attn.q_proj.weight", (HEADS * d, HIDDEN)),
                (p + "self_attn.k_proj.weight", (KV_HEADS * d, HIDDEN)),
                (p + "self_attn.v_proj.weight", (KV_HEADS * d, HIDDEN)),
                (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * d)),
                (p + "block_sparse_moe.gate.weight", (experts, HIDDEN))]
        for e in range(experts):
            x = f"{p}block_sparse_moe.experts.{e}."
            out += [(x + "w1.weight", (FFN, HIDDEN)), (x + "w3.weight", (FFN, HIDDEN)),
                    (x + "w2.weight", (HIDDEN, FFN))]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def generate(folder: str, experts: int) -> None:  # child side
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(experts)
    tensors = {n: torch.randn(s, generator=g).mul_(0.02).to(torch.bfloat16) for n, s in hf_shapes(experts)}
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": {n: "model.safetensors" for n in tensors}}, f)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(experts), f)


def child_main(case: str, src: str, out: str, result: str) -> int:
    info: dict[str, Any] = {}
    import torch  # noqa: F401

    import nemo_convert.api as api

    t0 = time.perf_counter()
    if case == "gen":
        generate(src, int(out))
    elif case == "copy":
        info = case_copy(src, out)
    elif case == "import":
        rep = api.import_hf(src, out)
        info = {"bytes": rep.bytes}
    elif case != "baseline":
        raise SystemExit(f"unknown case {case!r}")
    info["op_seconds"] = time.perf_counter() - t0
    with open(result, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return 0


def run(case: str, src: str, out: str, work: str) -> Any:
    result = os.path.join(work, "result.json")
    r = run_measured([sys.executable, os.path.abspath(__file__), "--_child", case, src, out, result],
                     result_path=result, env=child_env())
    if r.returncode != 0:
        raise SystemExit(f"{case} failed: {r.stderr_tail}")
    for p in (out + ".nemo", out):
        if os.path.isfile(p):
            os.unlink(p)
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", default="16,64", help="expert counts (default 16,64)")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per case (default 3)")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out", "moe"))
    ap.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return child_main(*args._child)
    work = args.workdir
    os.makedirs(work, exist_ok=True)
    rows = ["| experts | model | import growth (private, over the floor) | import / copy (median of "
            f"{args.repeat}) | import s | copy s |", "|---|---|---|---|---|---|"]
    for experts in (int(x) for x in args.experts.split(",")):
        src = os.path.join(work, f"mixtral-{experts}")
        if not os.path.exists(os.path.join(src, "config.json")):
            run("gen", src, str(experts), work)
        size = os.path.getsize(os.path.join(src, "model.safetensors"))
        floor = max(run("baseline", src, "", work).memory.peak_private for _ in range(2))
        out = os.path.join(work, "out")
        times: dict[str, list[float]] = {"copy": [], "import": []}
        ratios, growth = [], 0
        for k in range(args.repeat + 1):  # run 0 warms the page cache
            c = run("copy", src, out + ".safetensors", work)
            m = run("import", src, out + ".nemo", work)
            if k:
                times["copy"].append(c.result["op_seconds"])
                times["import"].append(m.result["op_seconds"])
                ratios.append(m.result["op_seconds"] / c.result["op_seconds"])
                growth = max(growth, m.memory.peak_private - floor)
        rows.append(f"| {experts} | {size / MIB:.0f} MiB | {growth / MIB:.1f} MiB | "
                    f"{statistics.median(ratios):.2f}× | {statistics.median(times['import']):.3f} | "
                    f"{statistics.median(times['copy']):.3f} |")
        shutil.rmtree(src, ignore_errors=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
