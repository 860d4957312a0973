#!/usr/bin/env python
"""Import benchmark: HF Llama (bf16 safetensors) → ``.nemo``, against a streaming copy
(our physical limit) and a naive ``from_pretrained`` + ``torch.save`` + ``tarfile`` peer;
plus, on the same checkpoints, the import as whole CLI commands (one process, and two
under ``torchrun``), ``reshard`` (dist TP1 → legacy TP2 → legacy TP1, and dist → dist) and
``quantize`` (``none`` and ``int8_wo``).

Every case runs in a fresh subprocess whose memory the parent samples from
``/proc/<pid>/smaps_rollup`` (see ``bench/memory.py`` for the definitions), so peaks are
per case. Each case is run once to warm the page cache (discarded), then ``--repeat``
times; the median time and the largest peaks of the measured runs are reported.

    python bench/bench_import.py                       # both sizes, every case
    python bench/bench_import.py --sizes 1.5 --cases copy,import --repeat 3
    python bench/bench_import.py --cases copy,import-cli,import-2proc,reshard-tp2,reshard-tp1

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

ALL_CASES = ("copy", "copy-writeback", "copy-kernel", "import", "import-legacy", "naive", "import-cli", "import-2proc",
             "reshard-tp2", "reshard-tp1", "reshard-dist", "quantize-none", "quantize-int8")
# Timed as whole commands by the parent (process start to exit), memory summed over the
# process tree; every other case is timed inside its child, around the operation alone.
COMMAND_CASES = ("import-cli", "import-2proc")
LARGEST_ONLY = ("quantize-none", "quantize-int8")  # default of --largest-only
RESHARD = {  # case -> (input kind, tp, output layout)
    "reshard-tp2": ("dist", 2, "legacy"),
    "reshard-tp1": ("tp2", 1, "legacy"),
    "reshard-dist": ("dist", 2, "dist"),
}
PRODUCES = {"import": "dist", "reshard-tp2": "tp2", "import-cli": "cli"}  # outputs later cases can reuse
PAIRABLE = ("import", "import-legacy", *RESHARD, "quantize-none", "quantize-int8")  # timed like the copy
CASE_LABELS = {
    "baseline": "interpreter baseline (torch + nemo_convert.api)",
    "baseline-hf": "interpreter baseline (torch + transformers Llama)",
    "copy": "(a) streaming copy",
    "copy-writeback": "(a') streaming copy + early writeback",
    "copy-kernel": "(a'') in-kernel copy (copy_file_range) + early writeback",
    "import": "(b) import_hf, dist layout",
    "import-legacy": "(b) import_hf, legacy layout",
    "naive": "(c) naive peer",
    "import-cli": "(b) CLI import, 1 process — whole command",
    "import-2proc": "(b) CLI import, torchrun 2 processes — whole command",
    "reshard-tp2": "(d) reshard dist TP1 → legacy TP2",
    "reshard-tp1": "(d) reshard legacy TP2 → legacy TP1",
    "reshard-dist": "(d) reshard dist TP1 → dist TP2",
    "quantize-none": "(e) quantize HF → .qnemo, none",
    "quantize-int8": "(e) quantize HF → .qnemo, int8_wo",
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
                   check=True, env=child_env(), cwd=child_cwd())
    with open(os.path.join(folder, ".bench-model.json"), encoding="utf-8") as f:
        got = json.load(f)
    return got, time.perf_counter() - t0


#: ``--snapshot``: a copy of the code (``git archive``) that every child imports
#: ``nemo_convert`` from, instead of the working tree
CODE: str | None = None


def child_cwd() -> str | None:
    """Children run in the snapshot (``python -m nemo_convert`` imports from the current
    directory first), else where the parent runs."""
    return CODE


def child_env() -> dict[str, str]:
    """The environment of every child: offline Hugging Face libraries (the source is local),
    and ``PYTHONPATH`` pointing at the snapshot, if any."""
    env = dict(os.environ)
    if CODE:
        env["PYTHONPATH"] = CODE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1"})
    return env


# ============================================================================ the cases (child side)
def _safetensors_files(src: str) -> list[str]:
    with open(os.path.join(src, "model.safetensors.index.json"), encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(src, f) for f in files]


def _sync_file_range() -> Any:
    """Linux ``sync_file_range`` through ctypes (the copy imports nothing of ours), or None."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return fn


