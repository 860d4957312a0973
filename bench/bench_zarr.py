"""Export of a zarr ``.nemo`` against the same weights saved as torch_dist, both by Megatron-Core.

One random Llama-shaped model (``--layers``/``--hidden``/…, bf16 by default) is saved twice at
``--tp`` ranks through ``tests/data/zarr/make_fixtures.py``'s worker: by megatron-core 0.13.1
with ``sharded_strategy=("zarr", 1)`` (the second venv, ``--mcore-python``), and by the
project venv's megatron-core 0.16.1 with its default ``torch_dist`` (0.13.1's torch_dist
saver hangs on this CPU machine in its asynchronous file writer). Both are packed as
``.nemo`` tars with the same config, and
``nemo-convert export`` runs on each in a fresh process (page cache warm: one unmeasured run
first). Reported: the export's own time (best of ``--repeat``) and its peak private memory over
the interpreter floor (``bench/memory.py``), and the time ratio::

    python bench/bench_zarr.py --mcore-python /work/venv-mcore013/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "data", "zarr"))

import make_fixtures  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "bench"))
from memory import run_measured  # noqa: E402


def _save(mcore_python: str, job: str, backend: str, shape: dict[str, int], vocab: int, tp: int,
          dtype: str) -> str:
    with open(os.path.join(job, "job.json"), "w") as f:
        json.dump({"family": "llama", "dtype": dtype, "padded": vocab, "shape": shape, "backend": backend}, f)
    python = mcore_python if backend == "zarr" else sys.executable
    procs = [subprocess.Popen([python, make_fixtures.__file__, "--worker", job, str(r), str(tp)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(tp)]
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"{backend}: worker failed\n{out[-2000:]}\n{err[-4000:]}")
    return os.path.join(job, "model_weights")


def _pack(weights: str, cfg: dict, path: str) -> str:
    import yaml

    folder = os.path.dirname(weights)
    with open(os.path.join(folder, "model_config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    with tarfile.open(path, "w:") as tar:
        tar.add(os.path.join(folder, "model_config.yaml"), arcname="./model_config.yaml")
        tar.add(weights, arcname="./model_weights")
    return path


_CHILD = """
import json, sys
from nemo_convert import api
if sys.argv[1] != "-":
    rep = api.export_hf(sys.argv[1], sys.argv[2])
    with open(sys.argv[3], "w") as f:
        json.dump({"seconds": rep.seconds}, f)
"""


def _export(nemo: str, out: str) -> tuple[float, int]:
    """The export's own seconds (interpreter start excluded) and peak private memory (bytes,
    anonymous pages: bench/memory.py), in a fresh process; ``nemo="-"``: the interpreter floor."""
    shutil.rmtree(out, ignore_errors=True)
    result = os.path.join(os.path.dirname(out), "result.json")
    run = run_measured([sys.executable, "-c", _CHILD, nemo, out, result], result_path=result, cwd=REPO)
    if run.returncode != 0:
        raise SystemExit(f"export of {nemo} failed: {run.stderr_tail}")
    return float(run.result.get("seconds", 0.0)), run.memory.peak_private


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mcore-python", help="a venv's python with megatron-core 0.13.1, zarr 2.18, tensorstore "
                    "(tests/data/zarr/README.md); not needed with --reuse")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default=os.path.join(REPO, "bench", "out", "zarr"))
    ap.add_argument("--reuse", action="store_true", help="measure the .nemo files an earlier run left in --workdir")
    args = ap.parse_args()

    import torch

    shape = dict(hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
                 num_attention_heads=args.heads, num_key_value_heads=args.groups, max_position_embeddings=4096)
    d = args.hidden // args.heads
    g = torch.Generator().manual_seed(0)

    def rnd(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g) * 0.02

    hf = {"model.embed_tokens.weight": rnd(args.vocab, args.hidden), "model.norm.weight": rnd(args.hidden),
          "lm_head.weight": rnd(args.vocab, args.hidden)}
    for i in range(args.layers):
        p = f"model.layers.{i}."
        hf.update({p + "self_attn.q_proj.weight": rnd(args.heads * d, args.hidden),
                   p + "self_attn.k_proj.weight": rnd(args.groups * d, args.hidden),
                   p + "self_attn.v_proj.weight": rnd(args.groups * d, args.hidden),
                   p + "self_attn.o_proj.weight": rnd(args.hidden, args.heads * d),
                   p + "mlp.gate_proj.weight": rnd(args.ffn, args.hidden),
                   p + "mlp.up_proj.weight": rnd(args.ffn, args.hidden),
                   p + "mlp.down_proj.weight": rnd(args.hidden, args.ffn),
                   p + "input_layernorm.weight": rnd(args.hidden), p + "post_attention_layernorm.weight": rnd(args.hidden)})
    nemos = {b: os.path.join(args.workdir, f"{b}.nemo") for b in ("zarr", "torch_dist")}
    nbytes = sum(t.numel() * t.element_size() for t in hf.values()) * (2 if args.dtype == "bfloat16" else 4) // 4
    if not args.reuse:
        if not args.mcore_python:
            ap.error("--mcore-python is required (unless --reuse)")
        shutil.rmtree(args.workdir, ignore_errors=True)
        os.makedirs(args.workdir)
        dtype = getattr(torch, args.dtype)
        weights = make_fixtures.megatron_global("llama", hf, args.vocab, dtype, shape)
        cfg = make_fixtures.nemo_config("llama", args.vocab, args.tp, args.dtype, "", shape)
        del cfg["tokenizer"]
        for backend in ("zarr", "torch_dist"):
            job = os.path.join(args.workdir, backend)
            os.makedirs(job)
            torch.save(weights, os.path.join(job, "global.pt"))
            saved = _save(args.mcore_python, job, backend, shape, args.vocab, args.tp, args.dtype)
            os.remove(os.path.join(job, "global.pt"))
            _pack(saved, cfg, nemos[backend])
            shutil.rmtree(saved)
        del weights
    del hf
    results = {}
    floor = max(_export("-", os.path.join(args.workdir, "hf"))[1] for _ in range(2))
    for backend, nemo in nemos.items():
        _export(nemo, os.path.join(args.workdir, "hf"))  # warm the page cache
        runs = [_export(nemo, os.path.join(args.workdir, "hf")) for _ in range(args.repeat)]
        results[backend] = (min(r[0] for r in runs), max(r[1] for r in runs) - floor)
    shutil.rmtree(os.path.join(args.workdir, "hf"), ignore_errors=True)
    print(f"model: {args.layers} layers, hidden {args.hidden}, ffn {args.ffn}, vocab {args.vocab}, {args.dtype}, "
          f"saved at TP={args.tp}: {nbytes / 1e9:.2f} GB")
    print("| backend | export (best of %d) | peak private memory over the interpreter floor |" % args.repeat)
    print("|---|---|---|")
    for backend, (wall, rss) in results.items():
        print(f"| {backend} | {wall:.2f} s ({nbytes / wall / 1e6:.0f} MB/s) | {rss / 2**20:.1f} MiB |")
    print(f"ratio zarr / torch_dist: {results['zarr'][0] / results['torch_dist'][0]:.2f}× time")


if __name__ == "__main__":
    main()
