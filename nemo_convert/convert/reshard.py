"""``.nemo`` → ``.nemo`` with another tensor/pipeline parallelism or weights layout.

Any layout and TP×PP in (dist, legacy, legacy per-rank, NeMo 2.0 folders), any out; each
output tensor is assembled from just the input slices it needs, one tensor at a time.
"""

from __future__ import annotations

import os
from typing import Any

from nemo_convert.compute import Compute, DeviceOption
from nemo_convert.convert.common import (SECTION, ConversionReport, finite_warning, gc_paused, open_nemo_source,
                                         registry_or_default)
from nemo_convert.convert.export_config import complete_config
from nemo_convert.convert.nemo_to_hf import tokenizer_files
from nemo_convert.convert.output import check_output, choose_target, write_output
from nemo_convert.engine import Progress
from nemo_convert.formats.nemo.nemo import CONFIG_MEMBER, NemoCheckpoint, artifact_name
from nemo_convert.formats.nemo.nemo_ranks import WEIGHTS
from nemo_convert.formats.io.staging import refuse_overlap
from nemo_convert.formats.nemo.nemo_weights import LAYOUTS
from nemo_convert.errors import NemoConvertError
from nemo_convert.mapping.planner import identity_plan, nemo_parallel_kinds, plan_conversion
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import OutputJob
from nemo_convert.workers import SINGLE, Workers
from nemo_convert.sharding.layout import parse_rank_dir


#: The source formats whose tokenizer files (``nemo_convert.tokenizer_files``) a ``.nemo``
#: written from them carries as ``nemo:`` artifacts (:func:`carried_artifacts`).
FOLDER_SOURCES = ("nemo2", "megatron-bridge", "megatron-lm")


def carried_tokenizer_section(refs: dict[str, str]) -> dict[str, Any] | None:
    """The ``tokenizer:`` section of a ``.nemo`` written from one of :data:`FOLDER_SOURCES`,
    whose tokenizer files are ``refs`` ({name in ``tokenizer_files``: reference to the file}):
    a SentencePiece model is named by its reference; None (the source's section is kept)
    for any other tokenizer. ``quantize`` of such a source writes the section the ``.nemo``
    would give (:func:`nemo_convert.qnemo.tokenizer.tokenizer_from_nemo`)."""
    if "tokenizer.model" not in refs:
        return None
    return {"library": "sentencepiece", "type": None, "model": refs["tokenizer.model"]}


def carried_artifacts(ckpt: NemoCheckpoint, cfg: dict) -> list[tuple[str, bytes]]:  # type: ignore[type-arg]
    """The non-weight members of a ``.nemo`` (tokenizer files, …) to copy into a new one;
    files a NeMo 2 folder keeps in ``context/`` become ``nemo:`` artifacts."""
    if (cfg.get(SECTION) or {}).get("source_format") in FOLDER_SOURCES:
        files = cfg[SECTION].get("tokenizer_files") or {}
        out, refs = [], {}
        for name, ref in files.items():
            data = ckpt.artifact(ref)
            member = artifact_name(data, name)
            out.append((member, data))
            refs[name] = "nemo:" + member
        cfg[SECTION]["tokenizer_files"] = refs
        section = carried_tokenizer_section(refs)
        if section is not None:
            cfg["tokenizer"] = section
        return out
    skip_dirs = {"model_weights"}
    out = []
    for name in ckpt.container.names():
        rel = name[len(ckpt.prefix):] if name.startswith(ckpt.prefix) else name
        top = rel.split("/", 1)[0]
        if rel in (CONFIG_MEMBER, WEIGHTS) or top in skip_dirs or parse_rank_dir(top) is not None:
            continue
        out.append((rel, ckpt.container.read_bytes(name)))
    return out


@gc_paused
def reshard(src: str | os.PathLike[str], out: str | os.PathLike[str], *, tp: int = 1, pp: int = 1, ep: int = 1,
            layout: str | None = None,
            stage_layers: tuple[int, ...] | None = None, overwrite: bool = False, packed: bool = True,
            family: str | None = None, progress: Progress | None = None, registry: Registry | None = None,
            trust_pickle: bool = False, check_finite: bool = False, device: DeviceOption = "cpu",
            workers: Workers = SINGLE, to: str = "nemo", iteration: int | None = None) -> ConversionReport:
    """Rewrite a ``.nemo`` at another TP×PP and/or weights layout (``dist`` or ``legacy``).

    Any checkpoint :func:`~nemo_convert.formats.open_any.open_model_checkpoint` reads is a source: a
    ``.nemo`` of any layout, a NeMo 2 folder, a Megatron-Bridge or Megatron-LM directory
    (``iteration`` picks its ``iter_XXXXXXX/``). With ``to="megatron-bridge"`` the output is
    a Megatron-Bridge checkpoint directory recording ``tp``/``pp`` in ``run_config.yaml``;
    with ``to="hf"`` a Hugging Face folder (as ``export`` writes it); ``to`` may name any
    installed output target (:mod:`nemo_convert.convert.output`).

    The output is checked to be a complete model of its family before anything is written.
    ``device`` is where the transforms run (:mod:`nemo_convert.compute`): a reshard's
    tasks are copies, so only the per-rank writer's splits that build new tensors move.
    """
    src, out = os.fspath(src), os.fspath(out)
    reg = registry_or_default(registry)
    target = choose_target(reg, to, layout=layout, workers=workers)
    compute = Compute.of(device)
    refuse_overlap(src, out)
    check_output(target, out, overwrite=overwrite, packed=packed)
    ckpt = open_nemo_source(src, reg, family=family, compute=compute, trust_pickle=trust_pickle,
                            iteration=iteration)
    try:
        fam = reg.family(family) if family else reg.family_for_nemo_config(ckpt.config)
        prep = complete_config(ckpt, fam)  # a NeMo-native config: record the true vocabulary
        cfg, source = prep.cfg, prep.source
        layout = layout or ckpt.layout
        if layout not in LAYOUTS:
            raise NemoConvertError(f"unknown layout {layout!r} (use {' or '.join(LAYOUTS)})")
        mapping = fam.mapping(cfg)
        plan_conversion(mapping, cfg, source, "to_hf")  # proves the checkpoint is complete
        kinds = nemo_parallel_kinds(mapping, cfg)
        plan = identity_plan(source, kinds)
        plan.check_finite = check_finite
        notes = [f"TP={tp} PP={pp}" + (f" EP={ep}" if ep != 1 else "")] + list(getattr(ckpt, "notes", []))
        warnings = list(getattr(ckpt, "warnings", [])) + prep.warnings
        job = OutputJob("reshard", out, cfg, plan, source, fam, kinds, reg.strategies(), reg.providers(),
                        tp=tp, pp=pp, ep=ep, stage_layers=stage_layers, layout=layout, packed=packed,
                        overwrite=overwrite, progress=progress, workers=workers, compute=compute,
                        artifacts=lambda: carried_artifacts(ckpt, cfg), tokenizer=lambda: tokenizer_files(ckpt),
                        notes=notes, warnings=warnings, hf_defaults=prep.hf_defaults)
        stats, layout = write_output(target, job)
        notes += compute.notes(plan, source)
    finally:
        ckpt.close()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, layout, dropped=job.dropped,
                            warnings=warnings + finite_warning(stats.non_finite), notes=notes,
                            non_finite=stats.non_finite)
