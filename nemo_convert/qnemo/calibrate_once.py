"""Calibration and the AWQ search of ``quantize``, each done once however many processes
run it: calibration in process 0 with its statistics broadcast to all; each linear's AWQ
α searched by one of the processes writing its stage and shared (see :mod:`.driver`).

Which HF modules calibrate a linear is asked of the family, never assumed: transformers may
hold a checkpoint in another spelling than the files (v5 keeps a MoE layer's experts as one
fused module), so the loaded model's parameter names are read like a source's on import
(the family's ``options.from_source``), and the family's mapping for that spelling says
where each NeMo tensor comes from (:meth:`~nemo_convert.mapping.rules.Rule.origins`)."""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from nemo_convert.convert.hf_to_nemo import nemo_config_of
from nemo_convert.engine import Progress
from nemo_convert.errors import MappingError
from nemo_convert.mapping.planner import Origin, nemo_origins
import nemo_convert.qnemo.calibration as calib
from nemo_convert.qnemo.job import Job
from nemo_convert.qnemo.plan import DTYPE_NAME, Item, QuantPlan
from nemo_convert.qnemo.produce import Producer
from nemo_convert.qnemo.quantizer import CALIBRATED, Linear, check_stats
from nemo_convert.quant.calibrate import Stats
from nemo_convert.workers import Workers

#: linear key / KV-cache scale name → the calibration module names of its statistics
Modules = dict[str, tuple[str, ...]]


def sized(job: Job, dev: torch.device, calib_size: int | None,
          calib_seq_len: int | None) -> calib.CalibrationSize:
    """The calibration's rows × tokens for this model on ``dev`` (given, or the default)."""
    cfg = job.plan.model_config
    n_params = job.n_params
    return calib.calibration_size(n_params=n_params, num_layers=int(cfg.get("num_hidden_layers") or 1),
                                  hidden=int(cfg.get("hidden_size") or 0),
                                  max_positions=cfg.get("max_position_embeddings"), device=dev,
                                  samples=calib_size, seq_len=calib_seq_len)


def _module_keys(origin: Origin, part: int | None) -> list[str]:
    """Calibration names of one NeMo tensor's HF origin (``part``: one of its parts):
    a ``Linear`` module's name, or ``{param}.{e}`` for expert ``e`` of a fused-experts module."""
    parts = (origin.parts[part],) if part is not None and len(origin.parts) > 1 else origin.parts
    return [p.removesuffix(".weight") if origin.slot is None else f"{p}.{origin.slot}" for p in parts]


def calibration_modules(job: Job, hf_cfg: dict[str, Any], names: Sequence[str]) -> Modules:
    """Which modules of the model transformers loaded (parameter ``names``) calibrate each
    quantized linear and KV-cache scale of the plan."""
    fam, plan = job.fam, job.plan
    opts = fam.options.from_source(copy.deepcopy(hf_cfg), list(names)) if fam.options.from_source else {}
    cfg = nemo_config_of(fam, hf_cfg, job.ignore_config_keys, opts)
    origins = nemo_origins(fam.mapping(cfg), cfg)

    def keys(refs: Sequence[tuple[str, int | None]], what: str) -> tuple[str, ...]:
        out: list[str] = []
        for nemo, part in refs:
            origin = origins.get(nemo)
            if origin is None:
                raise MappingError(f"calibration: the loaded model has no HF origin for {nemo} ({what})")
            out.extend(k for k in _module_keys(origin, part) if k not in out)
        return tuple(out)

    modules: Modules = {}
    if plan.algo in CALIBRATED:
        modules.update({lin.key: keys(lin.refs, lin.key) for lin in plan.linears()})
    for name, qkv in plan.kv_of.items():
        parts = keys([(qkv, None)], name)
        modules[name] = parts[1:3]  # the origin's q, k, v: K and V
    return modules


