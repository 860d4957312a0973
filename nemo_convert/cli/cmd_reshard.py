"""``nemo-convert reshard``: change tensor/pipeline parallelism or the weights layout."""

from __future__ import annotations

import argparse

from nemo_convert.cli.cmd_convert import (
    _warn_trust,
    add_iteration_flag,
    add_parallel_flags,
    add_target_flag,
    parallelism,
)
from nemo_convert.cli.common import common_flags, device_flag, finite_flag, output_flags, report
from nemo_convert.cli.progress import make_progress


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("reshard", help="change the TP/PP or weights layout of a .nemo",
                       description="Rewrite a .nemo (any layout and TP/PP, or a NeMo 2.0 folder) with another "
                                   "tensor/pipeline parallelism and/or weights layout, streaming one tensor at "
                                   "a time. Converting between the dist and legacy layouts is a reshard too; "
                                   "so is the migration to Megatron-Bridge (--to megatron-bridge) from any "
                                   ".nemo, NeMo 2.0 folder or Megatron-LM checkpoint directory, and --to hf "
                                   "writes any of them as a Hugging Face folder, as export does.")
    p.add_argument("src", help=".nemo file, unpacked .nemo folder, NeMo 2.0 checkpoint folder, or "
                               "Megatron-Bridge / Megatron-LM checkpoint directory")
    p.add_argument("-o", "--output", required=True, help="the .nemo (or Megatron-Bridge directory, HF folder) to write")
    add_target_flag(p)
    add_iteration_flag(p)
    add_parallel_flags(p)
    p.add_argument("--layout", choices=["dist", "legacy"], help="weights layout (default: the input's)")
    p.add_argument("--family", help="model family (default: from the config)")
    p.add_argument("--unpacked", action="store_true", help="write the unpacked folder form instead of a tar")
    output_flags(p)
    finite_flag(p)
    device_flag(p, what="the TP splits that build new tensors (gated fc1, vocabulary padding; a reshard's "
                        "copies stay on the CPU)")
    common_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nemo_convert import api  # lazy: CLI start-up time

    _warn_trust(args)
    par = parallelism(args)
    rep = api.reshard(args.src, args.output, tp=par.tp, pp=par.pp, ep=par.ep, stage_layers=par.stage_layers,
                      layout=args.layout, overwrite=args.overwrite, packed=not args.unpacked, family=args.family,
                      progress=make_progress(args), trust_pickle=args.trust_pickle,
                      check_finite=args.check_finite, device=args.device, workers=args.workers, to=args.to,
                      iteration=args.iteration)
    report(args, rep, "wrote")
    return 0
