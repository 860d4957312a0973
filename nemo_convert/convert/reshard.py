"""``.nemo`` → ``.nemo`` with another tensor/pipeline parallelism or weights layout.

Any layout and TP×PP in (dist, legacy, legacy per-rank, NeMo 2.0 folders), any out; each
output tensor is assembled from just the input slices it needs, one tensor at a time.
"""

from __future__ import annotations

import os
from nemo_convert.compute import Compute, DeviceOption
from nemo_convert.convert.common import (gc_paused, SECTION, ConversionReport, finite_warning, open_nemo_source,
                                         registry_or_default)
from nemo_convert.convert.export_config import complete_config
from nemo_convert.convert.nemo_to_hf import tokenizer_files
from nemo_convert.convert.nemo_write import Parallelism, write_nemo
from nemo_convert.convert.to_megatron_bridge import TARGET, check_target_kind, write_megatron_bridge
from nemo_convert.engine import Progress
from nemo_convert.formats.nemo.nemo import CONFIG_MEMBER, NemoCheckpoint, artifact_name
from nemo_convert.formats.nemo.nemo_ranks import WEIGHTS
from nemo_convert.formats.io.staging import check_target, refuse_overlap
from nemo_convert.formats.nemo.nemo_weights import LAYOUTS
from nemo_convert.errors import NemoConvertError
from nemo_convert.mapping.planner import identity_plan, nemo_parallel_kinds, plan_conversion
from nemo_convert.plugins.manager import Registry
from nemo_convert.workers import SINGLE, Workers
from nemo_convert.sharding.layout import parse_rank_dir


def carried_artifacts(ckpt: NemoCheckpoint, cfg: dict) -> list[tuple[str, bytes]]:  # type: ignore[type-arg]
    """The non-weight members of a ``.nemo`` (tokenizer files, …) to copy into a new one;
    files a NeMo 2 folder keeps in ``context/`` become ``nemo:`` artifacts."""
    if (cfg.get(SECTION) or {}).get("source_format") in ("nemo2", "megatron-bridge", "megatron-lm"):
        files = cfg[SECTION].get("tokenizer_files") or {}
        out, refs = [], {}
        for name, ref in files.items():
            data = ckpt.artifact(ref)
            member = artifact_name(data, name)
            out.append((member, data))
            refs[name] = "nemo:" + member
        cfg[SECTION]["tokenizer_files"] = refs
        if "tokenizer.model" in refs:
            cfg["tokenizer"] = {"library": "sentencepiece", "type": None, "model": refs["tokenizer.model"]}
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
    a Megatron-Bridge checkpoint directory recording ``tp``/``pp`` in ``run_config.yaml``.

    The output is checked to be a complete model of its family before anything is written.
    ``device`` is where the transforms run (:mod:`nemo_convert.compute`): a reshard's
    tasks are copies, so only the per-rank writer's splits that build new tensors move.
    """
    src, out = os.fspath(src), os.fspath(out)
    check_target_kind(to, workers, layout)
    compute = Compute.of(device)
    reg = registry_or_default(registry)
    refuse_overlap(src, out)
    check_target(out, overwrite=overwrite, kind="megatron-bridge" if to == TARGET else "nemo",
                 is_dir=to == TARGET or not packed)
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
        if to == TARGET:
            stats = write_megatron_bridge(out, cfg, plan, source, family=fam.name, kinds=kinds,
                                          par=Parallelism(tp, pp, stage_layers, ep), overwrite=overwrite,
                                          progress=progress, tokenizer=tokenizer_files(ckpt),
                                          strategies=reg.strategies(), providers=reg.providers(), notes=notes)
            layout = TARGET
        else:
            artifacts = carried_artifacts(ckpt, cfg)
            stats = write_nemo(out, cfg, plan, source, layout=layout, kinds=kinds,
                               par=Parallelism(tp, pp, stage_layers, ep), overwrite=overwrite, packed=packed,
                               progress=progress, artifacts=artifacts, unstacked=fam.nemo.dist_unstacked,
                               extra_states=fam.nemo.dist_extra_states,
                               workers=workers, strategies=reg.strategies(), compute=compute)
        notes += compute.notes(plan, source)
    finally:
        ckpt.close()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, layout,
                            warnings=warnings + finite_warning(stats.non_finite), notes=notes,
                            non_finite=stats.non_finite)
