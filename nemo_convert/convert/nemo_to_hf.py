"""``.nemo`` → Hugging Face folder."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from nemo_convert.compute import Compute, DeviceOption
from nemo_convert.convert.common import (SECTION, ConversionReport, finite_warning, gc_paused, open_nemo_source,
                                         registry_or_default, tokenizer_rows_warning)
from nemo_convert.convert.export_config import ExportConfig, complete_hf_config, export_config
from nemo_convert.convert.nemo_tokenizer import export_tokenizer
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import Progress, RunStats, apply_dtype, merge_stats, run_plan
from nemo_convert.formats.hf.hf import HFWeightsWriter, json_bytes
from nemo_convert.formats.nemo.nemo import NemoCheckpoint
from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.formats.nemo.nemo_targets import head_names, without
from nemo_convert.formats.io.sink import DirectorySink, MemberSink
from nemo_convert.formats.io.staging import check_target, refuse_overlap
from nemo_convert.hf_config import dtype_name_of_precision, set_dtype_name
from nemo_convert.mapping.planner import Plan, plan_conversion
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import ModelFamily
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


@gc_paused
def export_hf(src: str | os.PathLike[str], out: str | os.PathLike[str], *, dtype: str | torch.dtype | None = None,
              overwrite: bool = False,
              family: str | None = None, max_shard_bytes: int = 5 * 1024**3,
              progress: Progress | None = None, registry: Registry | None = None,
              trust_pickle: bool = False, check_finite: bool = False, device: DeviceOption = "cpu",
              workers: Workers = SINGLE, iteration: int | None = None,
              rope_scaling: bool = True, drop_head: bool = False) -> ConversionReport:
    """Convert a ``.nemo`` (any layout) into a Hugging Face folder that ``transformers``
    loads with no missing or unexpected keys. With several ``workers`` each process
    writes the safetensors shards it owns. ``device`` is where the transforms run
    (:mod:`nemo_convert.compute`): an export's splits are views, so only casts move.
    ``src`` may also be a NeMo 2 folder or a Megatron-Bridge / Megatron-LM checkpoint
    directory (``iteration`` picks its ``iter_XXXXXXX/``).
    A NeMo-native config is completed from the archive (:mod:`.export_config`);
    ``rope_scaling=False`` exports ``scale_positional_embedding: True`` without llama3
    RoPE scaling (NeMo's Llama converter sets it by default). A NeMo-Aligner reward model's
    head is refused by name unless ``drop_head``: then the language model is written (noted)."""
    src, out = os.fspath(src), os.fspath(out)
    compute = Compute.of(device)
    reg = registry_or_default(registry)
    refuse_overlap(src, out)
    check_target(out, overwrite=overwrite, kind="hf", is_dir=True)
    want = parse_dtype(dtype)
    ckpt = open_nemo_source(src, reg, family=family, compute=compute, trust_pickle=trust_pickle,
                            iteration=iteration)
    try:
        fam = reg.family(family) if family else reg.family_for_nemo_config(ckpt.config)
        prep, hf_cfg, plan = plan_to_hf(ckpt, fam, rope_scaling=rope_scaling, dtype=want, drop_head=drop_head)
        cfg, source = prep.cfg, prep.source
        plan.check_finite = check_finite
        tok_files = prep.tokenizer.files()  # before writing: a conversion that fails is a warning
        warnings = prep.warnings + prep.tokenizer.warnings + apply_dtype(plan, want)
        warnings += tokenizer_rows_warning(tok_files, hf_cfg.get("vocab_size"))
        placed = compute.place(plan, source)

        def write_mine(sink: DirectorySink) -> RunStats:
            writer = HFWeightsWriter(sink.root, plan.outputs(), max_shard_bytes=max_shard_bytes,
                                     owned=workers.owns, write_index=workers.is_main)
            mine = Plan(plan.direction, [t for t in placed.tasks if any(writer.wants(o) for o in t.outputs)],
                        plan.dropped, plan.check_finite)
            stats = run_plan(mine, source, writer.write, progress=progress, description="export",
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

        stats = merge_stats(write_together(out, [], write_mine, workers=workers, overwrite=overwrite, packed=False,
                                           kind="hf",
                                           head=head), sequential=False)
        notes = list(getattr(ckpt, "notes", [])) + prep.notes + prep.tokenizer.notes + compute.notes(plan, source)
        warnings = list(getattr(ckpt, "warnings", [])) + warnings
    finally:
        ckpt.close()
        compute.release()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, None, plan.dropped,
                            warnings + finite_warning(stats.non_finite), notes, stats.non_finite)