def case_copy(src: str, out: str, writeback: bool = False, kernel: bool = False) -> dict[str, Any]:
    """(a) Every tensor's bytes, from memory-mapped source shards into one new safetensors
    file: plain file I/O, no tensor is ever built. fsync at the end. (a') ``writeback``:
    the same, asking Linux to start writing every completed 32 MiB at once (what our
    writers do, ``nemo_convert/formats/io/output_file.py``), so the final fsync has little left.
    (a'') ``kernel``: with writeback, each tensor's bytes copied file to file by
    ``copy_file_range`` instead of written from the map (what our writers do for bytes
    that are ranges of an input)."""
    sfr = _sync_file_range() if writeback or kernel else None
    chunk, requested = 32 << 20, 0
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
                    while done < len(view):  # a raw write (or copy) may be short
                        if kernel:
                            done += os.copy_file_range(f.fileno(), o.fileno(), len(view) - done, base + b + done)
                        else:
                            done += o.write(view[done:])
                    total += len(view)
                    pos = 8 + len(raw) + total
                    if sfr is not None and pos - requested >= chunk:
                        end = pos - pos % chunk
                        sfr(o.fileno(), requested, end - requested, 2)
                        requested = end
                    view.release()
                mv.release()
        os.fsync(o.fileno())
    return {"bytes": total}


def case_import(src: str, out: str, layout: str) -> dict[str, Any]:
    from nemo_convert import api

    rep = api.import_hf(src, out, layout=layout)
    return {"bytes": rep.bytes, "tensors": rep.tensors, "engine_seconds": rep.seconds}


def case_reshard(src: str, out: str, case: str) -> dict[str, Any]:
    from nemo_convert import api

    _, tp, layout = RESHARD[case]
    rep = api.reshard(src, out, tp=tp, layout=layout)
    return {"bytes": rep.bytes, "tensors": rep.tensors, "engine_seconds": rep.seconds}


def case_quantize(src: str, out: str, algo: str) -> dict[str, Any]:
    from nemo_convert import api

    rep = api.quantize(src, out, algo=algo)
    return {"bytes": rep.bytes, "tensors": rep.tensors, "engine_seconds": rep.seconds}


def command_for(case: str, src: str, out: str) -> list[str]:
    """The command line of a command case, run as is (in the ``--snapshot`` copy if any,
    else in the parent's directory)."""
    cli = ["-m", "nemo_convert", "import", src, "-o", out, "-q"]
    if case == "import-cli":
        return [sys.executable, *cli]
    if case == "import-2proc":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *cli]
    raise ValueError(case)


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
    elif case in ("copy", "copy-writeback", "copy-kernel"):
        t0, c0 = time.perf_counter(), time.process_time()
        info = case_copy(src, out, writeback=case == "copy-writeback", kernel=case == "copy-kernel")
    elif case in ("import", "import-legacy", "quantize-none", "quantize-int8") or case in RESHARD:
        import torch

        import nemo_convert.api  # noqa: F401

        t0, c0 = time.perf_counter(), time.process_time()
        if case in RESHARD:
            info = case_reshard(src, out, case)
        elif case.startswith("quantize-"):
            info = case_quantize(src, out, {"quantize-none": "none", "quantize-int8": "int8_wo"}[case])
        else:
            info = case_import(src, out, "legacy" if case == "import-legacy" else "dist")
    elif case == "naive":
        import torch  # noqa: F401
        import transformers  # noqa: F401

        t0, c0 = time.perf_counter(), time.process_time()
        info = case_naive(src, out)
    elif case == "prep-dist":  # inputs of the reshard cases (not measured)
        t0 = c0 = 0.0
        info = case_import(src, out, "dist")
    elif case == "prep-tp2":
        t0 = c0 = 0.0
        info = case_reshard(src, out, "reshard-tp2")
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


