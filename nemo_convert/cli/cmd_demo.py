"""``nemo-convert demo``: the whole round trip on a generated tiny Llama, checked."""

from __future__ import annotations

import argparse
import os
import tempfile

from rich.console import Console

from nemo_convert.cli.common import common_flags, print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="generate a tiny Llama, import it, export it back, and check both",
                       description="Generate a tiny random Llama (GQA) with transformers, import it into a "
                                   ".nemo, export it back to HF, and check the tensors are bit-identical and "
                                   "the logits equal. Nothing is downloaded.")
    p.add_argument("--workdir", help="where to write the files (default: a temporary folder)")
    p.add_argument("--tp", type=int, default=1, help="also reshard the .nemo to this TP (legacy layout)")
    p.add_argument("--pp", type=int, default=1, help="also reshard the .nemo to this PP (legacy layout)")
    common_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from nemo_convert import api
    from nemo_convert.examples import make_tiny_llama
    from nemo_convert.formats.hf import open_hf_weights

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    work = args.workdir or tempfile.mkdtemp(prefix="nemo-convert-demo-")
    os.makedirs(work, exist_ok=True)
    say = Console(stderr=True, quiet=args.quiet or args.json, soft_wrap=True, highlight=False).print
    src = make_tiny_llama(os.path.join(work, "tiny-llama-hf"), num_hidden_layers=4, num_key_value_heads=2)
    say(f"generated {src}")
    nemo = os.path.join(work, "tiny-llama.nemo")
    rep = api.import_hf(src, nemo, overwrite=True)
    say(f"imported → {nemo} ({rep.tensors} tensors, layout {rep.layout})")
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
    result = {"workdir": work, "nemo": nemo, "tensors_identical": same, "logits_identical": logits_equal}
    if args.json:
        print_json(result)
    else:
        say(f"tensors bit-identical: {same}; logits identical: {logits_equal}")
    return 0 if same and logits_equal else 1
