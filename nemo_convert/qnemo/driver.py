"""``quantize``: a ``.nemo`` or HF folder → a ``.qnemo`` (a TensorRT-LLM checkpoint).

Order of work (nothing is written until every check passed):

1. open the source lazily (an HF folder, or a ``.nemo`` seen under HF names through the
   family's ``to_hf`` plan), find the family and its TensorRT-LLM mapping;
2. build and check the plan (:mod:`.plan`): every rank file's header, every split;
3. calibrate if the algorithm or the KV cache needs it (:mod:`.calibration`) and check
   that every quantized linear has all of its scale inputs (:func:`.produce.check_stats`);
4. write ``config.json``, the tokenizer, and ``rank{i}.safetensors`` — one pipeline stage
   at a time, one tensor at a time — into a staging folder or a tar being streamed, then
   rename it into place.

Folder output opens the TP rank files of a stage together, so each tensor is read and
quantized once and its slices go to every rank. A tar holds one open member at a time, so
``compress=True`` writes rank after rank and re-reads (and re-quantizes) each tensor once
per TP rank; AWQ's search runs once per linear either way.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_convert import __version__
from nemo_convert.convert.common import dir_sink
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import NoProgress, Progress
from nemo_convert.errors import OutputExistsError, UnsupportedError
from nemo_convert.formats.nemo import dump_yaml
from nemo_convert.formats.sink import MemberSink
from nemo_convert.formats.staging import refuse_overlap, staged_output
from nemo_convert.formats.tar_writer import TarWriter
from nemo_convert.hf_config import hf_dtype_name
from nemo_convert.mapping.rules import Parallel
from nemo_convert.plugins.manager import Registry, get_registry
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.qnemo import calibration as calib
from nemo_convert.qnemo.plan import (
    ALGOS,
    DTYPE_NAME,
    QuantPlan,
    build_plan,
    slice_for_rank,
)
from nemo_convert.qnemo.produce import Producer, check_stats
from nemo_convert.qnemo.spec import TrtllmSpec
from nemo_convert.qnemo.tokenizer import (
    TOKENIZER_CONFIG,
    tokenizer_from_hf,
    tokenizer_from_nemo,
)
from nemo_convert.qnemo.writer import RankStream
from nemo_convert.quant.algorithms import DEFAULT_GROUP_SIZE
from nemo_convert.quant.trtllm_names import QUANT_ALGO, quantization_section

KV_CACHE_CHOICES = ("none", "fp8")
_NAMED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class QuantizeReport:
    """What ``quantize`` wrote; ``--json`` prints :meth:`as_dict`."""

    output: str
    family: str
    algo: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    dtype: str
    tp: int
    pp: int
    files: list[str]
    tensors: int
    bytes: int
    seconds: float
    compressed: bool = False
    calibration: dict[str, Any] | None = None
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _trtllm_spec(fam: ModelFamily, reg: Registry) -> TrtllmSpec:
    spec = fam.trtllm
    if spec is None:
        have = sorted(p.record.name for p in reg.families.values() if p.record.trtllm is not None)
        raise UnsupportedError(f"model family {fam.name!r} declares no TensorRT-LLM mapping, so it cannot be "
                               f"quantized to a .qnemo (families that can: {', '.join(have) or 'none'})")
    if not isinstance(spec, TrtllmSpec):
        raise UnsupportedError(f"model family {fam.name!r}: its trtllm field is a {type(spec).__name__}, "
                               "not a nemo_convert.qnemo.TrtllmSpec")
    return spec


def _model_dtype(hf_cfg: dict[str, Any], infos: Any, want: torch.dtype | None) -> torch.dtype:
    if want is not None:
        return want
    name = hf_dtype_name(hf_cfg)
    if name in _NAMED_DTYPES:
        return _NAMED_DTYPES[name]
    for info in infos.values():
        if info.dtype in DTYPE_NAME:
            return info.dtype
    return torch.float32


def trtllm_config(spec: TrtllmSpec, plan: QuantPlan) -> dict[str, Any]:
    """The checkpoint's ``config.json`` (checkpoint.md "Config"; fields ModelOpt also writes)."""
    algo = None if plan.algo == "none" else plan.algo
    parallel_embedding = any(t.parallel is Parallel.VOCAB and t.stage == "first" for t in spec.tensors)
    return {
        "producer": {"name": "nemo-convert", "version": __version__},
        "architecture": spec.architecture,
        "dtype": DTYPE_NAME[plan.dtype],
        "logits_dtype": "float32",
        **plan.model_config,
        "use_parallel_embedding": parallel_embedding,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "mapping": {"world_size": plan.tp * plan.pp, "tp_size": plan.tp, "pp_size": plan.pp},
        "quantization": quantization_section(algo, kv_cache_fp8=plan.kv_cache_fp8, group_size=plan.group_size,
                                             exclude_modules=list(spec.exclude_modules)),
    }


