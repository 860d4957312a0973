"""``quantize``: a ``.nemo`` or HF folder → a ``.qnemo`` (a TensorRT-LLM checkpoint).

Order of work (nothing is written until every check passed):

1. open the source lazily as NeMo logical tensors (an HF folder through the family's
   ``to_nemo`` plan, with the planner's coverage proof; a ``.nemo`` as its own tensors) and
   find the family;
2. plan the family's TensorRT-LLM target with the same planner (:mod:`.target`: its name
   projection over the NeMo tensors, its config projection over the NeMo config), add the
   quantization tasks and lay out every rank file's header, every split (:mod:`.plan`);
3. calibrate if the algorithm or the KV cache needs it (:mod:`.calibration`) and check
   that every quantized linear has all of its scale inputs (:func:`.quantizer.check_stats`);
4. write ``config.json``, the tokenizer, and ``rank{i}.safetensors`` — one pipeline stage
   at a time, one tensor at a time — into a staging folder or a tar being streamed, then
   rename it into place.

Folder output opens the TP rank files of a stage together, so each tensor is read and
quantized once and its slices go to every rank. A tar holds one open member at a time, so
``compress=True`` writes rank after rank and re-reads (and re-quantizes) each tensor once
per TP rank; AWQ's search runs once per linear either way.

Several processes (``workers``, torchrun) split the rank files: ``rank{i}.safetensors`` is
written by process ``i mod world`` (its TP ranks of a stage together, also for a tar),
calibration runs in process 0 alone and its statistics are broadcast, AWQ's α of each
linear is searched in one process and shared, and process 0 writes ``config.json``, the
tokenizer and the tar (:func:`nemo_convert.workers.write_together`). The output is
byte-identical to a one-process run.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from nemo_convert import __version__
from nemo_convert.compute import resolve_device
from nemo_convert.convert.checkpoint import open_checkpoint
from nemo_convert.convert.common import dir_sink
from nemo_convert.convert.hf_to_nemo import plan_import
from nemo_convert.convert.nemo_to_hf import plan_to_hf
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import NoProgress, Progress
from nemo_convert.errors import UnsupportedError
from nemo_convert.families.trtllm import TrtllmTable
from nemo_convert.formats.nemo.nemo import dump_yaml
from nemo_convert.formats.io.sink import MemberSink
from nemo_convert.formats.io.staging import check_target, refuse_overlap, staged_output
from nemo_convert.formats.io.tar_writer import TarWriter
from nemo_convert.hf_config import hf_dtype_name
from nemo_convert.mapping.planner import nemo_origins, nemo_parallel_kinds
from nemo_convert.mapping.rules import Parallel
from nemo_convert.plugins.manager import Registry, get_registry
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.qnemo.calibrate_once import calibrate_once, share_awq_search
from nemo_convert.qnemo.job import Job
from nemo_convert.qnemo.plan import (
    ALGOS,
    DTYPE_NAME,
    QuantPlan,
    build_plan,
    rank_slice,
)
from nemo_convert.mapping.plan_view import PlanSource
from nemo_convert.qnemo.produce import Producer
from nemo_convert.qnemo.target import TargetPlan, plan_target
from nemo_convert.qnemo.tokenizer import (
    TOKENIZER_CONFIG,
    tokenizer_from_hf,
    tokenizer_from_nemo,
)
from nemo_convert.qnemo.writer import RankStream
from nemo_convert.quant.algorithms import DEFAULT_GROUP_SIZE
from nemo_convert.quant.trtllm_names import QUANT_ALGO, quantization_section
from nemo_convert.tensors.base import TensorSource
from nemo_convert.workers import SINGLE, Workers, write_together

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
    ep: int = 1

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _trtllm_table(fam: ModelFamily, reg: Registry) -> TrtllmTable:
    """The family's TensorRT-LLM target, or a one-line refusal naming the family."""
    table = fam.trtllm
    if table is None:
        have = sorted(p.record.name for p in reg.families.values() if p.record.trtllm is not None)
        raise UnsupportedError(f"model family {fam.name!r} declares no TensorRT-LLM mapping, so it cannot be "
                               f"quantized to a .qnemo (families that can: {', '.join(have) or 'none'})")
    if not isinstance(table, TrtllmTable):
        raise UnsupportedError(f"model family {fam.name!r}: its trtllm field is a {type(table).__name__}, "
                               "not a nemo_convert.families.trtllm.TrtllmTable")
    return table


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