def verify_qnemo(src: str, out: str, layers: int, algo: str) -> str:
    """Spot checks of a ``.qnemo`` folder against the HF source: the embedding and the LM head
    (never quantized) bit-exact; the last layer's ``mlp.proj`` bit-exact for ``none``, and for
    ``int8_wo`` (written as the float weight on the per-channel int8 grid) within half a step
    of the grid (amax/127) plus bf16 rounding; the tensor count."""
    import torch
    from safetensors import safe_open

    from nemo_convert import api

    try:
        with api.open_checkpoint(src) as hf, safe_open(os.path.join(out, "rank0.safetensors"), "pt") as q:
            s = hf.source
            keys = set(q.keys())
            for ours, theirs in (("transformer.vocab_embedding.weight", "model.embed_tokens.weight"),
                                 ("lm_head.weight", "lm_head.weight")):
                a, b = q.get_tensor(ours), s.load(theirs)
                if a.dtype != b.dtype or not torch.equal(a, b):
                    return f"{ours} differs"
            name = f"transformer.layers.{layers - 1}.mlp.proj.weight"
            got, want = q.get_tensor(name), s.load(f"model.layers.{layers - 1}.mlp.down_proj.weight")
            if got.shape != want.shape:
                return f"{name}: shape {list(got.shape)}"
            if algo == "none":
                if not torch.equal(got, want):
                    return f"{name} differs"
            else:
                w, g = want.float(), got.float()
                step = w.abs().amax(dim=1, keepdim=True) / 127
                if not bool(((g - w).abs() <= step / 2 + w.abs() * 2**-7 + 1e-12).all()) or torch.equal(got, want):
                    return f"{name} is not on the int8 grid"
            expected = 3 + 7 * layers  # embedding, final norm, lm_head; a layer: 2 norms, qkv, dense, fc, gate, proj
            if len(keys) != expected:
                return f"{len(keys)} tensors, expected {expected}"
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported in the results, not fatal
        return f"error: {exc.__class__.__name__}: {exc}"


def verify_in_child(src: str, out: str, layers: int, qnemo: str | None = None) -> str:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_verify", out, "--_src", src,
                           "--_layers", str(layers), *(["--_qnemo", qnemo] if qnemo else [])],
                          capture_output=True, text=True, env=child_env(), cwd=child_cwd(), check=False)
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
    if case in COMMAND_CASES:
        # the whole command, as a user runs it: time = its wall (process start to exit, as seen
        # here), CPU = its own + every reaped descendant's, memory = sum over the process tree
        run = run_measured(command_for(case, src, out), interval=interval, timeout=900, env=child_env(),
                           tree=True, cwd=child_cwd())
        run.result = {"op_seconds": run.wall_seconds, "op_cpu_seconds": run.cpu_seconds, "setup_seconds": 0.0}
    else:
        result = os.path.join(work, f".result-{case}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--_child", case, "--_src", src, "--_out", out,
               "--_result", result]
        run = run_measured(cmd, result_path=result, interval=interval, timeout=900, env=child_env(),
                           cwd=child_cwd())
    if run.returncode != 0:
        raise RuntimeError(f"case {case} failed (exit {run.returncode}):\n{run.stderr_tail}")
    return run


def _processes(run: ChildRun) -> list[dict[str, Any]]:
    """Tree mode: each process's own peaks, in start (pid) order, root first."""
    procs = sorted(run.memory.per_process.items())
    return [{"pid": pid, **rec} for pid, rec in procs]


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
        "max_processes": max(r.memory.max_processes for r in runs),
        # tree mode: the processes of the run with the largest peak (sum over the tree)
        "processes": _processes(max(runs, key=lambda r: r.memory.peak_private)) if runs[0].memory.per_process
        else [],
    }


