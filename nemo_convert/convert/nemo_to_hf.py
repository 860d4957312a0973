"""``.nemo`` → Hugging Face folder."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from nemo_convert.compute import CPU, Compute, DeviceOption
from nemo_convert.convert.common import (SECTION, ConversionReport, finite_warning, gc_paused, open_nemo_source,
                                         registry_or_default, tokenizer_rows_warning)
from nemo_convert.convert.export_config import (ExportConfig, complete_config, complete_hf_config, config_defaults,
                                                export_config, rope_scaling_as_run)
from nemo_convert.convert.nemo_tokenizer import export_tokenizer, special_ids_of
from nemo_convert.convert.output import check_output, choose_target, write_output
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import Progress, RunStats, apply_dtype, merge_stats, run_plan
from nemo_convert.formats.hf.hf import HFWeightsWriter, json_bytes
from nemo_convert.formats.nemo.nemo import NemoCheckpoint
from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.formats.nemo.nemo_targets import head_names, without
from nemo_convert.formats.io.sink import DirectorySink, MemberSink
from nemo_convert.formats.io.staging import refuse_overlap
from nemo_convert.hf_config import dtype_name_of_precision, set_dtype_name
from nemo_convert.mapping.plan_view import plan_view
from nemo_convert.mapping.planner import Plan, identity_plan, nemo_parallel_kinds, plan_conversion
from nemo_convert.mapping.rules import Parallel
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import ModelFamily, OutputJob
from nemo_convert.spec import recorded_vocab
from nemo_convert.workers import SINGLE, Workers, write_together

DTYPE_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def tokenizer_files(ckpt: NemoCheckpoint) -> dict[str, bytes]:
    """The tokenizer files export writes for a ``.nemo``, under their HF names
    (:mod:`~nemo_convert.convert.nemo_tokenizer`: the HF originals our section names, else the
    tokenizer NeMo's ``tokenizer:`` section describes)."""
    return export_tokenizer(ckpt, facts=False).files()


def hf_config_of(fam: ModelFamily, cfg: dict[str, Any], dtype: torch.dtype | None = None,
                 defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` that export writes for a NeMo config (and an optional cast);
    ``defaults`` (:func:`~nemo_convert.convert.export_config.export_config`) fill the keys
    the family leaves out."""
    try:
        hf_cfg = complete_hf_config(fam.config_to_hf(copy.deepcopy(cfg)), defaults or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the NeMo config does not describe a {fam.name} model: {type(exc).__name__}: {exc}") from None
    if dtype is not None:
        set_dtype_name(hf_cfg, DTYPE_NAME[dtype])
    elif ("dtype" in hf_cfg or "torch_dtype" in hf_cfg) and "precision" in cfg:
        set_dtype_name(hf_cfg, dtype_name_of_precision(cfg["precision"]))
    return hf_cfg


def drop_reward_head(ckpt: Any, prep: ExportConfig, drop_head: bool) -> None:
    """NeMo-Aligner's reward head (:mod:`~nemo_convert.formats.nemo.nemo_targets`): no HF class
    holds it exactly (every ``*ForSequenceClassification.score`` is a ``Linear`` without bias,
    transformers 5.24 ``modeling_layers.py`` line 138), so it is refused by name, or with
    ``drop_head`` left out of ``prep.source`` (noted): the language model is what is written."""
    head = head_names(prep.source)
    if not head:
        return
    shapes = " + ".join(f"{k} {list(prep.source.info(k).shape)}" for k in head)
    if not drop_head:
        raise UnsupportedError(f"{ckpt.path}: the checkpoint holds NeMo-Aligner's reward head ({shapes}), which no "
                               "Hugging Face class holds exactly (*ForSequenceClassification.score has no bias); "
                               "pass --drop-head to write the language model without it")
    prep.source = without(prep.source, head)
    prep.notes.append(f"left out the reward head ({shapes}, --drop-head): the language model is written")


def plan_to_hf(ckpt: Any, fam: ModelFamily, *, rope_scaling: bool = True,
               dtype: torch.dtype | None = None, drop_head: bool = False) -> tuple[ExportConfig, dict[str, Any], Plan]:
    """A ``.nemo`` as export sees it (also ``verify`` and ``quantize``): its config completed
    (:func:`~nemo_convert.convert.export_config.export_config`), the ``config.json`` written
    for it (with an optional cast) and the ``to_hf`` plan over the completed source; a reward
    head refused or, with ``drop_head``, left out (:func:`drop_reward_head`)."""
    prep = export_config(ckpt, fam, rope_scaling=rope_scaling)
    drop_reward_head(ckpt, prep, drop_head)
    hf_cfg = hf_config_of(fam, prep.cfg, dtype, prep.hf_defaults)
    return prep, hf_cfg, plan_conversion(fam.mapping(prep.cfg), prep.cfg, prep.source, "to_hf")


#: export's default largest safetensors shard (``export_hf``'s ``max_shard_bytes``).
MAX_SHARD_BYTES = 5 * 1024**3


def write_hf_target(job: OutputJob) -> RunStats:
    """``--to hf``: a Hugging Face folder from ``job``, whose plan holds NeMo logical tensors.

    The family's ``to_hf`` plan is made over the job's plan outputs
    (:func:`~nemo_convert.mapping.plan_view.plan_view`: the source itself when the job's
    plan is its identity, as for ``export``, ``reshard`` and ``from-ckpt``), cast to
    ``job.dtype``, and written as safetensors shards of at most ``job.max_shard_bytes``
    (each of several ``job.workers`` writes the shards it owns) with ``config.json``
    (:func:`hf_config_of` over ``job.cfg`` with RoPE scaling as NeMo runs it unless
    ``job.rope_scaling`` is False, and ``job.hf_defaults``), the NeMo section's
    ``generation_config.json`` and ``job.tokenizer()``'s files. ``import`` is refused: its
    source is a Hugging Face folder already."""
    if job.command == "import":
        raise UnsupportedError("import --to hf: the source is a Hugging Face folder already; import writes the "
                               "NeMo formats (export writes a .nemo back to Hugging Face)")
    fam = job.family
    cfg = copy.deepcopy(job.cfg)
    rope_scaling_as_run(cfg, job.rope_scaling, job.warnings)
    source = plan_view(job.plan, job.source)
    defaults = job.hf_defaults
    tok_files: dict[str, bytes] | None = None
    if defaults is None:  # what the NeMo config, the tokenizer files and the tensors tell
        defaults = config_defaults(cfg)
        tok_files = job.tokenizer()
        defaults.update(special_ids_of(tok_files))
        vocab = recorded_vocab(cfg)
        keys = set(source.keys())
        rows = [source.info(k).shape[0] for k, v in job.kinds.items() if v is Parallel.VOCAB and k in keys]
        if vocab is not None or rows:  # unknown (the conversion warned): the embedding's rows
            defaults["vocab_size"] = vocab if vocab is not None else min(rows)
    hf_cfg = hf_config_of(fam, cfg, job.dtype, defaults)
    plan = plan_conversion(fam.mapping(cfg), cfg, source, "to_hf")
    plan.check_finite = job.plan.check_finite
    job.dropped.extend(plan.dropped)
    if tok_files is None:
        tok_files = job.tokenizer()  # before writing: a conversion that fails is a warning
    job.warnings.extend(apply_dtype(plan, job.dtype))
    job.warnings.extend(tokenizer_rows_warning(tok_files, hf_cfg.get("vocab_size")))
    if (job.tp, job.pp, job.ep) != (1, 1, 1) or job.stage_layers is not None:
        job.notes.append(f"a Hugging Face folder holds whole tensors: TP={job.tp} PP={job.pp} EP={job.ep} "
                         "is not recorded")
    compute = CPU if job.compute is None else job.compute
    workers = SINGLE if job.workers is None else job.workers
    max_shard_bytes = MAX_SHARD_BYTES if job.max_shard_bytes is None else job.max_shard_bytes
    placed = compute.place(plan, source)

    def write_mine(sink: DirectorySink) -> RunStats:
        writer = HFWeightsWriter(sink.root, plan.outputs(), max_shard_bytes=max_shard_bytes,
                                 owned=workers.owns, write_index=workers.is_main)
        mine = Plan(plan.direction, [t for t in placed.tasks if any(writer.wants(o) for o in t.outputs)],
                    plan.dropped, plan.check_finite)
        stats = run_plan(mine, source, writer.write, progress=job.progress, description=job.command,
                         lazy=not compute.active)  # the safetensors writer takes pieces
        writer.close()
        return stats

    def head(final: MemberSink) -> None:
        final.add_bytes("config.json", json_bytes(hf_cfg))
        gen = (cfg.get(SECTION) or {}).get("hf_generation_config")
        if gen is not None:
            final.add_bytes("generation_config.json", json_bytes(gen))
        for name, data in tok_files.items():
            final.add_bytes(name, data)

    stats = merge_stats(write_together(job.out, [], write_mine, workers=workers, overwrite=job.overwrite,
                                       packed=False, kind="hf", head=head), sequential=False)
    job.notes.extend(compute.notes(plan, source))
    return stats


@gc_paused
def export_hf(src: str | os.PathLike[str], out: str | os.PathLike[str], *, dtype: str | torch.dtype | None = None,
              overwrite: bool = False,
              family: str | None = None, max_shard_bytes: int = MAX_SHARD_BYTES,
              progress: Progress | None = None, registry: Registry | None = None,
              trust_pickle: bool = False, check_finite: bool = False, device: DeviceOption = "cpu",
              workers: Workers = SINGLE, iteration: int | None = None,
              rope_scaling: bool = True, drop_head: bool = False) -> ConversionReport:
    """Convert a ``.nemo`` (any layout) into a Hugging Face folder that ``transformers``
    loads with no missing or unexpected keys, through the one output step
    (:mod:`~nemo_convert.convert.output`, target ``hf``: :func:`write_hf_target`). With
    several ``workers`` each process writes the safetensors shards it owns. ``device`` is
    where the transforms run (:mod:`nemo_convert.compute`): an export's splits are views,
    so only casts move.
    ``src`` may also be a NeMo 2 folder or a Megatron-Bridge / Megatron-LM checkpoint
    directory (``iteration`` picks its ``iter_XXXXXXX/``).
    A NeMo-native config is completed from the archive (:mod:`.export_config`);
    ``rope_scaling=False`` exports ``scale_positional_embedding: True`` without llama3
    RoPE scaling (NeMo's Llama converter sets it by default). A NeMo-Aligner reward model's
    head is refused by name unless ``drop_head``: then the language model is written (noted)."""
    src, out = os.fspath(src), os.fspath(out)
    reg = registry_or_default(registry)
    target = choose_target(reg, "hf", workers=workers)
    compute = Compute.of(device)
    refuse_overlap(src, out)
    check_output(target, out, overwrite=overwrite, packed=False)
    want = parse_dtype(dtype)
    ckpt = open_nemo_source(src, reg, family=family, compute=compute, trust_pickle=trust_pickle,
                            iteration=iteration)
    try:
        fam = reg.family(family) if family else reg.family_for_nemo_config(ckpt.config)
        prep = complete_config(ckpt, fam)
        drop_reward_head(ckpt, prep, drop_head)
        kinds = nemo_parallel_kinds(fam.mapping(prep.cfg), prep.cfg)
        plan = identity_plan(prep.source, kinds)
        plan.check_finite = check_finite
        notes = list(getattr(ckpt, "notes", [])) + prep.notes
        warnings = list(getattr(ckpt, "warnings", [])) + prep.warnings
        tokenizer = prep.tokenizer

        def tokenizer_files() -> dict[str, bytes]:
            files = tokenizer.files()  # its warnings and notes follow the config's, as the report lists them
            warnings.extend(tokenizer.warnings)
            notes.extend(tokenizer.notes)
            return files

        job = OutputJob("export", out, prep.cfg, plan, prep.source, fam, kinds, reg.strategies(), reg.providers(),
                        overwrite=overwrite, progress=progress, workers=workers, compute=compute,
                        tokenizer=tokenizer_files, notes=notes, warnings=warnings, dtype=want,
                        max_shard_bytes=max_shard_bytes, rope_scaling=rope_scaling, hf_defaults=prep.hf_defaults)
        stats, _ = write_output(target, job)
    finally:
        ckpt.close()
        compute.release()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, None, job.dropped,
                            job.warnings + finite_warning(stats.non_finite), job.notes, stats.non_finite)
