"""Hashes of every output the family matrix produces, for refactors that must not change
a byte (not a test: a tool the lead and the refactoring branches run before and after).

For every family of ``tests/test_family_matrix.py`` (and the multimodal CLIP / LLaVA), a
tiny random HF model (the matrix's own builder, seeded) goes through:

* ``import`` → ``.nemo`` in the dist layout and in the legacy layout at TP2×PP2, unpacked
  (a folder: every file hashed; a tar's bytes would hash the same);
* ``export`` of the dist ``.nemo`` → HF folder;
* ``reshard`` of the dist ``.nemo`` → dist at TP2 (EP2 for MoE families; folder);
* ``import --to megatron-bridge`` → directory;
* ``quantize`` (``none`` and ``int8_wo``) → ``.qnemo`` folder;

and each output's files are hashed (sha256 of the bytes, by relative path). A step that
is refused records the refusal's message instead, so a refusal that changes shows too.

    python tests/output_hashes.py OUT.json            # write the hashes of this checkout
    python tests/output_hashes.py OUT.json --compare BEFORE.json   # and list what differs

Run it from a checkout whose package is installed (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_family_matrix import FAMILIES, MOE, make_model  # noqa: E402
from tiny_multimodal import make_tiny_clip, make_tiny_llava  # noqa: E402

from nemo_convert import api  # noqa: E402
from nemo_convert.errors import NemoConvertError  # noqa: E402


def tree_hashes(path: str) -> dict[str, str]:
    """sha256 of every file below ``path`` (or of ``path`` itself), by relative path."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {".": hashlib.sha256(f.read()).hexdigest()}
    out: dict[str, str] = {}
    for folder, _, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return dict(sorted(out.items()))


def step(results: dict[str, Any], key: str, out: str, run: Callable[[], Any]) -> bool:
    try:
        run()
    except NemoConvertError as exc:
        results[key] = {"refused": f"{type(exc).__name__}: {exc}"}
        return False
    results[key] = tree_hashes(out)
    return True


def family_outputs(work: str, name: str, src: str, moe: bool) -> dict[str, Any]:
    r: dict[str, Any] = {}
    d = os.path.join(work, name)
    dist = os.path.join(d, "dist.nemo")
    if step(r, "import-dist", dist, lambda: api.import_hf(src, dist, packed=False)):
        hf = os.path.join(d, "hf")
        step(r, "export", hf, lambda: api.export_hf(dist, hf))
        tp2 = os.path.join(d, "tp2.nemo")
        step(r, "reshard-tp2", tp2, lambda: api.reshard(dist, tp2, tp=2, ep=2 if moe else 1, packed=False))
        for algo in ("none", "int8_wo"):
            q = os.path.join(d, f"{algo}.qnemo")
            step(r, f"quantize-{algo}", q, lambda algo=algo, q=q: api.quantize(dist, q, algo=algo, dtype="bf16"))
    par = api.Parallelism(2, 2)
    legacy = os.path.join(d, "legacy.nemo")
    step(r, "import-legacy-tp2pp2", legacy,
         lambda: api.import_hf(src, legacy, layout="legacy", packed=False, parallel=par))
    mb = os.path.join(d, "mb")
    step(r, "import-megatron-bridge", mb, lambda: api.import_hf(src, mb, to="megatron-bridge"))
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--compare", help="an earlier run's JSON: list the outputs that differ")
    p.add_argument("--families", nargs="*", help="only these (default: every family, llama without biases "
                   "(quantize takes it), clip and llava)")
    p.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "out",
                                                  "hash-work"),
                   help="scratch folder (emptied first; a fixed path, since configs record the source's path)")
    args = p.parse_args()
    names = args.families or [*FAMILIES, "llama-plain", "clip", "llava"]
    results: dict[str, Any] = {}
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        for name in names:
            src = os.path.join(work, f"src-{name}")
            if name == "clip":
                make_tiny_clip(src)
            elif name == "llava":
                make_tiny_llava(src)
            elif name == "llama-plain":
                make_model(src, "llama", attention_bias=False, mlp_bias=False)
            else:
                make_model(src, name)
            results[name] = family_outputs(work, name, src, name in MOE)
            print(name, {k: ("refused" if "refused" in v else f"{len(v)} files") for k, v in results[name].items()},
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    if not args.compare:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    differ = [f"{fam}/{k}" for fam in sorted(set(before) | set(results))
              for k in sorted(set(before.get(fam, {})) | set(results.get(fam, {})))
              if before.get(fam, {}).get(k) != results.get(fam, {}).get(k)]
    print("identical" if not differ else "differ: " + ", ".join(differ))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