def measure(case: str, src: str | None, out: str | None, work: str, args: argparse.Namespace,
            verify_layers: int | None = None, verify_src: str | None = None, keep_as: str | None = None,
            same_as: str | None = None, pair_with_copy: str | None = None) -> dict[str, Any]:
    """Warm-up + measured runs of one case. The output of the last run is spot-checked against
    ``verify_src`` (the HF source; default ``src``), compared byte for byte with ``same_as`` if
    given, and then moved to ``keep_as`` (an input of a later case) or deleted.

    With ``pair_with_copy`` (the HF source), every measured run is preceded by a streaming
    copy of that source, so each run has its own baseline measured seconds before it: the
    row then carries the per-run ratios (``paired_ratios``), which machine-load swings
    between cases cannot skew."""
    warm = None
    if not args.no_warmup:
        if out:
            _rm(out)
        warm = run_case(case, src or "-", out or "-", work, args.interval)
    runs, loads, pairs = [], [], []
    copy_out = os.path.join(work, "paired-copy.safetensors")
    for _ in range(args.repeat):
        if out:
            _rm(out)
        if pair_with_copy:
            _rm(copy_out)
            pairs.append(run_case("copy", pair_with_copy, copy_out, work, args.interval).result["op_seconds"])
            _rm(copy_out)
        loads.append(os.getloadavg()[0])
        runs.append(run_case(case, src or "-", out or "-", work, args.interval))
    row = _summarise(case, runs, warm, loads)
    if pairs:
        row["paired_copy_seconds"] = pairs
        row["paired_ratios"] = [a / b for a, b in zip(row["op_seconds_all"], pairs)]
    if out is None:
        return row
    if os.path.exists(out):
        row["output_bytes"] = _du(out)
        if verify_layers is not None and not case.startswith("copy") and not args.no_verify:
            qnemo = {"quantize-none": "none", "quantize-int8": "int8_wo"}.get(case)
            row["verify"] = verify_in_child(verify_src or src, out, verify_layers, qnemo)
            if same_as and os.path.exists(same_as):
                import filecmp

                same = filecmp.cmp(same_as, out, shallow=False)
                row["verify"] += "; byte-identical to 1 process" if same else "; DIFFERS from the 1-process output"
    if keep_as:
        os.replace(out, keep_as)
    elif not args.keep:
        _rm(out)
    return row


def ensure_input(kind: str, src: str, paths: dict[str, str], work: str, log: Any) -> str:
    """The input ``.nemo`` of a reshard case: kept from an earlier case of this run, else
    made now by a child (not measured): ``dist`` = ``import_hf`` (dist layout), ``tp2`` =
    ``reshard`` of that to legacy TP2."""
    path = paths[kind]
    if os.path.exists(path):
        return path
    t0 = time.perf_counter()
    child_src = src if kind == "dist" else ensure_input("dist", src, paths, work, log)
    result = os.path.join(work, f".result-prep-{kind}.json")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", f"prep-{kind}", "--_src", child_src,
                    "--_out", path, "--_result", result], check=True, env=child_env(), cwd=child_cwd())
    log(f"  (prepared the {kind} input in {time.perf_counter() - t0:.1f} s, not measured)")
    return path


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
        "nemo_convert_commit": _git_rev(), "nemo_convert_from": _code_origin(), "loadavg_at_start": os.getloadavg(),
    }


