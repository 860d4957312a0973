"""PyTorch Lightning training checkpoint → ``.nemo`` (NeMo's ``megatron_ckpt_to_nemo``,
in one process, without NeMo, a GPU or executing anything the checkpoint pickled).

The source is one ``.ckpt``, a folder of per-rank ``.ckpt`` files, or a distributed
(``torch_dist``) checkpoint folder (:mod:`nemo_convert.formats.ptl.ptl_ckpt`). The model
config comes from the checkpoint's ``hyper_parameters.cfg`` or a Lightning
``hparams.yaml``; the tokenizer files it names are packed as ``nemo:`` artifacts. Training
state (optimizer, schedulers, loops, callbacks, Transformer-Engine ``_extra_state``) is
dropped and its size reported. The output can be written at any TP×PP and layout in the
same pass, one tensor at a time.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any


from nemo_convert import __version__
from nemo_convert.convert.ckpt_config import model_config, read_hparams, yaml_ready
from nemo_convert.convert.common import SECTION, ConversionReport, dict_at, gc_paused, registry_or_default
from nemo_convert.convert.output import check_output, choose_target, write_output
from nemo_convert.convert.vocab import true_vocab_size
from nemo_convert.engine import Progress
from nemo_convert.errors import (
    InputError,
    MappingError,
    NemoConvertError,
    ShapeError,
    UnsupportedError,
)
from nemo_convert.formats.dist_checkpoint.sections import join_sections
from nemo_convert.formats.nemo.nemo import VocabTrimView, artifact_name
from nemo_convert.formats.nemo.nemo_weights import LAYOUTS
from nemo_convert.formats.ptl.ptl_ckpt import TrainingCheckpoint, locate, open_training_checkpoint
from nemo_convert.mapping.planner import identity_plan, nemo_parallel_kinds, plan_conversion
from nemo_convert.mapping.rules import Parallel
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import OutputJob
from nemo_convert.sharding.layout import embedding_on_last_stage
from nemo_convert.tensors.base import TensorSource

#: The tokenizer fields of a NeMo model config that name files (``register_artifact``).
TOKENIZER_FILE_KEYS = ("model", "vocab_file", "merge_file")
_HASHED = re.compile(r"^[0-9a-f]{32}_(?P<base>.+)$")


@dataclass
class CkptConversionReport(ConversionReport):
    """What ``from-ckpt`` did. ``dropped`` lists the model entries that are not weights
    (``_extra_state``…); ``dropped_sections`` sizes the training state left behind."""

    source_kind: str = ""  # "ckpt", "per-rank" or "dist"
    source_files: list[str] = field(default_factory=list)
    source_tp: int = 1
    source_pp: int = 1
    tp: int = 1
    pp: int = 1
    config_from: str = ""  # "hyper_parameters.cfg" or the hparams file
    checkpoint: dict[str, Any] = field(default_factory=dict)  # epoch, global_step, Lightning version
    dropped_tensors: int = 0
    dropped_bytes: int = 0
    dropped_sections: dict[str, dict[str, int]] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)  # original reference -> nemo: reference
    vocab_size: int | None = None


# ----------------------------------------------------------------------------- config
# -------------------------------------------------------------------------- tokenizer
def _artifact_basename(ref: str) -> str:
    name = os.path.basename(ref.removeprefix("nemo:"))
    m = _HASHED.match(name)
    return m["base"] if m else name


def _resolve(ref: str, bases: list[str]) -> tuple[str | None, list[str]]:
    """The local file a config reference names, and the paths tried."""
    tried: list[str] = []
    if ref.startswith("nemo:"):  # a file of the .nemo the run was restored from
        names = list(dict.fromkeys([ref[5:], _artifact_basename(ref)]))
        tried = [os.path.join(b, n) for b in bases for n in names]
    elif os.path.isabs(ref):
        tried = [ref]
    else:
        tried = [os.path.join(b, ref) for b in bases]
    for p in tried:
        if os.path.isfile(p):
            return p, tried
    return None, tried


def pack_tokenizer_files(cfg: dict[str, Any], bases: list[str], *, allow_missing: bool = False
                         ) -> tuple[list[tuple[str, bytes]], dict[str, str], dict[str, bytes], list[str]]:
    """Pack every file the config's tokenizer names as a ``nemo:`` artifact and rewrite the
    references. Returns ``(artifacts, {old ref: new ref}, {config field: bytes}, warnings)``.

    Relative paths are looked up in ``bases`` in order; ``nemo:<name>`` references (a run
    restored from a ``.nemo``) by their name with and without NeMo's hash prefix.
    """
    tok = dict_at(cfg, "tokenizer")
    ours = dict_at(cfg, SECTION)
    files = dict_at(ours, "tokenizer_files")
    slots: list[tuple[dict[str, Any], str, str, str]] = []  # (holder, key, field label, basename)
    for k in TOKENIZER_FILE_KEYS:
        v = tok.get(k)
        if isinstance(v, str) and v:
            slots.append((tok, k, f"tokenizer.{k}", _artifact_basename(v)))
    for name, v in files.items():
        if isinstance(v, str) and v:
            slots.append((files, name, f"{SECTION}.tokenizer_files.{name}", os.path.basename(name)))
    artifacts: dict[str, bytes] = {}
    renamed: dict[str, str] = {}
    data_of: dict[str, bytes] = {}
    warnings: list[str] = []
    for holder, key, label, base in slots:
        ref = holder[key]
        if ref in renamed:
            holder[key] = renamed[ref]
            data_of[label] = artifacts[renamed[ref][5:]]
            continue
        path, tried = _resolve(ref, bases)
        if path is None:
            msg = (f"tokenizer file {ref!r} (config {label}) not found; looked for "
                   f"{', '.join(tried) or 'it nowhere'}")
            if not allow_missing:
                raise InputError(msg + "; put it there, fix the path with --hparams, or pass "
                                 "--allow-missing-tokenizer to write the .nemo without it")
            warnings.append(msg + "; the .nemo has no tokenizer file for it")
            if holder is files:
                del holder[key]
            else:
                holder[key] = None
            continue
        with open(path, "rb") as f:
            data = f.read()
        member = artifact_name(data, base)
        artifacts[member] = data
        renamed[ref] = holder[key] = "nemo:" + member
        data_of[label] = data
    return list(artifacts.items()), renamed, data_of, warnings


# ---------------------------------------------------------------------------- convert
def _check_parallel(cfg: dict[str, Any], ck: TrainingCheckpoint, warnings: list[str]) -> tuple[int, int]:
    """The source TP×PP: the rank folders' for per-rank files, else the config's."""
    loc = ck.located
    cfg_tp = int(cfg.get("tensor_model_parallel_size") or 1)
    cfg_pp = int(cfg.get("pipeline_model_parallel_size") or 1)
    if loc.kind == "per-rank":
        if (cfg_tp, cfg_pp) != (loc.tp, loc.pp):
            warnings.append(f"the config says TP={cfg_tp} PP={cfg_pp} but the rank folders are TP={loc.tp} "
                            f"PP={loc.pp}; the folders were used")
        return loc.tp, loc.pp
    if loc.kind == "dist":
        return cfg_tp, cfg_pp
    return 1, 1


def _plan_source(fam: Any, cfg: dict[str, Any], source: TensorSource, ck: TrainingCheckpoint) -> None:
    """Prove that the weights are a complete model of the family (shapes included)."""
    cfg_mp = int(cfg.get("tensor_model_parallel_size") or 1) * int(cfg.get("pipeline_model_parallel_size") or 1)
    try:
        plan_conversion(fam.mapping(cfg), cfg, source, "to_hf")
    except (MappingError, ShapeError) as exc:
        if ck.located.kind == "ckpt" and cfg_mp > 1:
            raise InputError(f"{ck.located.path}: the config says TP={cfg.get('tensor_model_parallel_size')} "
                             f"PP={cfg.get('pipeline_model_parallel_size')}, so this file probably holds one "
                             "rank's slices; pass the folder with all the rank folders instead "
                             f"({exc})") from exc
        raise


def _tokenizer_files(data_of: dict[str, bytes]) -> dict[str, bytes]:
    """The tokenizer files found for a training checkpoint, under their file names: the HF
    files our section names, else NeMo's SentencePiece ``tokenizer.model``."""
    marker = f"{SECTION}.tokenizer_files."
    hf = {label[len(marker):]: data for label, data in data_of.items() if label.startswith(marker)}
    if hf:
        return hf
    return {"tokenizer.model": data_of["tokenizer.model"]} if "tokenizer.model" in data_of else {}


