"""``nemo-convert import`` and ``nemo-convert export``."""

from __future__ import annotations

import argparse

from nemo_convert.cli.common import (common_flags, device_flag, finite_flag, hf_source, output_flags, report,
                                     revision_flag, warn)
from nemo_convert.cli.plugin_options import plugin_option_values
from nemo_convert.cli.progress import make_progress
from nemo_convert.errors import NemoConvertError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("import", help="convert a Hugging Face model folder into a .nemo",
                       description="Convert a Hugging Face model folder (config.json + safetensors or "
                                   "pytorch_model*.bin + tokenizer) into a NeMo .nemo archive.")
    p.add_argument("src", help="Hugging Face model folder, or a hub id (org/name) already in the local hub cache")
    p.add_argument("-o", "--output", required=True, help="the .nemo file (or Megatron-Bridge directory) to write")
    add_target_flag(p)
    revision_flag(p)
    p.add_argument("--family", help="model family (default: detected from config.json)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="cast floating tensors (default: keep)")
    p.add_argument("--layout", choices=["dist", "legacy"],
                   help="weights layout: Megatron-Core distributed checkpoint (dist, default for GPT) or "
                        "one model_weights.ckpt (legacy)")
    add_parallel_flags(p)
    p.add_argument("--unpacked", action="store_true", help="write the unpacked folder form instead of a tar")
    output_flags(p)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a family-specific import option (repeatable), e.g. embed_vision_tower=true "
                        "for LLaVA; see docs/families/")
    p.add_argument("--allow-unmapped", action="append", default=[], metavar="GLOB",
                   help="drop source tensors matching GLOB instead of failing (repeatable)")
    p.add_argument("--ignore-config-key", action="append", default=[], metavar="KEY",
                   help="translate config.json as if it had no KEY, knowingly dropping what KEY says "
                        "(repeatable; recorded in the .nemo; export still restores the key)")
    finite_flag(p)
    device_flag(p)
    common_flags(p)
    p.set_defaults(func=run_import)

    e = sub.add_parser("export", help="convert a .nemo into a Hugging Face model folder",
                       description="Convert a .nemo (any layout; tar, gzip or unpacked folder) into a "
                                   "Hugging Face folder that transformers loads.")
    e.add_argument("src", help=".nemo file, unpacked .nemo folder, NeMo 2.0 folder, or Megatron-Bridge / "
                               "Megatron-LM checkpoint directory")
    e.add_argument("-o", "--output", required=True, help="the folder to write")
    add_iteration_flag(e)
    e.add_argument("--family", help="model family (default: from the .nemo config)")
    e.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="cast floating tensors (default: keep)")
    e.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    e.add_argument("--no-rope-scaling", action="store_true",
                   help="export scale_positional_embedding: True without llama3 RoPE scaling (NeMo's Llama "
                        "converter sets it by default, also on Llama 2 models; default: as NeMo runs it)")
    e.add_argument("--drop-head", action="store_true",
                   help="write a NeMo-Aligner reward model's language model, leaving out its reward head "
                        "(rm_head), which no Hugging Face class holds exactly (default: refused)")
    output_flags(e)
    finite_flag(e)
    device_flag(e, what="the dtype casts (an export's splits are views and stay on the CPU)")
    common_flags(e)
    e.set_defaults(func=run_export)


def add_target_flag(p: argparse.ArgumentParser) -> None:
    # choices: the installed output targets, set once the plugins are loaded (plugin_options.py)
    p.add_argument("--to", default="nemo",
                   help="what to write: a .nemo (default), a Megatron-Bridge checkpoint directory "
                        "(iter_0000000/ with run_config.yaml; --tp/--pp are recorded in it) or a Hugging Face "
                        "folder (hf, as export writes it; not from import); trtllm (a .qnemo) is written by "
                        "quantize, which takes --algo")


def add_iteration_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", type=int, metavar="N",
                   help="Megatron-Bridge / Megatron-LM directory: read iter_N (default: the one "
                        "latest_checkpointed_iteration.txt names)")


def add_parallel_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel size (default 1)")
    p.add_argument("--pp", type=int, default=1, metavar="M", help="pipeline-parallel size (default 1)")
    p.add_argument("--ep", type=int, default=1, metavar="K",
                   help="expert-parallel size of a mixture-of-experts model (default 1; dist layout)")
    p.add_argument("--stage-layers", metavar="N,N,…",
                   help="explicit layers per pipeline stage (default: an even split)")


def parallelism(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from nemo_convert.convert.nemo_write import Parallelism  # lazy: CLI start-up time
    stages = None
    if args.stage_layers:
        try:
            stages = tuple(int(x) for x in args.stage_layers.split(","))
        except ValueError:
            raise NemoConvertError(f"--stage-layers {args.stage_layers!r}: expected integers like 4,4") from None
    return Parallelism(args.tp, args.pp, stages, args.ep)


def parse_options(args: argparse.Namespace) -> dict[str, object]:
    """``--option KEY=VALUE`` pairs, values read as YAML scalars (true, 3, 0.5, text)."""
    import yaml  # lazy: CLI start-up time (PyYAML)

    out: dict[str, object] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise NemoConvertError(f"--option {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    out.update(plugin_option_values(args))  # a family's switches (LLaVA's --embed-vision-tower)
    return out


def parse_size(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    t = text.strip().upper()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            try:
                return int(float(t[: -len(u)]) * units[u])
            except ValueError:
                break
    if t.isdigit():
        return int(t)
    raise NemoConvertError(f"cannot read size {text!r} (e.g. 5GB, 500MB)")


def _warn_trust(args: argparse.Namespace) -> None:
    if args.trust_pickle:
        warn(args, "--trust-pickle: pickled files may now run arbitrary code on this machine")


def run_import(args: argparse.Namespace) -> int:
    from nemo_convert import api  # lazy: CLI start-up time

    _warn_trust(args)
    rep = api.import_hf(hf_source(args, args.src), args.output, family=args.family, dtype=args.dtype, layout=args.layout,
                        overwrite=args.overwrite, packed=not args.unpacked, progress=make_progress(args),
                        allow_unmapped=tuple(args.allow_unmapped), trust_pickle=args.trust_pickle,
                        ignore_config_keys=tuple(args.ignore_config_key), parallel=parallelism(args),
                        check_finite=args.check_finite, options=parse_options(args) or None, device=args.device,
                        workers=args.workers, to=args.to)
    report(args, rep, "wrote")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from nemo_convert import api  # lazy: CLI start-up time

    _warn_trust(args)
    rep = api.export_hf(args.src, args.output, dtype=args.dtype, overwrite=args.overwrite, family=args.family,
                        max_shard_bytes=parse_size(args.max_shard_size), progress=make_progress(args),
                        trust_pickle=args.trust_pickle, check_finite=args.check_finite, device=args.device,
                        workers=args.workers, iteration=args.iteration,
                        rope_scaling=not args.no_rope_scaling, drop_head=args.drop_head)
    report(args, rep, "wrote")
    return 0
