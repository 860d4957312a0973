"""``nemo-convert demo``: the whole round trip on a generated tiny Llama, checked."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, Callable

from nemo_convert.cli.common import common_flags, print_json
from nemo_convert.errors import InputError

#: What the demo writes into its work folder (and the staging names of those).
DEMO_FILES = re.compile(r"^\.?(tiny-llama-hf|tiny-llama-hf-back|tiny-llama\.nemo|tiny-llama-tp\d+-pp\d+\.nemo|"
                        r"tiny-llama-from-ckpt\.nemo|checkpoints)(\.nemo-convert-.+)?$")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="generate a tiny Llama, import it, export it back, and check both",
                       description="Generate a tiny random Llama (GQA) with transformers, import it into a "
                                   ".nemo, export it back to HF, and check the tensors are bit-identical and "
                                   "the logits equal. Nothing is downloaded.")
    p.add_argument("--workdir", help="where to write the files, kept afterwards: a new or empty folder, or one "
                                     "an earlier demo wrote (default: a temporary folder, removed at the end)")
    p.add_argument("--tp", type=int, default=1, help="also reshard the .nemo to this TP (legacy layout)")
    p.add_argument("--pp", type=int, default=1, help="also reshard the .nemo to this PP (legacy layout)")
    p.add_argument("--from-ckpt", action="store_true",
                   help="also try from-ckpt: write the tiny model as a Lightning-style training checkpoint "
                        "(.ckpt with optimizer state and the model config), convert it with from-ckpt, and "
                        "export and check that .nemo instead")
    common_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tempfile

    from rich.console import Console

    from transformers.utils import logging as hf_logging  # lazy: CLI start-up time (transformers)

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    say = Console(stderr=True, quiet=args.quiet or args.json, soft_wrap=True, highlight=False).print
    if args.workdir:
        check_workdir(args.workdir)
        os.makedirs(args.workdir, exist_ok=True)
        return _round_trip(args, args.workdir, say)
    with tempfile.TemporaryDirectory(prefix="nemo-convert-demo-") as work:  # removed however the demo ends
        code = _round_trip(args, work, say)
    say(f"removed {work} (pass --workdir to keep the files)")
    return code


def check_workdir(path: str) -> None:
    """Refuse a ``--workdir`` that holds anything but what a demo writes: the demo must not
    write its files into a user's model folder (or replace what is there)."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise InputError(f"--workdir {path}: not a folder")
    other = sorted(n + ("/" if os.path.isdir(os.path.join(path, n)) else "") for n in os.listdir(path)
                   if not DEMO_FILES.match(n))
    if other:
        shown = ", ".join(other[:6]) + (f" and {len(other) - 6} more" if len(other) > 6 else "")
        raise InputError(f"--workdir {path}: holds files that are not the demo's ({shown}); the demo writes "
                         "tiny-llama-hf/, tiny-llama.nemo and more into it: name a new or empty folder")


def _round_trip(args: argparse.Namespace, work: str, say: Callable[..., None]) -> int:
    import torch  # lazy: CLI start-up time (torch)
    from transformers import AutoModelForCausalLM  # lazy: CLI start-up time (transformers)

    from nemo_convert import api  # lazy: CLI start-up time
    from nemo_convert.examples import make_tiny_llama  # lazy: CLI start-up time
    from nemo_convert.formats.hf.hf import open_hf_weights  # lazy: CLI start-up time

    # With --from-ckpt the vocabulary is the tokenizer's (300), as in a training run's model: from-ckpt
    # takes the true vocabulary size from tokenizer.model and drops the padding rows beyond it.
    vocab: dict[str, Any] = {"vocab_size": 300} if args.from_ckpt else {}
    src = make_tiny_llama(os.path.join(work, "tiny-llama-hf"), num_hidden_layers=4, num_key_value_heads=2, **vocab)
    say(f"generated {src}")
    nemo = os.path.join(work, "tiny-llama.nemo")
    rep = api.import_hf(src, nemo, overwrite=True)
    say(f"imported → {nemo} ({rep.tensors} tensors, layout {rep.layout})")
    if args.from_ckpt:
        nemo = _through_a_training_checkpoint(nemo, src, work, say)
    if args.tp > 1 or args.pp > 1:
        resharded = os.path.join(work, f"tiny-llama-tp{args.tp}-pp{args.pp}.nemo")
        api.reshard(nemo, resharded, tp=args.tp, pp=args.pp, layout="legacy", overwrite=True)
        say(f"resharded → {resharded}")
        nemo = resharded
    back = os.path.join(work, "tiny-llama-hf-back")
    api.export_hf(nemo, back, overwrite=True)
    say(f"exported → {back}")
    a, b = open_hf_weights(src), open_hf_weights(back)
    try:
        same = set(a.keys()) == set(b.keys()) and all(torch.equal(a.load(k), b.load(k)) for k in a.keys())
    finally:
        a.close()
        b.close()
    ids = torch.tensor([[1, 5, 9, 33, 2, 77, 100, 3]])
    with torch.no_grad():
        la = AutoModelForCausalLM.from_pretrained(src).eval()(ids).logits
        lb = AutoModelForCausalLM.from_pretrained(back).eval()(ids).logits
    logits_equal = torch.equal(la, lb)
    result = {"workdir": work, "kept": bool(args.workdir), "nemo": nemo, "from_ckpt": bool(args.from_ckpt),
              "tensors_identical": same, "logits_identical": logits_equal}
    if args.json:
        print_json(result)
    else:
        say(f"tensors bit-identical: {same}; logits identical: {logits_equal}")
    return 0 if same and logits_equal else 1


def _through_a_training_checkpoint(nemo: str, src: str, work: str, say: Callable[..., None]) -> str:
    """Write ``nemo``'s weights and config as a training run's ``.ckpt`` (config without our
    own section, tokenizer beside it, as a run has them), convert it with ``from_ckpt``,
    and return the new ``.nemo``."""
    import copy
    import shutil

    from nemo_convert import api  # lazy: CLI start-up time
    from nemo_convert.convert.common import SECTION  # lazy: CLI start-up time
    from nemo_convert.examples import write_training_checkpoint  # lazy: CLI start-up time

    with api.open_checkpoint(nemo) as ck:
        weights = {k: ck.source.load(k) for k in ck.source.keys()}
        cfg = copy.deepcopy(ck.config)
    cfg.pop(SECTION, None)
    cfg["tokenizer"] = dict(cfg.get("tokenizer") or {}, library="sentencepiece", model="tokenizer.model")
    folder = os.path.join(work, "checkpoints")
    ckpt = write_training_checkpoint(os.path.join(folder, "megatron_gpt--step=1-last.ckpt"), weights, cfg)
    shutil.copyfile(os.path.join(src, "tokenizer.model"), os.path.join(folder, "tokenizer.model"))
    say(f"wrote the training checkpoint {ckpt} (weights, Adam state, model config)")
    out = os.path.join(work, "tiny-llama-from-ckpt.nemo")
    rep = api.from_ckpt(ckpt, out, overwrite=True)
    say(f"from-ckpt → {out} ({rep.tensors} tensors, layout {rep.layout}; dropped {rep.dropped_tensors} "
        "training-state tensors)")
    return out