def trtllm_config(target: TargetPlan, plan: QuantPlan) -> dict[str, Any]:
    """The checkpoint's ``config.json`` (checkpoint.md "Config"; fields ModelOpt also writes).
    A model with experts adds ``moe_tp_size`` / ``moe_ep_size`` to ``mapping``
    (``tensorrt_llm/mapping.py``: ``tp_size = moe_tp_size · moe_ep_size``)."""
    algo = None if plan.algo == "none" else plan.algo
    parallel_embedding = any(spec.kind is Parallel.VOCAB and t.stage == "first" for t in target.tasks
                             for spec in t.specs)
    mapping = {"world_size": plan.tp * plan.pp, "tp_size": plan.tp, "pp_size": plan.pp}
    if plan.experts:
        mapping.update(moe_tp_size=plan.tp // plan.ep, moe_ep_size=plan.ep)
    return {
        "producer": {"name": "nemo-convert", "version": __version__},
        "architecture": target.table.architecture,
        "dtype": DTYPE_NAME[plan.dtype],
        "logits_dtype": "float32",
        **plan.model_config,
        "use_parallel_embedding": parallel_embedding,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "mapping": mapping,
        "quantization": quantization_section(algo, kv_cache_fp8=plan.kv_cache_fp8, group_size=plan.group_size,
                                             exclude_modules=list(plan.exclude_modules)),
    }


def _write_ranks(sink: MemberSink, plan: QuantPlan, produce: Producer, *, together: bool,
                 progress: Progress, owned: Callable[[int], bool] = lambda rank: True) -> tuple[int, int]:
    """Write the rank files ``owned`` accepts, one pipeline stage at a time."""
    tensors = nbytes = 0
    for stage in range(plan.pp):
        ranks = [r for r in plan.ranks if r.pp_rank == stage and owned(r.rank)]
        groups = ([ranks] if ranks else []) if together else [[r] for r in ranks]
        for group in groups:
            with ExitStack() as stack:
                streams = [RankStream(stack.enter_context(sink.open_member(r.name)), r.infos, r.name)
                           for r in group]
                for item in plan.stages[stage]:
                    full = produce(item)
                    for rf, stream in zip(group, streams):
                        for out in item.outputs:
                            t = rank_slice(full[out.name], out, plan, rf.tp_rank)
                            n = stream.write(out.rank_name(item.local_layer), t)
                            tensors += 1
                            nbytes += n
                            progress.advance(n, 1)
                    del full
                for s in streams:
                    s.check_done()
    return tensors, nbytes


def _check_options(src: str, out: str, *, algo: str, kv_cache: str, device: str | torch.device,
                   dtype: str | torch.dtype | None, overwrite: bool,
                   compress: bool) -> tuple[torch.device, torch.dtype | None]:
    """The one-line errors of the options alone; ``(device, dtype)``."""
    if algo not in ALGOS:
        raise UnsupportedError(f"unknown --algo {algo!r}; expected one of {', '.join(ALGOS)}")
    if kv_cache not in KV_CACHE_CHOICES:
        raise UnsupportedError(f"unknown --kv-cache {kv_cache!r}; expected none or fp8")
    dev = resolve_device(device)
    want_dtype = parse_dtype(dtype)
    refuse_overlap(src, out)
    check_target(out, overwrite=overwrite, kind="qnemo", is_dir=not compress)
    return dev, want_dtype


def _open_and_plan(src: str, reg: Registry, *, family: str | None, trust_pickle: bool, algo: str, tp: int,
                   pp: int, dtype: torch.dtype | None, group_size: int, kv_cache: str, ep: int = 1,
                   rope_scaling: bool = True, ignore_config_keys: tuple[str, ...] = ()) -> Job:
    """Open ``src`` lazily as NeMo logical tensors — an HF folder through the family's
    ``to_nemo`` plan (its config translated as ``import`` translates it), a ``.nemo`` as its
    own tensors (its config completed as export completes it: the true vocabulary, token ids,
    RoPE scaling) — and plan the TensorRT-LLM target over them; nothing is written."""
    ck = open_checkpoint(src, trust_pickle=trust_pickle, accept=("hf", "nemo", "nemo2"),
                         what="a .nemo or a Hugging Face folder")
    try:
        if ck.format == "hf":
            fam = reg.family(family) if family else reg.family_for_hf_config(ck.config)
            hf_cfg = ck.config
            tok_section, tok_files = tokenizer_from_hf(src, hf_cfg, fam.hf.tokenizer_files)
            warnings: list[str] = []
            table = _trtllm_table(fam, reg)
            nemo_cfg, to_nemo = plan_import(fam, hf_cfg, ck.source, ignore_config_keys=ignore_config_keys)
            source: TensorSource = PlanSource(to_nemo, ck.source)
            infos = {k: ck.source.info(k) for k in list(ck.source.keys())}
        else:
            if ignore_config_keys:
                raise UnsupportedError("--ignore-config-key applies to a Hugging Face source; a .nemo's config "
                                       "was translated when it was imported")
            fam = reg.family(family) if family else reg.family_for_nemo_config(ck.config)
            prep, hf_cfg, _ = plan_to_hf(ck.handle, fam, rope_scaling=rope_scaling)
            tok_section, tok_files = tokenizer_from_nemo(ck.handle, ck.config)
            warnings = prep.warnings
            table = _trtllm_table(fam, reg)
            nemo_cfg, source = prep.cfg, prep.source
            infos = {k: source.info(k) for k in list(source.keys())}
        mapping = fam.mapping(nemo_cfg)
        model_config = table.config(copy.deepcopy(nemo_cfg))
        # a family with a TensorRT-LLM table has no sectioned tensors (those are hybrid stacks')
        kinds = cast(dict[str, Parallel], nemo_parallel_kinds(mapping, nemo_cfg))
        target = plan_target(table, nemo_cfg, model_config, source, kinds,
                             [d for part in mapping.parts() for d in part.drop_nemo])
        kv_parts = {n: len(o.parts) for n, o in nemo_origins(mapping, nemo_cfg).items()}
        plan = build_plan(target, algo=algo, tp=tp, pp=pp, ep=ep, dtype=_model_dtype(hf_cfg, infos, dtype),
                          group_size=group_size, kv_cache_fp8=kv_cache == "fp8",
                          strategies=reg.strategies(), kv_parts=kv_parts)
    except BaseException:
        ck.close()
        raise
    return Job(ck, fam, target, source, plan, tok_section, tok_files, warnings, tuple(ignore_config_keys),
               sum(i.numel for i in infos.values()))


def _write_head(sink: MemberSink, config: dict[str, Any], job: Job) -> None:
    """``config.json`` and the tokenizer: the members before the rank files."""
    sink.add_bytes("config.json", (json.dumps(config, indent=2) + "\n").encode("utf-8"))
    for name in sorted(job.tok_files):
        sink.add_bytes(name, job.tok_files[name])
    if job.tok_section is not None:
        sink.add_bytes(TOKENIZER_CONFIG, dump_yaml(job.tok_section))


def _write_output(out: str, config: dict[str, Any], job: Job, producer: Producer, *, compress: bool,
                  overwrite: bool, progress: Progress, workers: Workers) -> tuple[int, int]:
    """Stage, write and install the output; ``(tensors, bytes)`` of the rank files."""
    plan = job.plan
    mine = [r for r in plan.ranks if workers.owns(r.rank)]
    progress.start("quantize" if plan.algo != "none" else "convert", sum(r.nbytes for r in mine),
                   sum(len(r.infos) for r in mine))
    try:
        if workers.world == 1:
            with staged_output(out, overwrite=overwrite, is_dir=not compress, kind="qnemo") as stage, \
                    (TarWriter(stage) if compress else dir_sink(stage)) as sink:
                _write_head(sink, config, job)
                return _write_ranks(sink, plan, producer, together=not compress, progress=progress)
        # Each process writes its rank files as files (so its TP ranks of a stage together);
        # process 0 adds config and tokenizer and, for a tar, the rank files in order.
        counts = write_together(
            out, [r.name for r in plan.ranks],
            lambda sink: _write_ranks(sink, plan, producer, together=True, progress=progress, owned=workers.owns),
            workers=workers, overwrite=overwrite, packed=compress, kind="qnemo",
            head=lambda sink: _write_head(sink, config, job))
        return sum(t for t, _ in counts), sum(n for _, n in counts)
    finally:
        progress.finish()


def quantize(src: str | os.PathLike[str], out: str | os.PathLike[str], *, algo: str, tp: int = 1, pp: int = 1,
             calib_data: str | os.PathLike[str] | None = None,
             calib_size: int | None = None, calib_seq_len: int | None = None, calib_batch_size: int = 4,
             kv_cache: str = "none",
             compress: bool = False, device: str | torch.device = "cpu", overwrite: bool = False,
             group_size: int = DEFAULT_GROUP_SIZE, dtype: str | torch.dtype | None = None,
             family: str | None = None, awq_grid: int = 20, progress: Progress | None = None,
             registry: Registry | None = None, trust_pickle: bool = False,
             workers: Workers = SINGLE, rope_scaling: bool = True,
             ignore_config_keys: tuple[str, ...] = (), ep: int = 1) -> QuantizeReport:
    """Write a TensorRT-LLM checkpoint (``.qnemo``) of ``src`` (a ``.nemo`` or an HF folder).

    :param algo: ``none`` (plain checkpoint in the model dtype), ``int8_wo``, ``int4_wo``,
        ``fp8`` or ``int4_awq``.
    :param tp: tensor-parallel size of the TensorRT-LLM checkpoint; ``pp`` pipeline size.
    :param ep: expert-parallel size within TP, for a mixture of experts: each TP rank holds
        ``1/ep`` of a layer's experts, each split over ``tp/ep`` ranks (TensorRT-LLM's
        ``moe_ep_size`` and ``moe_tp_size``); must divide ``tp`` and the expert count.
    :param calib_data: text file, one calibration sample per line (default: the built-in
        English sample); ``calib_size`` rows of ``calib_seq_len`` tokens are used. Either left
        None is sized to the model and the device
        (:func:`nemo_convert.qnemo.calibration.calibration_size`: 64 × 512 on CUDA, a few
        rows of up to 256 tokens on the CPU); the report's ``calibration`` says what ran.
    :param kv_cache: ``"fp8"`` adds an FP8 KV-cache scale per attention (calibrated).
    :param compress: write a plain tar instead of a folder.
    :param device: where calibration and the quantization math run (``cpu`` / ``cuda``).
    :param group_size: int4 group size (64 or 128).
    :param dtype: checkpoint dtype (``bf16``/``fp16``/``fp32``); default: the source's.
    :param rope_scaling: for a ``.nemo`` that NeMo wrote, False reads ``scale_positional_embedding:
        True`` as no RoPE scaling (as ``export_hf(rope_scaling=False)``); its config is completed
        as export completes it (:mod:`nemo_convert.convert.export_config`).
    :param ignore_config_keys: for an HF source, ``config.json`` keys translated as if absent,
        as ``import_hf(ignore_config_keys=...)``: the TensorRT-LLM config is computed from
        the NeMo config ``import`` would write.
    :param workers: the processes sharing the work (torchrun): rank file ``i`` is written
        by process ``i mod world``, calibration runs in process 0 and its statistics are
        shared, process 0 writes the rest; the output is byte-identical to one process's.
    """
    t0 = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out)
    calib_data = None if calib_data is None else os.fspath(calib_data)
    progress = progress or NoProgress()
    reg = registry if registry is not None else get_registry()

    def prepare() -> tuple[Job, torch.device]:
        dev, want_dtype = _check_options(src, out, algo=algo, kv_cache=kv_cache, device=device, dtype=dtype,
                                         overwrite=overwrite, compress=compress)
        return _open_and_plan(src, reg, family=family, trust_pickle=trust_pickle, algo=algo, tp=tp, pp=pp,
                              dtype=want_dtype, group_size=group_size, kv_cache=kv_cache, ep=ep,
                              rope_scaling=rope_scaling, ignore_config_keys=tuple(ignore_config_keys)), dev

    job, dev = workers.run_all(prepare, undo=lambda r: r[0].close())
    try:
        plan = job.plan
        plan.quantizer.device, plan.quantizer.awq_grid = dev, awq_grid
        stats, calib_info = calibrate_once(job, workers, dev, src=src, out=out, calib_data=calib_data,
                                            calib_size=calib_size, calib_seq_len=calib_seq_len,
                                            calib_batch_size=calib_batch_size, reg=reg, trust_pickle=trust_pickle,
                                            progress=progress, rope_scaling=rope_scaling)
        producer = Producer(plan, job.source)
        share_awq_search(plan, producer, workers, progress)
        tensors, nbytes = _write_output(out, trtllm_config(job.target, plan), job, producer, compress=compress,
                                        overwrite=overwrite, progress=progress, workers=workers)
    finally:
        job.close()
    warnings = job.warnings + ([] if job.tok_section is not None else
                               ["the source has no tokenizer files; the .qnemo has no tokenizer_config.yaml"])
    notes = []
    if compress and tp > 1 and algo != "none" and workers.world == 1:
        notes.append(f"--compress with TP {tp}: each tensor was read and quantized once per TP rank")
    files = ["config.json", *sorted(job.tok_files)] + ([TOKENIZER_CONFIG] if job.tok_section is not None else []) \
        + [r.name for r in plan.ranks]
    return QuantizeReport(out, job.fam.name, algo, QUANT_ALGO.get(algo), "FP8" if plan.kv_cache_fp8 else None,
                          DTYPE_NAME[plan.dtype], tp, pp, files, tensors, nbytes, time.perf_counter() - t0,
                          compress, None if calib_info is None else calib_info.as_dict(), plan.dropped,
                          warnings, notes, ep)