def _write_ranks(sink: MemberSink, plan: QuantPlan, produce: Producer, *, together: bool,
                 progress: Progress) -> tuple[int, int]:
    tensors = nbytes = 0
    for stage in range(plan.pp):
        ranks = [r for r in plan.ranks if r.pp_rank == stage]
        groups = [ranks] if together else [[r] for r in ranks]
        for group in groups:
            with ExitStack() as stack:
                streams = [RankStream(stack.enter_context(sink.open_member(r.name)), r.infos, r.name)
                           for r in group]
                for item in plan.stages[stage]:
                    full = produce(item)
                    for rf, stream in zip(group, streams):
                        for out in item.outputs:
                            t = slice_for_rank(full[out.suffix], out, plan.tp, rf.tp_rank)
                            n = stream.write(out.rank_name(item.local_layer), t)
                            tensors += 1
                            nbytes += n
                            progress.advance(n, 1)
                    del full
                for s in streams:
                    s.check_done()
    return tensors, nbytes


def quantize(src: str, out: str, *, algo: str, tp: int = 1, pp: int = 1, calib_data: str | None = None,
             calib_size: int = 64, calib_seq_len: int = 512, calib_batch_size: int = 4, kv_cache: str = "none",
             compress: bool = False, device: str | torch.device = "cpu", overwrite: bool = False,
             group_size: int = DEFAULT_GROUP_SIZE, dtype: str | torch.dtype | None = None,
             family: str | None = None, awq_grid: int = 20, progress: Progress | None = None,
             registry: Registry | None = None, trust_pickle: bool = False) -> QuantizeReport:
    """Write a TensorRT-LLM checkpoint (``.qnemo``) of ``src`` (a ``.nemo`` or an HF folder).

    :param algo: ``none`` (plain checkpoint in the model dtype), ``int8_wo``, ``int4_wo``,
        ``fp8`` or ``int4_awq``.
    :param tp: tensor-parallel size of the TensorRT-LLM checkpoint; ``pp`` pipeline size.
    :param calib_data: text file, one calibration sample per line (default: the built-in
        English sample); ``calib_size`` rows of ``calib_seq_len`` tokens are used.
    :param kv_cache: ``"fp8"`` adds an FP8 KV-cache scale per attention (calibrated).
    :param compress: write a plain tar instead of a folder.
    :param device: where calibration and the quantization math run (``cpu`` / ``cuda``).
    :param group_size: int4 group size (64 or 128).
    :param dtype: checkpoint dtype (``bf16``/``fp16``/``fp32``); default: the source's.
    """
    t0 = time.perf_counter()
    progress = progress or NoProgress()
    reg = registry if registry is not None else get_registry()
    if algo not in ALGOS:
        raise UnsupportedError(f"unknown --algo {algo!r}; expected one of {', '.join(ALGOS)}")
    if kv_cache not in KV_CACHE_CHOICES:
        raise UnsupportedError(f"unknown --kv-cache {kv_cache!r}; expected none or fp8")
    dev = calib.resolve_device(device)
    want_dtype = parse_dtype(dtype)
    refuse_overlap(src, out)
    if os.path.lexists(out) and not overwrite:
        raise OutputExistsError(f"{out} exists; pass --overwrite to replace it")

    from nemo_convert.convert.checkpoint import open_checkpoint

    ck = open_checkpoint(src, trust_pickle=trust_pickle)
    tmp: str | None = None
    try:
        if ck.format == "hf":
            fam = reg.family(family) if family else reg.family_for_hf_config(ck.config)
            hf_cfg = ck.config
            source = ck.source
            tok_section, tok_files = tokenizer_from_hf(src, hf_cfg, fam.tokenizer_files)
        else:
            from nemo_convert.convert.nemo_to_hf import hf_config_of
            from nemo_convert.mapping.planner import plan_conversion
            from nemo_convert.qnemo.hf_view import PlanSource

            fam = reg.family(family) if family else reg.family_for_nemo_config(ck.config)
            hf_cfg = hf_config_of(fam, ck.config)
            source = PlanSource(plan_conversion(fam.mapping(ck.config), ck.config, ck.source, "to_hf"), ck.source)
            tok_section, tok_files = tokenizer_from_nemo(ck.handle, ck.config)
        spec = _trtllm_spec(fam, reg)
        infos = {k: source.info(k) for k in list(source.keys())}
        mdtype = _model_dtype(hf_cfg, infos, want_dtype)
        plan = build_plan(spec, spec.config(copy.deepcopy(hf_cfg)), infos, algo=algo, tp=tp, pp=pp,
                          dtype=mdtype, group_size=group_size, kv_cache_fp8=kv_cache == "fp8")
        notes: list[str] = []
        warnings: list[str] = []
        if tok_section is None:
            warnings.append("the source has no tokenizer files; the .qnemo has no tokenizer_config.yaml")

        stats: dict[str, Any] = {}
        calib_info: calib.CalibrationInfo | None = None
        if plan.needs_calibration:
            tc = time.perf_counter()
            texts = calib.read_calibration_texts(calib_data)
            folder = src
            if ck.format != "hf":
                from nemo_convert.convert.nemo_to_hf import export_hf

                parent = os.path.dirname(os.path.abspath(out))
                os.makedirs(parent, exist_ok=True)
                tmp = tempfile.mkdtemp(prefix=".nemo-convert-calib-", dir=parent)
                folder = os.path.join(tmp, "hf")
                export_hf(src, folder, dtype=mdtype, registry=reg, family=fam.name, trust_pickle=trust_pickle)
            ids = calib.calibration_tokens(folder, texts, n=calib_size, seq_len=calib_seq_len,
                                           vocab_size=plan.model_config.get("vocab_size"))
            kv_mods = () if spec.kv_cache is None else tuple(
                sorted({spec.kv_cache.k.rsplit(".", 1)[-1], spec.kv_cache.v.rsplit(".", 1)[-1]}))
            stats = calib.calibrate(folder, ids, plan.calibration_modules(), dtype=mdtype, device=dev,
                                    batch_size=calib_batch_size, kv_modules=kv_mods,
                                    max_samples=64 if algo == "int4_awq" else 0)
            check_stats(plan, stats)
            calib_info = calib.CalibrationInfo(calib_data or "built-in", int(ids.shape[0]), int(ids.shape[1]),
                                               int(ids.numel()), str(dev), DTYPE_NAME[mdtype],
                                               time.perf_counter() - tc)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp = None

        config = trtllm_config(spec, plan)
        producer = Producer(plan, source, stats, dev, awq_grid=awq_grid)
        progress.start("quantize" if algo != "none" else "convert", plan.total_bytes, plan.total_tensors)
        try:
            with staged_output(out, overwrite=overwrite, is_dir=not compress) as stage, \
                    (TarWriter(stage) if compress else dir_sink(stage)) as sink:
                sink.add_bytes("config.json", (json.dumps(config, indent=2) + "\n").encode("utf-8"))
                for name in sorted(tok_files):
                    sink.add_bytes(name, tok_files[name])
                if tok_section is not None:
                    sink.add_bytes(TOKENIZER_CONFIG, dump_yaml(tok_section))
                tensors, nbytes = _write_ranks(sink, plan, producer, together=not compress, progress=progress)
        finally:
            progress.finish()
    finally:
        ck.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if compress and tp > 1 and algo != "none":
        notes.append(f"--compress with TP {tp}: each tensor was read and quantized once per TP rank")
    files = ["config.json", *sorted(tok_files)] + ([TOKENIZER_CONFIG] if tok_section is not None else []) \
        + [r.name for r in plan.ranks]
    return QuantizeReport(out, fam.name, algo, QUANT_ALGO.get(algo), "FP8" if plan.kv_cache_fp8 else None,
                          DTYPE_NAME[plan.dtype], tp, pp, files, tensors, nbytes, time.perf_counter() - t0,
                          compress, None if calib_info is None else calib_info.as_dict(), plan.dropped,
                          warnings, notes)

