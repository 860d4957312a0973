"""``nemo-convert inspect``: format, config summary and tensor table of any checkpoint."""

from __future__ import annotations

import argparse

from nemo_convert.cli.common import QUIET_RESULT_HELP, common_flags, hf_source, human_bytes, print_json, revision_flag

def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("inspect", help="show format, config summary and tensors of a checkpoint",
                       description="Show a checkpoint's format, config summary and tensor table (name, "
                                   "shape, dtype, bytes) without reading tensor data. Works on HF folders "
                                   "and .nemo files alike, NeMo 2.0 folders, .qnemo folders, and Megatron-Bridge / "
                                   "Megatron-LM checkpoint directories (it says which kind).")
    p.add_argument("path", help="HF folder (or a hub id, org/name, already in the local hub cache), .nemo file or "
                                "unpacked .nemo folder, NeMo 2.0 folder, .qnemo folder, or Megatron-Bridge / "
                                "Megatron-LM checkpoint directory")
    revision_flag(p)
    p.add_argument("--iteration", type=int, metavar="N",
                   help="Megatron-Bridge / Megatron-LM directory: read iter_N (default: the tracker's)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow arbitrary code in pickled files (DANGEROUS)")
    common_flags(p, quiet_help=QUIET_RESULT_HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The readers' module, not nemo_convert.api (which loads every conversion): inspect loads no torch.
    from nemo_convert.convert.checkpoint import inspect_checkpoint  # lazy: CLI start-up time

    info = inspect_checkpoint(hf_source(args, args.path), trust_pickle=args.trust_pickle, iteration=args.iteration)
    if args.json:
        print_json(info)
        return 0
    if args.quiet:  # exit 0: the checkpoint could be read (2, with an error line, when not)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    layout = f" ({info['layout']} layout{', ' + info['backend'] if info.get('backend') else ''})" \
        if info["layout"] else ""
    if info["format"] == "qnemo":  # a TensorRT-LLM checkpoint names its TensorRT-LLM model, not our family
        ranks = len(info.get("ranks") or [])
        what = (f"TensorRT-LLM checkpoint, architecture {info['config'].get('architecture', 'unknown')}, "
                f"{ranks} rank file{'s' if ranks != 1 else ''}")
    else:
        what = f"family {info['family'] or 'unknown'}"
    console.print(f"[bold]{info['path']}[/]: {info['format']}{layout}, {what}, "
                  f"{info['num_tensors']} tensors, {human_bytes(info['total_bytes'])}", highlight=False)
    if info.get("iteration_dir"):
        console.print(f"  iteration folder: {info['iteration_dir']}", highlight=False)
    for line in info.get("notes") or []:
        console.print(f"  note: {line}", highlight=False)
    for k, v in info["config"].items():
        console.print(f"  {k}: {v}", highlight=False)
    for r in info.get("ranks", []):
        console.print(f"  {r['file']}: {r['tensors']} tensors, {human_bytes(r['bytes'])}", highlight=False)
    table = Table("name", "shape", "dtype", "bytes")
    for t in info["tensors"]:
        table.add_row(t["name"], "×".join(map(str, t["shape"])) or "scalar", t["dtype"], human_bytes(t["bytes"]))
    console.print(table)
    return 0
