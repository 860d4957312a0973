"""Calibration and the AWQ search of ``quantize``, each done once however many processes
run it: calibration in process 0 with its statistics broadcast to all; each linear's AWQ
α searched by one of the processes writing its stage and shared (see :mod:`.driver`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from typing import Any

import torch

from nemo_convert.convert.nemo_to_hf import export_hf
from nemo_convert.engine import Progress
from nemo_convert.plugins.manager import Registry
import nemo_convert.qnemo.calibration as calib
from nemo_convert.qnemo.job import Job
from nemo_convert.qnemo.plan import DTYPE_NAME, Item, QuantPlan
from nemo_convert.qnemo.produce import Producer, check_stats
from nemo_convert.quant.calibrate import Stats
from nemo_convert.workers import Workers


def sized(job: Job, dev: torch.device, calib_size: int | None,
          calib_seq_len: int | None) -> calib.CalibrationSize:
    """The calibration's rows × tokens for this model on ``dev`` (given, or the default)."""
    cfg = job.plan.model_config
    n_params = sum(job.source.info(k).numel for k in job.source.keys())
    return calib.calibration_size(n_params=n_params, num_layers=int(cfg.get("num_hidden_layers") or 1),
                                  hidden=int(cfg.get("hidden_size") or 0),
                                  max_positions=cfg.get("max_position_embeddings"), device=dev,
                                  samples=calib_size, seq_len=calib_seq_len)


def _calibrate(job: Job, src: str, out: str, *, calib_data: str | None, calib_size: int | None,
               calib_seq_len: int | None, calib_batch_size: int, dev: torch.device, reg: Registry,
               trust_pickle: bool, progress: Progress | None = None,
               rope_scaling: bool = True) -> tuple[dict[str, Stats], calib.CalibrationInfo]:
    """Run the model over the calibration text and check every scale input is there."""
    plan, spec = job.plan, job.spec
    tc = time.perf_counter()
    size = sized(job, dev, calib_size, calib_seq_len)
    texts = calib.read_calibration_texts(calib_data)
    folder, tmp = src, None
    try:
        if job.ck.format != "hf":
            parent = os.path.dirname(os.path.abspath(out))
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=".nemo-convert-calib-", dir=parent)
            folder = os.path.join(tmp, "hf")
            export_hf(src, folder, dtype=plan.dtype, registry=reg, family=job.fam.name, trust_pickle=trust_pickle,
                      rope_scaling=rope_scaling)
        ids = calib.calibration_tokens(folder, texts, n=size.samples, seq_len=size.seq_len,
                                       vocab_size=plan.model_config.get("vocab_size"))
        kv_mods = () if spec.kv_cache is None else tuple(
            sorted({spec.kv_cache.k.rsplit(".", 1)[-1], spec.kv_cache.v.rsplit(".", 1)[-1]}))
        stats = calib.calibrate(folder, ids, plan.calibration_modules(), dtype=plan.dtype, device=dev,
                                batch_size=calib_batch_size, kv_modules=kv_mods,
                                max_samples=64 if plan.algo == "int4_awq" else 0,
                                model_class=job.fam.hf.model_class, progress=progress)
        check_stats(plan, stats)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    info = calib.CalibrationInfo(calib_data or "built-in", int(ids.shape[0]), int(ids.shape[1]), int(ids.numel()),
                                 str(dev), DTYPE_NAME[plan.dtype], time.perf_counter() - tc, size.reason)
    return stats, info


def _stats_on(stats: dict[str, Stats], device: torch.device) -> dict[str, Stats]:
    def move(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    return {k: dataclasses.replace(st, input_amax=move(st.input_amax), act_mean=move(st.act_mean),
                                   samples=move(st.samples), output_amax=move(st.output_amax))
            for k, st in stats.items()}


def calibrate_once(job: Job, workers: Workers, dev: torch.device,
                    **kw: Any) -> tuple[dict[str, Stats], calib.CalibrationInfo | None]:
    """Calibrate if the plan needs it: in process 0 only, its statistics shared with every
    process (so every process quantizes with the very same scales)."""
    if not job.plan.needs_calibration:
        return {}, None
    if workers.world == 1:
        return _calibrate(job, dev=dev, **kw)

    def on_main() -> tuple[dict[str, Stats], calib.CalibrationInfo]:
        stats, info = _calibrate(job, dev=dev, **kw)
        return _stats_on(stats, torch.device("cpu")), info

    stats, info = workers.run_on_main(on_main)
    return _stats_on(stats, dev), info


def _awq_items_of(plan: QuantPlan, workers: Workers) -> list[Item]:
    """The linears whose AWQ α this process searches: those of each stage it writes a rank
    file of, dealt round robin among the processes writing that stage."""
    mine: list[Item] = []
    for stage, items in enumerate(plan.stages):
        owners = sorted({r.rank % workers.world for r in plan.ranks if r.pp_rank == stage})
        linears = [it for it in items if it.kind == "linear"]
        mine.extend(it for j, it in enumerate(linears) if owners[j % len(owners)] == workers.rank)
    return mine


def share_awq_search(plan: QuantPlan, producer: Producer, workers: Workers, progress: Progress) -> None:
    """With several processes, AWQ's α of each linear is searched once, in one process, and
    shared with all of them (a process writing TP ranks of a stage needs every α of it)."""
    if plan.algo != "int4_awq" or workers.world == 1:
        return
    mine = _awq_items_of(plan, workers)
    sizes = [sum(producer.source.info(n).nbytes for n in it.sources) for it in mine]

    def search() -> dict[str, float]:
        progress.start("awq search", sum(sizes), len(mine))
        try:
            found: dict[str, float] = {}
            for it, size in zip(mine, sizes):
                found[it.key] = producer.search_awq(it)
                progress.advance(size, 1)
            return found
        finally:
            progress.finish()

    for found in workers.gather(workers.run_all(search)):
        producer.awq_alpha.update(found)
