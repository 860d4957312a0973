"""``nemo-convert quantize``: an HF folder, a ``.nemo``, a NeMo 2 folder or a Megatron-Bridge /
Megatron-LM directory → a ``.qnemo`` (TensorRT-LLM checkpoint)."""

from __future__ import annotations

import argparse

from nemo_convert.cli.cmd_convert import add_iteration_flag
from nemo_convert.cli.common import common_flags, device_flag, hf_source, human_bytes, print_json, revision_flag, warn
from nemo_convert.cli.progress import make_progress

ALGOS = ("none", "int8_wo", "int4_wo", "fp8", "int4_awq")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "quantize", help="write a quantized TensorRT-LLM checkpoint (.qnemo) of a .nemo, HF folder, NeMo 2 folder "
                         "or Megatron-Bridge / Megatron-LM directory",
        description="Quantize a .nemo, a Hugging Face model folder, a NeMo 2 folder or a Megatron-Bridge / "
                    "Megatron-LM checkpoint directory into a .qnemo: a TensorRT-LLM checkpoint "
                    "(config.json + rank{i}.safetensors + tokenizer) for trtllm-build. Runs on CPU; "
                    "fp8, int4_awq and --kv-cache fp8 calibrate with transformers first. A training "
                    "checkpoint goes through from-ckpt first.")
    p.add_argument("src", help=".nemo (file or folder), Hugging Face model folder, NeMo 2 folder, Megatron-Bridge / "
                               "Megatron-LM checkpoint directory (--iteration picks its iter_N), or a hub id "
                               "(org/name) already in the local hub cache")
    revision_flag(p)
    add_iteration_flag(p)
    p.add_argument("-o", "--output", required=True, help="the .qnemo to write (a folder; a tar with --compress)")
    p.add_argument("--algo", required=True, choices=ALGOS,
                   help="none: plain checkpoint in the model dtype; int8_wo: W8A16; int4_wo: group-wise int4 "
                        "weight-only (W4A16_AWQ without pre-scale); fp8: FP8 weights and activations; "
                        "int4_awq: W4A16_AWQ")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the checkpoint (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size of the checkpoint (default 1)")
    p.add_argument("--ep", type=int, default=1,
                   help="mixture of experts: expert-parallel size within --tp (TensorRT-LLM's moe_ep_size; each "
                        "rank holds 1/EP of a layer's experts, each split over TP/EP ranks); must divide --tp and "
                        "the experts (default 1)")
    p.add_argument("--calib-data", metavar="FILE",
                   help="calibration text, one sample per line (default: the built-in English sample)")
    p.add_argument("--calib-size", type=int, metavar="N",
                   help="calibration rows of --calib-seq-len tokens (default: sized to the model and device: "
                        "64 on CUDA, 4 to 16 on the CPU; the summary says what ran)")
    p.add_argument("--calib-seq-len", type=int, metavar="T",
                   help="tokens per row (default 512 on CUDA, 256 on the CPU, at most max_position_embeddings)")
    p.add_argument("--calib-batch-size", type=int, default=4, metavar="B", help="rows per forward (default 4)")
    p.add_argument("--kv-cache", choices=["none", "fp8"], default="none",
                   help="fp8: add calibrated FP8 KV-cache scales (default none)")
    p.add_argument("--group-size", type=int, default=128, choices=[64, 128], help="int4 group size (default 128)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"],
                   help="checkpoint dtype (default: the source's; quantized algorithms need bf16 or fp16)")
    p.add_argument("--compress", action="store_true", help="write a plain tar instead of a folder")
    device_flag(p, what="calibration and the quantization math")
    p.add_argument("--no-rope-scaling", dest="rope_scaling", action="store_false",
                   help="read a NeMo-written .nemo's scale_positional_embedding: True as no RoPE scaling "
                        "(as export --no-rope-scaling does) instead of llama3 scaling as NeMo runs it")
    p.add_argument("--family", help="model family (default: detected)")
    p.add_argument("--ignore-config-key", action="append", default=[], metavar="KEY",
                   help="HF source: translate config.json as if it had no KEY, knowingly dropping what KEY "
                        "says (repeatable; as import)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUTPUT if it is an output of the kind written (or an empty folder); anything else "
                        "is refused")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow arbitrary code in pickled weights (DANGEROUS; only for files you trust)")
    common_flags(p)
    p.set_defaults(func=run_quantize)


def run_quantize(args: argparse.Namespace) -> int:
    from rich.console import Console

    from nemo_convert.qnemo import quantize  # lazy: CLI start-up time
    from nemo_convert.workers import SINGLE  # lazy: CLI start-up time

    workers = getattr(args, "workers", None) or SINGLE
    if args.trust_pickle:
        warn(args, "--trust-pickle: pickled files may now run arbitrary code on this machine")
    rep = quantize(hf_source(args, args.src), args.output, algo=args.algo, tp=args.tp, pp=args.pp, calib_data=args.calib_data,
                   calib_size=args.calib_size, calib_seq_len=args.calib_seq_len,
                   calib_batch_size=args.calib_batch_size, kv_cache=args.kv_cache, compress=args.compress,
                   device=args.device, overwrite=args.overwrite, group_size=args.group_size, dtype=args.dtype,
                   family=args.family, progress=make_progress(args), trust_pickle=args.trust_pickle,
                   workers=workers, rope_scaling=args.rope_scaling,
                   ignore_config_keys=tuple(args.ignore_config_key), ep=args.ep, iteration=args.iteration)
    if not workers.is_main:
        return 0  # process 0 reports for all
    for w in rep.warnings:
        warn(args, w)
    if args.json:
        print_json(rep.as_dict())
    elif not args.quiet:
        algo = rep.quant_algo or "unquantized"
        kv = f", KV cache {rep.kv_cache_quant_algo}" if rep.kv_cache_quant_algo else ""
        ranks = len([f for f in rep.files if f.startswith("rank")])
        Console(stderr=True, soft_wrap=True).print(
            f"wrote {rep.output}: {algo}{kv}, {rep.dtype}, TP {rep.tp} × PP {rep.pp}"
            + (f" (EP {rep.ep} within TP)" if rep.ep > 1 else "") + " "
            f"({ranks} rank file{'s' if ranks != 1 else ''}), {rep.tensors} tensors, "
            f"{human_bytes(rep.bytes)} in {rep.seconds:.2f} s, family {rep.family}"
            + (f"; all {workers.world} processes together (the bar showed process 0's share)"
               if workers.world > 1 else ""), highlight=False)
        if rep.calibration:
            c = rep.calibration
            Console(stderr=True, soft_wrap=True).print(
                f"calibration: {c['samples']} rows × {c['seq_len']} tokens of {c['source']} text on {c['device']} "
                f"in {c['seconds']:.1f} s ({c['sized']}; --calib-size/--calib-seq-len to change)", highlight=False)
        for n in rep.notes:
            Console(stderr=True, soft_wrap=True).print(f"note: {n}", highlight=False)
    return 0
