"""The writers of the built-in output targets (registered by :mod:`.targets`): a ``.nemo``,
a Megatron-Bridge checkpoint directory and a Hugging Face folder
(:func:`~nemo_convert.convert.nemo_to_hf.write_hf_target`), from one :class:`OutputJob`."""

from __future__ import annotations

from nemo_convert.compute import CPU
from nemo_convert.convert.nemo_defaults import declared_by, restore_notes, restore_warnings
from nemo_convert.convert.nemo_to_hf import write_hf_target
from nemo_convert.convert.nemo_write import Parallelism, write_nemo
from nemo_convert.convert.to_megatron_bridge import write_megatron_bridge
from nemo_convert.engine import RunStats
from nemo_convert.plugins.records import OutputJob
from nemo_convert.workers import SINGLE


def _parallelism(job: OutputJob) -> Parallelism:
    return Parallelism(job.tp, job.pp, job.stage_layers, job.ep)


def write_nemo_target(job: OutputJob) -> RunStats:
    """``--to nemo``: a ``.nemo`` in ``job.layout``. A config an import just built is
    checked for what NeMo's ``restore_from`` would need from outside the archive (a
    reshard or a training checkpoint carries its config as NeMo had it)."""
    if job.command == "import":
        nemo = job.family.nemo
        job.warnings.extend(restore_warnings(job.cfg, declared_by(nemo), nemo.restore_warnings))
        job.notes.extend(restore_notes(job.cfg, declared_by(job.family.nemo)))
    if job.layout is None:
        raise ValueError("a .nemo is written in a layout: the conversion sets OutputJob.layout")
    return write_nemo(job.out, job.cfg, job.plan, job.source, layout=job.layout, kinds=job.kinds,
                      par=_parallelism(job), overwrite=job.overwrite, packed=job.packed, progress=job.progress,
                      artifacts=job.artifacts(), unstacked=job.family.nemo.dist_unstacked,
                      extra_states=job.family.nemo.dist_extra_states,
                      workers=SINGLE if job.workers is None else job.workers, strategies=job.strategies,
                      compute=CPU if job.compute is None else job.compute,
                      runtime_defaults=declared_by(job.family.nemo))


def write_megatron_bridge_target(job: OutputJob) -> RunStats:
    """``--to megatron-bridge``: a Megatron-Bridge directory with the family's provider;
    TP × PP × EP are recorded in ``run_config.yaml``, the tokenizer files go to ``tokenizer/``."""
    return write_megatron_bridge(job.out, job.cfg, job.plan, job.source, family=job.family.name, kinds=job.kinds,
                                 par=_parallelism(job), overwrite=job.overwrite, progress=job.progress,
                                 tokenizer=job.tokenizer(), strategies=job.strategies, providers=job.providers,
                                 notes=job.notes, unstacked=job.family.nemo.dist_unstacked,
                                 extra_states=job.family.nemo.dist_extra_states)


__all__ = ["write_hf_target", "write_megatron_bridge_target", "write_nemo_target"]