def _calibrate(job: Job, out: str, *, calib_data: str | None, calib_size: int | None,
               calib_seq_len: int | None, calib_batch_size: int, dev: torch.device,
               progress: Progress | None = None) -> tuple[dict[str, Stats], calib.CalibrationInfo, Modules]:
    """Run the model over the calibration text and check every scale input is there. The
    model is the job's :class:`~nemo_convert.plugins.records.RunnableModel`: an HF source's
    own folder, or an export of the source into a scratch folder beside ``out``."""
    plan = job.plan
    tc = time.perf_counter()
    size = sized(job, dev, calib_size, calib_seq_len)
    texts = calib.read_calibration_texts(calib_data)
    chosen: Modules = {}
    with job.model.folder(plan.dtype, os.path.dirname(os.path.abspath(out))) as (folder, hf_cfg):
        ids = calib.calibration_tokens(folder, texts, n=size.samples, seq_len=size.seq_len,
                                       vocab_size=plan.model_config.get("vocab_size"))

        def select(names: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
            chosen.update(calibration_modules(job, hf_cfg, names))
            mods = list(dict.fromkeys(m for ms in chosen.values() for m in ms))
            kv = tuple(sorted({m.rsplit(".", 1)[-1] for name in plan.kv_of for m in chosen[name]}))
            return mods, kv

        stats = calib.calibrate(folder, ids, select, dtype=plan.dtype, device=dev,
                                batch_size=calib_batch_size, max_samples=64 if plan.algo == "int4_awq" else 0,
                                model_class=job.fam.hf.model_class, progress=progress)
        plan.quantizer.calibrated(stats, chosen)
        check_stats(plan.quantizer, [lin.key for lin in plan.linears()], list(plan.kv_of))
    info = calib.CalibrationInfo(calib_data or "built-in", int(ids.shape[0]), int(ids.shape[1]), int(ids.numel()),
                                 str(dev), DTYPE_NAME[plan.dtype], time.perf_counter() - tc, size.reason)
    return stats, info, chosen


def _stats_on(stats: dict[str, Stats], device: torch.device) -> dict[str, Stats]:
    def move(t: Any) -> Any:  # a tensor, or None where a statistic is optional
        return None if t is None else t.to(device)

    return {k: dataclasses.replace(st, input_amax=move(st.input_amax), act_mean=move(st.act_mean),
                                   samples=move(st.samples), output_amax=move(st.output_amax))
            for k, st in stats.items()}


def calibrate_once(job: Job, workers: Workers, dev: torch.device,
                    **kw: Any) -> tuple[dict[str, Stats], calib.CalibrationInfo | None]:
    """Calibrate if the plan needs it: in process 0 only, its statistics shared with every
    process (so every process quantizes with the very same scales); the plan's quantizer
    holds them."""
    if not job.plan.needs_calibration:
        return {}, None
    if workers.world == 1:
        stats, info, _ = _calibrate(job, dev=dev, **kw)
        return stats, info

    def on_main() -> tuple[dict[str, Stats], calib.CalibrationInfo, Modules]:
        stats, info, modules = _calibrate(job, dev=dev, **kw)
        return _stats_on(stats, torch.device("cpu")), info, modules

    stats, info, modules = workers.run_on_main(on_main)
    stats = _stats_on(stats, dev)
    job.plan.quantizer.calibrated(stats, modules)
    return stats, info


def _awq_linears_of(plan: QuantPlan, workers: Workers) -> list[tuple[Item, Linear]]:
    """The linears whose AWQ α this process searches: those of each stage it writes a rank
    file of, dealt round robin among the processes writing that stage."""
    mine: list[tuple[Item, Linear]] = []
    for stage, items in enumerate(plan.stages):
        owners = sorted({r.rank % workers.world for r in plan.ranks if r.pp_rank == stage})
        linears = [(it, lin) for it in items for lin in it.linears]
        mine.extend(x for j, x in enumerate(linears) if owners[j % len(owners)] == workers.rank)
    return mine


def share_awq_search(plan: QuantPlan, producer: Producer, workers: Workers, progress: Progress) -> None:
    """With several processes, AWQ's α of each linear is searched once, in one process, and
    shared with all of them (a process writing TP ranks of a stage needs every α of it)."""
    if plan.algo != "int4_awq" or workers.world == 1:
        return
    mine = _awq_linears_of(plan, workers)
    sizes = [sum(producer.source.info(n).nbytes for n in it.tasks[0].inputs) for it, _ in mine]

    def search() -> dict[str, float]:
        progress.start("awq search", sum(sizes), len(mine))
        try:
            found: dict[str, float] = {}
            for (it, lin), size in zip(mine, sizes):
                found[lin.key] = producer.search_awq(it, lin)
                progress.advance(size, 1)
            return found
        finally:
            progress.finish()

    for found in workers.gather(workers.run_all(search)):
        plan.quantizer.awq_alpha.update(found)
