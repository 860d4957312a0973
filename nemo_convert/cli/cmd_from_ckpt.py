"""``nemo-convert from-ckpt``: a PyTorch Lightning training checkpoint → ``.nemo``."""

from __future__ import annotations

import argparse

from nemo_convert.cli.common import common_flags, human_bytes, print_json, warn
from nemo_convert.cli.progress import make_progress
from nemo_convert.errors import NemoConvertError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "from-ckpt", help="convert a Lightning training checkpoint (.ckpt, per-rank, dist) into a .nemo",
        description="Convert a PyTorch Lightning / NeMo training checkpoint into a .nemo: one .ckpt file, "
                    "a folder of per-rank files (mp_rank_XX/ or tp_rank_XX_pp_rank_YYY/), or a distributed "
                    "(torch_dist) checkpoint folder. The model config comes from the checkpoint's "
                    "hyper-parameters or --hparams; optimizer and other training state is dropped (and "
                    "sized in the summary). Nothing the checkpoint pickled is executed.")
    p.add_argument("src", help=".ckpt file, folder of rank folders, dist checkpoint folder, or a checkpoints "
                               "folder holding one of those")
    p.add_argument("-o", "--output", required=True, help="the .nemo (or Megatron-Bridge directory, HF folder) to write")
    # choices: the installed output targets, set once the plugins are loaded (plugin_options.py)
    p.add_argument("--to", default="nemo",
                   help="what to write: a .nemo (default), a Megatron-Bridge checkpoint directory or a "
                        "Hugging Face folder (hf: the training checkpoint straight to transformers); trtllm (a "
                        ".qnemo) is written by quantize, which takes --algo")
    p.add_argument("--hparams", metavar="FILE.yaml",
                   help="Lightning hparams.yaml whose 'cfg:' section is the model config (default: the "
                        "checkpoint's hyper_parameters)")
    p.add_argument("--family", help="model family (default: from the config's target)")
    p.add_argument("--checkpoint-name", metavar="NAME",
                   help="which checkpoint, when the folder (or its rank folders) holds several")
    p.add_argument("--tp", type=int, metavar="N",
                   help="output tensor-parallel size (default: 1 for the dist layout, the source's for legacy)")
    p.add_argument("--pp", type=int, metavar="M",
                   help="output pipeline-parallel size (default: 1 for the dist layout, the source's for legacy)")
    p.add_argument("--stage-layers", metavar="N,N,…", help="explicit layers per output pipeline stage")
    p.add_argument("--layout", choices=["dist", "legacy"],
                   help="weights layout (default: dist for mcore_gpt configs, legacy for mcore_gpt: false)")
    p.add_argument("--vocab-size", type=int, metavar="V",
                   help="the true vocabulary size, when neither the config nor tokenizer.model tells it")
    p.add_argument("--allow-missing-tokenizer", action="store_true",
                   help="warn instead of failing when a tokenizer file the config names is not found")
    p.add_argument("--unpacked", action="store_true", help="write the unpacked folder form instead of a tar")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUTPUT if it is an output of the kind written (or an empty folder); anything else "
                        "is refused")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow pickles to load classes outside the allow-list, which can run arbitrary code "
                        "(DANGEROUS; only for checkpoints you trust)")
    common_flags(p)
    p.set_defaults(func=run)


def _stages(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise NemoConvertError(f"--stage-layers {text!r}: expected integers like 4,4") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from nemo_convert import api  # lazy: CLI start-up time

    if args.trust_pickle:
        warn(args, "--trust-pickle: pickled files in this checkpoint may now run arbitrary code on this "
                   "machine; use it only for checkpoints you trust")
    rep = api.from_ckpt(args.src, args.output, hparams=args.hparams, family=args.family,
                        checkpoint_name=args.checkpoint_name, tp=args.tp, pp=args.pp,
                        stage_layers=_stages(args.stage_layers), layout=args.layout, vocab_size=args.vocab_size,
                        allow_missing_tokenizer=args.allow_missing_tokenizer, overwrite=args.overwrite,
                        packed=not args.unpacked, trust_pickle=args.trust_pickle, progress=make_progress(args),
                        to=args.to)
    for w in rep.warnings:
        warn(args, w)
    if args.json:
        print_json(rep.as_dict())
    elif not args.quiet:
        rate = rep.bytes / rep.seconds / 1024**2 if rep.seconds > 0 else 0.0
        sections = ", ".join(f"{k} {v['tensors']} tensors/{human_bytes(v['bytes'])}"
                             for k, v in rep.dropped_sections.items() if v["tensors"])
        Console(stderr=True, soft_wrap=True).print(
            f"wrote {rep.output}: {rep.tensors} tensors, {human_bytes(rep.bytes)} in {rep.seconds:.2f} s "
            f"({rate:.0f} MiB/s), family {rep.family}, layout {rep.layout}, TP={rep.tp} PP={rep.pp}; "
            f"from {rep.source_kind} TP={rep.source_tp} PP={rep.source_pp}; dropped training state: "
            f"{rep.dropped_tensors} tensors, {human_bytes(rep.dropped_bytes)}"
            + (f" ({sections})" if sections else "")
            + (f"; {len(rep.dropped)} non-weight model entries" if rep.dropped else ""), highlight=False)
    return 0
