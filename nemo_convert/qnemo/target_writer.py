"""The writer of the ``trtllm`` output target (registered by :mod:`nemo_convert.trtllm_target`):
a ``.qnemo`` — a TensorRT-LLM checkpoint — from one
:class:`~nemo_convert.plugins.records.OutputJob` whose ``quantization`` says how to quantize.

Order of work (nothing is written until every check passed):

1. plan the family's TensorRT-LLM target with the one planner over the job's NeMo logical
   tensors (:mod:`.target`: its name projection over the NeMo tensors, its config
   projection over the NeMo config), add the quantization tasks and lay out every rank
   file's header, every split (:mod:`.plan`) — in every process, which all agree;
2. calibrate if the algorithm or the KV cache needs it (:mod:`.calibration`, on the job's
   :class:`~nemo_convert.plugins.records.RunnableModel`) and check that every quantized
   linear has all of its scale inputs (:func:`.quantizer.check_stats`);
3. write ``config.json``, the tokenizer, and ``rank{i}.safetensors`` — one pipeline stage
   at a time, one tensor at a time — into a staging folder or a tar being streamed, then
   rename it into place.

Folder output opens the TP rank files of a stage together, so each tensor is read and
quantized once and its slices go to every rank. A tar holds one open member at a time, so
``packed`` (``--compress``) writes rank after rank and re-reads (and re-quantizes) each
tensor once per TP rank; AWQ's search runs once per linear either way.

Several processes (``job.workers``, torchrun) split the rank files: ``rank{i}.safetensors``
is written by process ``i mod world`` (its TP ranks of a stage together, also for a tar),
calibration runs in process 0 alone and its statistics are broadcast, AWQ's α of each
linear is searched in one process and shared, and process 0 writes ``config.json``, the
tokenizer and the tar (:func:`nemo_convert.workers.write_together`). The output is
byte-identical to a one-process run.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from nemo_convert import __version__
from nemo_convert.convert.common import dir_sink
from nemo_convert.engine import NoProgress, Progress
from nemo_convert.errors import UnsupportedError
from nemo_convert.families.trtllm import TrtllmTable
from nemo_convert.formats.io.sink import MemberSink
from nemo_convert.formats.io.staging import staged_output
from nemo_convert.formats.io.tar_writer import TarWriter
from nemo_convert.hf_config import hf_dtype_name
from nemo_convert.mapping.plan_view import plan_view
from nemo_convert.mapping.planner import nemo_origins
from nemo_convert.mapping.rules import Parallel
from nemo_convert.plugins.records import OutputJob, QuantSettings, RunnableModel
from nemo_convert.qnemo.calibrate_once import calibrate_once, share_awq_search
from nemo_convert.qnemo.job import Job
from nemo_convert.qnemo.plan import DTYPE_NAME, QuantPlan, build_plan, rank_slice
from nemo_convert.qnemo.produce import Producer
from nemo_convert.qnemo.target import TargetPlan, plan_target
from nemo_convert.qnemo.tokenizer import TOKENIZER_CONFIG
from nemo_convert.qnemo.writer import RankStream
from nemo_convert.quant.trtllm_names import QUANT_ALGO, quantization_section
from nemo_convert.workers import SINGLE, Workers, write_together

_NAMED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class QuantStats:
    """What the ``trtllm`` writer wrote (a :class:`~nemo_convert.plugins.records.WriteStats`,
    with what ``quantize``'s report adds)."""

    tensors: int
    bytes: int
    seconds: float
    dtype: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    files: list[str]
    calibration: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    non_finite: dict[str, int] = field(default_factory=dict)


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


def plan_job(job: OutputJob, settings: QuantSettings, model: RunnableModel) -> Job:
    """Plan the family's TensorRT-LLM target over the job's NeMo logical tensors (its plan's
    outputs, :func:`~nemo_convert.mapping.plan_view.plan_view`) and add the quantization;
    nothing is written."""
    fam, cfg = job.family, job.cfg
    table = fam.trtllm
    if not isinstance(table, TrtllmTable):
        raise UnsupportedError(f"model family {fam.name!r} declares no TensorRT-LLM mapping, so it cannot be "
                               "quantized to a .qnemo")
    source = plan_view(job.plan, job.source)
    infos = {k: job.source.info(k) for k in list(job.source.keys())}
    mapping = fam.mapping(cfg)
    model_config = table.config(copy.deepcopy(cfg))
    # a family with a TensorRT-LLM table has no sectioned tensors (those are hybrid stacks')
    kinds = cast(dict[str, Parallel], job.kinds)
    target = plan_target(table, cfg, model_config, source, kinds,
                         [d for part in mapping.parts() for d in part.drop_nemo])
    kv_parts = {n: len(o.parts) for n, o in nemo_origins(mapping, cfg).items()}
    plan = build_plan(target, algo=settings.algo, tp=job.tp, pp=job.pp, ep=job.ep,
                      dtype=_model_dtype(model.config, infos, settings.dtype), group_size=settings.group_size,
                      kv_cache_fp8=settings.kv_cache == "fp8", strategies=job.strategies, kv_parts=kv_parts)
    return Job(fam, target, source, plan, model, dict(job.tokenizer()), list(job.warnings),
               sum(i.numel for i in infos.values()))


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


def _head_members(job: Job) -> list[str]:
    """The tokenizer's members in write order: its files by name, then ``tokenizer_config.yaml``."""
    files = sorted(n for n in job.tok_files if n != TOKENIZER_CONFIG)
    return files + ([TOKENIZER_CONFIG] if TOKENIZER_CONFIG in job.tok_files else [])


def _write_head(sink: MemberSink, config: dict[str, Any], job: Job) -> None:
    """``config.json`` and the tokenizer: the members before the rank files."""
    sink.add_bytes("config.json", (json.dumps(config, indent=2) + "\n").encode("utf-8"))
    for name in _head_members(job):
        sink.add_bytes(name, job.tok_files[name])


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


def write_trtllm_target(job: OutputJob) -> QuantStats:
    """``--to trtllm``: a ``.qnemo`` of ``job`` quantized as ``job.quantization`` says (a
    folder, or a plain tar when ``job.packed``), calibrated on ``job.model``. Appends the
    target's plan's dropped tensors to ``job.dropped`` and its notes and warnings to the job's."""
    settings, model = job.quantization, job.model
    if settings is None or model is None:
        raise UnsupportedError(f"--to trtllm: the {job.command} conversion gives no quantization settings or "
                               "model to calibrate; run nemo-convert quantize")
    t0 = time.perf_counter()
    workers: Workers = SINGLE if job.workers is None else job.workers
    progress: Progress = NoProgress() if job.progress is None else job.progress
    qjob = workers.run_all(lambda: plan_job(job, settings, model))  # every process plans; all agree
    plan = qjob.plan
    plan.quantizer.device, plan.quantizer.awq_grid = settings.device, settings.awq_grid
    _, calib_info = calibrate_once(qjob, workers, settings.device, out=job.out, calib_data=settings.calib_data,
                                   calib_size=settings.calib_size, calib_seq_len=settings.calib_seq_len,
                                   calib_batch_size=settings.calib_batch_size, progress=progress)
    producer = Producer(plan, qjob.source)
    share_awq_search(plan, producer, workers, progress)
    tensors, nbytes = _write_output(job.out, trtllm_config(qjob.target, plan), qjob, producer,
                                    compress=job.packed, overwrite=job.overwrite, progress=progress,
                                    workers=workers)
    if TOKENIZER_CONFIG not in qjob.tok_files:
        job.warnings.append("the source has no tokenizer files; the .qnemo has no tokenizer_config.yaml")
    if job.packed and job.tp > 1 and settings.algo != "none" and workers.world == 1:
        job.notes.append(f"--compress with TP {job.tp}: each tensor was read and quantized once per TP rank")
    job.dropped.extend(plan.dropped)
    files = ["config.json", *_head_members(qjob)] + [r.name for r in plan.ranks]
    return QuantStats(tensors, nbytes, time.perf_counter() - t0, DTYPE_NAME[plan.dtype], QUANT_ALGO.get(settings.algo),
                      "FP8" if plan.kv_cache_fp8 else None, files,
                      None if calib_info is None else calib_info.as_dict())