def snapshot(rev: str, work: str) -> str:
    """``git archive`` of ``rev`` of this checkout into ``work/code-SHA`` (reused if there)."""
    repo = os.path.dirname(HERE)
    sha = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    dest = os.path.join(work, f"code-{sha[:12]}")
    if not os.path.exists(os.path.join(dest, ".bench-snapshot")):
        _rm(dest)
        os.makedirs(dest)
        archive = subprocess.Popen(["git", "-C", repo, "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {rev} failed")
        with open(os.path.join(dest, ".bench-snapshot"), "w", encoding="utf-8") as f:
            f.write(sha + "\n")
    return dest


def _code_origin() -> str:
    """Where the children import ``nemo_convert`` from (``PYTHONPATH`` can point them at a
    snapshot of the code), found without importing it (the parent stays torch-free)."""
    import importlib.util

    if CODE:
        return os.path.join(CODE, "nemo_convert")
    spec = importlib.util.find_spec("nemo_convert")
    return os.path.dirname(spec.origin) if spec and spec.origin else "?"


def _git_rev() -> str:
    """The commit of the code measured: the snapshot's, else the checkout's (+dirty)."""
    if CODE:
        with open(os.path.join(CODE, ".bench-snapshot"), encoding="utf-8") as f:
            return f.read().strip()[:12] + " (snapshot)"
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
    """``{name: {"median": x, "best": y, "cpu": z}}``: time ratios on the median and on the
    best run, and on the CPU time; memory ratios on the largest peak (the same number in
    both). Command cases are timed as whole commands (process start to exit), the others
    around the operation inside their child: the key says which."""
    rows = {r["case"]: r for r in size["rows"]}
    out: dict[str, dict[str, float]] = {}

    for c, r in rows.items():
        if r.get("paired_ratios"):
            pr = r["paired_ratios"]
            out[f"{c}/copy time (paired)"] = {"median": statistics.median(pr), "best": min(pr), "cpu": None}

    def t(num: str, den: str, den_factor: float = 1.0) -> dict[str, float]:
        return {"median": rows[num]["op_seconds"] / (den_factor * rows[den]["op_seconds"]),
                "best": rows[num]["op_seconds_best"] / (den_factor * rows[den]["op_seconds_best"]),
                "cpu": rows[num]["op_cpu_seconds"] / max(den_factor * rows[den]["op_cpu_seconds"], 1e-9)}

    def mem(c: str) -> None:
        base = baseline_hf if c == "naive" and baseline_hf else baseline
        extra = (rows[c]["peak_private"] - base["peak_private"]) / size["largest_tensor_bytes"]
        out[f"{c} (private - baseline)/largest tensor"] = {"median": extra, "best": extra, "cpu": None}

    def have(*cs: str) -> bool:
        return all(c in rows for c in cs)

    for c in ("import", "import-legacy"):
        if have(c, "copy"):
            out[f"{c}/copy time"] = t(c, "copy")
    for c in ("import", "import-legacy", *RESHARD):
        if have(c, "copy-writeback"):
            out[f"{c}/copy-writeback time"] = t(c, "copy-writeback")
        if have(c, "copy-kernel"):
            out[f"{c}/copy-kernel time"] = t(c, "copy-kernel")
    for c in ("import", "import-legacy"):
        if have(c, "naive"):
            out[f"naive/{c} time"] = t("naive", c)
    for c in ("import", "import-legacy", "naive"):
        if c in rows:
            mem(c)
    # whole commands
    for c in COMMAND_CASES:
        if have(c, "copy"):
            out[f"{c} wall/copy time"] = t(c, "copy")
    if have("import-2proc", "import-cli"):
        out["import-2proc wall/import-cli wall"] = t("import-2proc", "import-cli")
        p2, p1 = rows["import-2proc"]["peak_private"], rows["import-cli"]["peak_private"]
        out["import-2proc tree private/import-cli private"] = {"median": p2 / p1, "best": p2 / p1, "cpu": None}
    if have("import-cli", "import"):
        out["import-cli wall/import process wall"] = {
            "median": rows["import-cli"]["op_seconds"] / rows["import"]["process_seconds"],
            "best": rows["import-cli"]["op_seconds_best"] / rows["import"]["process_seconds"], "cpu": None}
    if "import-cli" in rows:
        mem("import-cli")
    # reshard
    for c in RESHARD:
        if have(c, "copy"):
            out[f"{c}/copy time"] = t(c, "copy")
    if have("reshard-tp2", "reshard-tp1", "copy"):
        rt = {k: rows["reshard-tp2"][k] + rows["reshard-tp1"][k] for k in ("op_seconds", "op_seconds_best",
                                                                          "op_cpu_seconds")}
        cp = rows["copy"]
        out["reshard round trip (tp2 + tp1)/(2 × copy) time"] = {
            "median": rt["op_seconds"] / (2 * cp["op_seconds"]), "best": rt["op_seconds_best"] / (2 * cp["op_seconds_best"]),
            "cpu": rt["op_cpu_seconds"] / max(2 * cp["op_cpu_seconds"], 1e-9)}
    for c in RESHARD:
        if c in rows:
            mem(c)
    # quantize
    for c in ("quantize-none", "quantize-int8"):
        if have(c, "copy"):
            out[f"{c}/copy time"] = t(c, "copy")
    for c in ("quantize-none", "quantize-int8"):
        if c in rows:
            mem(c)
    return out


def cross_size(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Private memory above the baseline at the largest size over the smallest, per case run
    at both (the model grows ``model_ratio``×): ~1 = flat, ~model_ratio = grows with the model."""
    if len(res["sizes"]) < 2:
        return {}
    small, large = min(res["sizes"], key=lambda e: e["model_bytes"]), max(res["sizes"], key=lambda e: e["model_bytes"])
    rs, rl = {r["case"]: r for r in small["rows"]}, {r["case"]: r for r in large["rows"]}
    out: dict[str, dict[str, float]] = {}
    for c in rl:
        if c not in rs or c.startswith("copy") or c in COMMAND_CASES and c != "import-cli":
            continue
        base = (res.get("baseline-hf") if c == "naive" else res["baseline"])["peak_private"]
        a, b = rs[c]["peak_private"] - base, rl[c]["peak_private"] - base
        out[f"{c} (private - baseline) large/small"] = {
            "small": a, "large": b, "ratio": b / a if a > 0 else float("inf"),
            "model_ratio": large["model_bytes"] / small["model_bytes"]}
    return out


# ratio key -> [(comparison, bound, where the target comes from)]
TARGETS: dict[str, list[tuple[str, float, str]]] = {
    "import/copy time": [("<=", 1.5, "brief"), ("<=", 1.2, "issue 7")],
    "import-legacy/copy time": [("<=", 1.5, "brief"), ("<=", 1.2, "issue 7")],
    "naive/import time": [(">=", 4.0, "brief")], "naive/import-legacy time": [(">=", 4.0, "brief")],
    "import (private - baseline)/largest tensor": [("<", 3.0, "brief")],
    "import-legacy (private - baseline)/largest tensor": [("<", 3.0, "brief")],
    "reshard-tp2/copy time": [("<=", 1.5, "reshard issue")],
    "reshard-tp1/copy time": [("<=", 1.5, "reshard issue")],
    "reshard-dist/copy time": [("<=", 1.5, "reshard issue")],
    "reshard round trip (tp2 + tp1)/(2 × copy) time": [("<=", 1.5, "reshard issue")],
    **{f"{c}/copy time (paired)": [("<=", 1.5, "reshard issue")] for c in ("reshard-tp2", "reshard-tp1", "reshard-dist")},
    **{f"{c}/copy time (paired)": [("<=", 1.5, "brief"), ("<=", 1.2, "issue 7")] for c in ("import", "import-legacy")},
    # "private memory flat across the two model sizes": at most 1.25× while the model grows 2.1×,
    # or less than FLAT_NOISE_BYTES more in absolute terms (transient buffers the 20 ms sampler
    # catches or misses move a few tens of MiB from run to run)
    "reshard-tp2 (private - baseline) large/small": [("<=", 1.25, "reshard issue: flat")],
    "reshard-tp1 (private - baseline) large/small": [("<=", 1.25, "reshard issue: flat")],
    "reshard-dist (private - baseline) large/small": [("<=", 1.25, "reshard issue: flat")],
}


FLAT_NOISE_BYTES = 64 * 1024 * 1024


def _met(key: str, value: float) -> list[str]:
    """One line per target of ``key`` (an empty string if it has none)."""
    out = []
    for op, bound, why in TARGETS.get(key, []):
        ok = value <= bound if op == "<=" else value >= bound if op == ">=" else value < bound
        out.append(f"{op} {bound:g} ({why}): {'met' if ok else '**NOT met**'}")
    return out or [""]


def markdown(res: dict[str, Any]) -> str:
    m, st = res["machine"], res["settings"]
    lines = [
        "# nemo-convert import / reshard / quantize benchmark",
        "",
        f"- date: {m['date']}; commit {m['nemo_convert_commit']}; nemo_convert from {m.get('nemo_convert_from', '?')}",
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
        ("- **whole command** cases (`import-cli`: `python -m nemo_convert import SRC -o OUT -q`; "
         "`import-2proc`: `python -m torch.distributed.run --standalone --nproc-per-node 2 -m nemo_convert "
         "import SRC -o OUT -q`): time = the command's wall, start to exit (interpreter start, imports, "
         "torchrun rendezvous and teardown included); CPU = the command's and every worker's; peak private "
         "= the peak of the *sum* over the process tree (launcher + workers, sampled together)"),
        ("- private − baseline: minus the torch + nemo_convert.api interpreter for (b), (d), (e), minus the "
         "torch + transformers interpreter for (c); the copy imports neither; not given for a process "
         "tree (see the per-process table)"),
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
            extra = ("–" if r["case"].startswith("copy") or r["case"] == "import-2proc" or not base
                     else _mib(r["peak_private"] - base["peak_private"]))
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
            for target in _met(k, v["median"]):
                lines.append(f"| {s['model_bytes'] / 1e9:.2f} GB | {_mib(s['largest_tensor_bytes'])} | {k} "
                             f"| {v['median']:.2f} | {v['best']:.2f} | {cpu} | {target} |")
    if res.get("cross_size"):
        lines += [
            "",
            "Across sizes: private memory above the baseline at the larger model over the smaller one.",
            "",
            "| case | smaller (MiB) | larger (MiB) | ratio | model grew | target |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for k, v in res["cross_size"].items():
            targets = _met(k, v["ratio"])
            if k in TARGETS and v["large"] - v["small"] < FLAT_NOISE_BYTES:  # a few MiB more is not growth
                targets = [f"grew < {FLAT_NOISE_BYTES // MiB} MiB (reshard issue: flat): met"]
            for target in targets:
                lines.append(f"| {k} | {_mib(v['small'])} | {_mib(v['large'])} | {v['ratio']:.2f} "
                             f"| {v['model_ratio']:.2f}× | {target} |")
    trees = [(s, r) for s in res["sizes"] for r in s["rows"] if r.get("processes")]
    if trees:
        lines += [
            "",
            ("Process trees (whole-command cases): each process's own peak, from the run with the largest "
             "sum; the peaks need not coincide, so they may add up to more than the tree's peak."),
            "",
            ("| model | case | process | alive (s from start) | peak private (MiB) | private − baseline (MiB) "
             "| peak RSS (MiB) |"),
            "|---|---|---|---|---:|---:|---:|",
        ]
        for s, r in trees:
            for p in r["processes"]:
                cmd = p["cmd"].replace("|", "\\|")
                cmd = cmd if len(cmd) <= 90 else cmd[:87] + "…"
                alive = f"{p['first_seen']:.1f}–{p['last_seen']:.1f}" if "first_seen" in p else "–"
                lines.append(f"| {s['model_bytes'] / 1e9:.2f} GB | {r['case']} | `{cmd}` | {alive} | {_mib(p['peak_private'])} "
                             f"| {_mib(p['peak_private'] - res['baseline']['peak_private'])} | {_mib(p['peak_rss'])} |")
    return "\n".join(lines) + "\n"


# ============================================================================ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.75,1.5", help="model sizes in GB (1e9 bytes), comma-separated")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out", "work"),
                    help="where checkpoints and outputs are written (needs ~5× the largest size free "
                         "with every case, ~2.5× with copy/import/naive only)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the generated checkpoints (reused by the next run) and the last outputs")
    ap.add_argument("--cases", default=",".join(ALL_CASES), help=f"comma-separated subset of {','.join(ALL_CASES)}")
    ap.add_argument("--largest-only", default=",".join(LARGEST_ONLY),
                    help="cases run at the largest size only ('' = every size)")
    ap.add_argument("--repeat", type=int, default=1, help="measured runs per case (after one warm-up run)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up run (report the first run)")
    ap.add_argument("--no-verify", action="store_true", help="skip the bit-exact spot checks of the outputs")
    ap.add_argument("--interval", type=float, default=0.02, help="memory sampling interval in seconds")
    ap.add_argument("--results", default=os.path.join(HERE, "out"), help="folder for results.md / results.json")
    ap.add_argument("--snapshot", metavar="REV",
                    help="measure the code of git revision REV (e.g. HEAD), copied with `git archive` into the "
                         "workdir, instead of the working tree (which others may be editing)")
    ap.add_argument("--paired", action="store_true",
                    help="precede every measured run of an import/reshard/quantize case with a streaming copy "
                         "and report the median of the per-run ratios too (robust to load swings)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_src", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    ap.add_argument("--_generate", help=argparse.SUPPRESS)
    ap.add_argument("--_verify", help=argparse.SUPPRESS)
    ap.add_argument("--_layers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_qnemo", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return child_main(args._child, args._src, args._out, args._result)
    if args._generate:
        generate(args._generate, args._layers)
        return 0
    if args._verify:
        print(verify_qnemo(args._src, args._verify, args._layers, args._qnemo) if args._qnemo
              else verify(args._src, args._verify, args._layers))
        return 0

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    largest_only = {c.strip() for c in args.largest_only.split(",") if c.strip()}
    bad = [c for c in cases if c not in ALL_CASES]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}")
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    if args.snapshot:
        global CODE
        CODE = snapshot(args.snapshot, work)
    os.makedirs(args.results, exist_ok=True)

    res: dict[str, Any] = {
        "machine": machine_info(work),
        "settings": {"sizes_gb": sizes, "cases": cases, "largest_only": sorted(largest_only),
                     "repeat": args.repeat, "interval": args.interval,
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
        here = [c for c in cases if c not in largest_only or size == max(sizes)]
        # outputs that later cases of this size reuse: the dist .nemo and the TP2 one (reshard
        # inputs), the 1-process CLI output (compared byte for byte with the 2-process one)
        paths = {k: os.path.join(work, f"in-{layers}L-{k}.nemo") for k in ("dist", "tp2", "cli")}
        for k in paths.values():
            _rm(k)
        for i, case in enumerate(here):
            later = here[i + 1:]
            wanted = {RESHARD[c][0] for c in later if c in RESHARD} | ({"cli"} if "import-2proc" in later else set())
            kind = PRODUCES.get(case)
            keep_as = paths[kind] if kind in wanted and not os.path.exists(paths[kind]) else None
            suffix = ".safetensors" if case.startswith("copy") else ".qnemo" if case.startswith("quantize-") else ".nemo"
            out = os.path.join(work, f"out-{layers}L-{case}{suffix}")
            run_src = ensure_input(RESHARD[case][0], src, paths, work, log) if case in RESHARD else src
            row = measure(case, run_src, out, work, args, verify_layers=layers, verify_src=src, keep_as=keep_as,
                          same_as=paths["cli"] if case == "import-2proc" else None,
                          pair_with_copy=src if args.paired and case in PAIRABLE else None)
            log(f"  {case:14s} {row['op_seconds']:7.2f} s  private {_mib(row['peak_private'])} MiB  "
                f"rss {_mib(row['peak_rss'])} MiB  {row.get('verify', '')}")
            entry["rows"].append(row)
        entry["ratios"] = ratios(entry, res["baseline"], res.get("baseline-hf"))
        res["sizes"].append(entry)
        for k in paths.values():
            _rm(k)
        if not args.keep:
            _rm(src)

    rows = [res["baseline"], *(r for sz in res["sizes"] for r in sz["rows"])]
    res["max_rollup_delta"] = max(r["max_rollup_delta"] for r in rows)
    res["cross_size"] = cross_size(res)
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
        if CODE:
            _rm(CODE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