@gc_paused
def from_ckpt(src: str | os.PathLike[str], out: str | os.PathLike[str], *, hparams: str | os.PathLike[str] | None = None,
              family: str | None = None,
              checkpoint_name: str | None = None, tp: int | None = None, pp: int | None = None,
              stage_layers: tuple[int, ...] | None = None, layout: str | None = None,
              vocab_size: int | None = None, allow_missing_tokenizer: bool = False, overwrite: bool = False,
              packed: bool = True, trust_pickle: bool = False, progress: Progress | None = None,
              registry: Registry | None = None, to: str = "nemo") -> CkptConversionReport:
    """Convert a PyTorch Lightning training checkpoint into a ``.nemo`` (or, with
    ``to="megatron-bridge"``, a Megatron-Bridge checkpoint directory; with ``to="hf"``, a
    Hugging Face folder; ``to`` may name any installed output target).

    :param src: a ``.ckpt`` file; a folder of rank folders (``mp_rank_XX/<name>.ckpt`` or
        ``tp_rank_XX_pp_rank_YYY/<name>.ckpt``); a ``torch_dist`` checkpoint folder; or a
        checkpoints folder holding one of those (several: pick with ``checkpoint_name``).
    :param hparams: a Lightning ``hparams.yaml`` whose ``cfg:`` section replaces the
        checkpoint's ``hyper_parameters``.
    :param family: model family; from the config's ``target`` when None.
    :param tp, pp: output parallelism. Default: 1×1 (recorded) for the dist layout; the
        source's TP×PP (and pipeline stage sizes) for the legacy layout.
    :param layout: ``"dist"`` or ``"legacy"``; default dist for ``mcore_gpt: true``, legacy
        for ``mcore_gpt: false``, else the family's default.
    :param vocab_size: the true vocabulary size, when neither the config nor the
        SentencePiece tokenizer tells it (vocabulary padding rows are dropped).
    :param allow_missing_tokenizer: warn instead of failing when a tokenizer file the
        config names cannot be found.
    :param trust_pickle: let pickles load globals outside the allow-list: they may then
        run arbitrary code. Only for checkpoints you trust.
    """
    started = time.monotonic()
    src, out = os.fspath(src), os.fspath(out)
    hparams = None if hparams is None else os.fspath(hparams)
    reg = registry_or_default(registry)
    target = choose_target(reg, to, layout=layout)
    if layout is not None and layout not in LAYOUTS:
        raise NemoConvertError(f"unknown layout {layout!r} (use {' or '.join(LAYOUTS)})")
    for flag, size in (("--tp", tp), ("--pp", pp)):
        if size is not None and size < 1:
            raise UnsupportedError(f"{flag} must be at least 1, got {size}")
    check_output(target, out, overwrite=overwrite, packed=packed)
    loc = locate(src, checkpoint_name)
    warnings: list[str] = []
    notes: list[str] = []
    if trust_pickle:
        notes.append("trust_pickle was on: the checkpoint's pickles could run code")
    with open_training_checkpoint(loc, trust_pickle=trust_pickle) as ck:
        cfg, cfg_from = model_config(ck, hparams)
        odd: list[str] = []
        cfg = yaml_ready(cfg, "cfg", odd)
        if odd:
            warnings.append(f"config values that are not plain data were written as text: {', '.join(odd[:8])}"
                            + (f" (and {len(odd) - 8} more)" if len(odd) > 8 else ""))
        fam = reg.family(family) if family else reg.family_for_nemo_config(cfg)
        cfg.setdefault("target", fam.nemo.target)
        src_tp, src_pp = _check_parallel(cfg, ck, warnings)
        mapping = fam.mapping(cfg)
        kinds = nemo_parallel_kinds(mapping, cfg)
        bases = ([os.path.dirname(os.path.abspath(hparams))] if hparams else []) + list(loc.base_dirs)
        artifacts, renamed, data_of, tok_warnings = pack_tokenizer_files(
            cfg, list(dict.fromkeys(bases)), allow_missing=allow_missing_tokenizer)
        warnings += tok_warnings
        source = join_sections(ck.weights(kinds, strategies=reg.strategies(), tied=embedding_on_last_stage(cfg)),
                               kinds)
        tok = dict_at(cfg, "tokenizer")
        spm = data_of.get("tokenizer.model") if tok.get("library", "sentencepiece") == "sentencepiece" else None
        vocab, vocab_note = true_vocab_size(cfg, source, kinds, src_tp, vocab_size, spm)
        if vocab_note:
            notes.append(vocab_note)
        if not isinstance(cfg.get(SECTION), dict):
            cfg[SECTION] = {}
        ours = cfg[SECTION]
        if vocab is not None:
            ours["vocab_size"] = vocab
            source = VocabTrimView(source, {k for k, v in kinds.items() if v is Parallel.VOCAB}, vocab)
        elif any(v is Parallel.VOCAB for v in kinds.values()):
            ours.pop("vocab_size", None)
            warnings.append("the true vocabulary size is unknown (no SentencePiece tokenizer.model matching "
                            "the embedding rows): every stored row is kept; pass --vocab-size to drop the "
                            "padding")
        ours.update({"version": __version__, "family": fam.name, "source_format": "ptl_ckpt",
                     "training_checkpoint": {"kind": loc.kind, "tp": src_tp, "pp": src_pp, **ck.run}})
        _plan_source(fam, cfg, source, ck)
        mcore = cfg.get("mcore_gpt")
        layout = layout or ("dist" if mcore is True else "legacy" if mcore is False else fam.nemo.default_layout)
        if layout == "legacy":  # per-rank files: by default the parallelism the run trained with
            tp = src_tp if tp is None else tp
            pp = src_pp if pp is None else pp
            if stage_layers is None and pp == src_pp:
                stage_layers = ck.stage_sizes
        else:  # global tensors: TP×PP is only recorded, and any TP×PP can load them
            tp, pp = 1 if tp is None else tp, 1 if pp is None else pp
        plan = identity_plan(source, kinds)
        job = OutputJob("from-ckpt", out, cfg, plan, source, fam, kinds, reg.strategies(), reg.providers(),
                        tp=tp, pp=pp, stage_layers=stage_layers, layout=layout, packed=packed, overwrite=overwrite,
                        progress=progress, artifacts=lambda: artifacts,
                        tokenizer=lambda: _tokenizer_files(data_of), notes=notes, warnings=warnings)
        stats, layout = write_output(target, job)
        total = ck.dropped_total
        files = [loc.rank_file(t, p) for p in range(loc.pp) for t in range(loc.tp)] \
            if loc.kind == "per-rank" else [loc.path]
        notes.append(f"source: {loc.describe()}; output TP={tp} PP={pp}")
        return CkptConversionReport(
            out, fam.name, stats.tensors, stats.bytes, time.monotonic() - started, layout,
            dropped=sorted(ck.dropped_keys) + job.dropped, warnings=warnings + stats.warnings, notes=notes,
            source_kind=loc.kind, source_files=files, source_tp=src_tp, source_pp=src_pp, tp=tp, pp=pp,
            config_from=cfg_from, checkpoint=ck.run, dropped_tensors=total.tensors, dropped_bytes=total.bytes,
            dropped_sections={k: v.as_dict() for k, v in sorted(ck.dropped.items())},
            artifacts=renamed, vocab_size=vocab)


__all__ = ["CkptConversionReport", "from_ckpt", "model_config", "pack_tokenizer_files", "read_hparams",
           "true_vocab_size"]
