"""Hugging Face folder → ``.nemo``."""

from __future__ import annotations

import copy
import fnmatch
import os
import re
from typing import Any, Sequence

import torch

from nemo_convert import __version__
from nemo_convert.compute import Compute, DeviceOption
from nemo_convert.convert.common import (SECTION, ConversionReport, finite_warning, gc_paused, registry_or_default,
                                         tokenizer_rows_warning)
from nemo_convert.convert.hf_quantized import dequantize_on_read
from nemo_convert.convert.nemo_write import Parallelism
from nemo_convert.convert.output import check_output, choose_target, write_output
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import Progress, apply_dtype
from nemo_convert.errors import ConfigError, NemoConvertError
from nemo_convert.formats.detect import require_kind
from nemo_convert.formats.hf.hf import open_hf
from nemo_convert.formats.nemo.nemo import artifact_name
from nemo_convert.formats.nemo.nemo_weights import LAYOUTS
from nemo_convert.formats.io.staging import refuse_overlap
from nemo_convert.hf_config import read_config_json
from nemo_convert.mapping import Mapping
from nemo_convert.mapping.planner import Plan, nemo_parallel_kinds, plan_conversion
from nemo_convert.plugins.manager import Registry
from nemo_convert.tokenizers import add_tokens_sentencepiece
from nemo_convert.workers import SINGLE, Workers
from nemo_convert.plugins.records import ModelFamily, OutputJob
from nemo_convert.spec import geometry_of, precision_of_dtype_name, provenance_of
from nemo_convert.tensors.base import TensorSource


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


#: A Hugging Face hub id (``owner/name``), as opposed to a local path.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hf_tokenizer_type(hf_cfg: dict[str, Any], folder: str) -> str:
    """NeMo's ``tokenizer.type`` for a Hugging Face tokenizer without a SentencePiece model:
    the hub id the model was loaded from when ``config.json`` records one, else the
    source folder's absolute path. NeMo hands this name to ``transformers``'
    ``AutoTokenizer.from_pretrained``; it never resolves it inside the ``.nemo``."""
    name = hf_cfg.get("_name_or_path")
    if isinstance(name, str) and HUB_ID.fullmatch(name) and not os.path.exists(name):
        return name
    return os.path.abspath(folder)


def pack_tokenizer(fam: ModelFamily, hf_cfg: dict[str, Any], files: dict[str, str], folder: str,
                   notes: list[str]) -> tuple[dict[str, Any] | None, dict[str, str], list[tuple[str, bytes]]]:
    """Every tokenizer file as a ``nemo:`` artifact, plus — for a family with
    ``add_tokens`` — the patched SentencePiece model that NeMo's ``tokenizer.model`` uses.
    Returns the NeMo ``tokenizer`` section, the refs of the HF originals by file name,
    and the ``(member, bytes)`` artifacts to store."""
    data = {name: _read(path) for name, path in sorted(files.items())}
    members = [(artifact_name(blob, name), blob) for name, blob in data.items()]
    # ``tokenizer_files`` always names the HF originals: export gives them back unchanged.
    refs = {name: "nemo:" + member for name, (member, _) in zip(data, members)}
    if not refs:
        return None, refs, members
    model_ref = refs.get("tokenizer.model")
    if fam.hf.add_tokens and "tokenizer.model" in data:
        patched, rep = add_tokens_sentencepiece(data["tokenizer.model"], fam.hf.add_tokens, skip_existing=True)
        if patched != data["tokenizer.model"]:
            member = artifact_name(patched, "tokenizer.model")
            members.append((member, patched))
            model_ref = "nemo:" + member
        notes.append(f"tokenizer.model: added {len(rep.added)} token(s) for {fam.name} "
                     f"({', '.join(t for t, _ in rep.added) or 'none'}); vocabulary "
                     f"{rep.old_vocab_size} → {rep.new_vocab_size}; embeddings were not resized; "
                     "export restores the original tokenizer files")
    if "tokenizer.model" in refs:
        tok = {"library": "sentencepiece", "type": None, "model": model_ref,
               "vocab_file": None, "merge_file": None, "delimiter": None, "sentencepiece_legacy": False}
    else:
        tok = {"library": "huggingface", "type": hf_tokenizer_type(hf_cfg, folder), "model": None, "vocab_file": None,
               "merge_file": None, "delimiter": None, "use_fast": True}
    return tok, refs, members


def _pop_key(cfg: dict[str, Any], key: str) -> Any:
    """Remove ``key`` (a top-level key, else a dotted path into sections) and return its value."""
    if key in cfg:
        return cfg.pop(key)
    *parents, last = key.split(".")
    cur: Any = cfg
    for p in parents:
        cur = cur.get(p) if isinstance(cur, dict) else None
    if not isinstance(cur, dict) or last not in cur:
        raise ConfigError(f"--ignore-config-key {key}: config.json has no key {key!r}")
    return cur.pop(last)


def translatable_config(hf_cfg: dict[str, Any], ignore_config_keys: Sequence[str]) -> dict[str, Any]:
    """A copy of ``config.json`` without the keys the user chose to ignore (each must exist;
    ``vision_config.foo`` names a key of a section)."""
    out = copy.deepcopy(hf_cfg)
    for key in dict.fromkeys(ignore_config_keys):
        _pop_key(out, key)
    return out


def nemo_config_of(family: ModelFamily, hf_cfg: dict[str, Any], ignore_config_keys: Sequence[str] = (),
                   options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The family's NeMo config for ``config.json`` (strict; ``ignore_config_keys`` left out)."""
    try:
        return family.config_to_nemo(translatable_config(hf_cfg, ignore_config_keys), **(options or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"config.json does not describe a {family.name} model: {type(exc).__name__}: {exc}") from None


def plan_import(family: ModelFamily, hf_cfg: dict[str, Any], source: TensorSource, *,
                allow_unmapped: tuple[str, ...] = (), options: dict[str, Any] | None = None,
                ignore_config_keys: Sequence[str] = ()) -> tuple[dict[str, Any], Plan]:
    """The NeMo config and the checked plan for importing ``source`` (headers only, no data).
    ``ignore_config_keys`` are left out of the translation (not out of the recorded source
    ``config.json``): the explicit escape from a family's strict config."""
    opts = dict(options or {})
    if family.options.from_source is not None:
        opts = {**family.options.from_source(copy.deepcopy(hf_cfg), list(source.keys())), **opts}
    cfg = nemo_config_of(family, hf_cfg, ignore_config_keys, opts)
    ours = cfg.setdefault(SECTION, {})
    ours.update({"version": __version__, "family": family.name, "source_format": "hf",
                 "hf_config": copy.deepcopy(hf_cfg)})
    if options:
        ours["import_options"] = dict(options)
    if ignore_config_keys:
        ours["ignored_config_keys"] = {k: _pop_key(copy.deepcopy(hf_cfg), k) for k in dict.fromkeys(ignore_config_keys)}
    cfg.setdefault("target", family.nemo.target)
    plan = plan_conversion(import_mapping(family, cfg), cfg, source, "to_nemo", allow_unmapped=allow_unmapped)
    return cfg, plan


def import_mapping(family: ModelFamily, cfg: dict[str, Any]) -> Mapping:
    """The family's mapping as import reads the source: its HF names under the prefixes the
    config recorded (``hf_read_prefixes``: a text model inside a multimodal checkpoint), and
    the tensors an option left out (``hf_left_out``) consumed without output. Export uses the
    family's mapping itself, so it writes the plain names."""
    mapping, origin = family.mapping(cfg), provenance_of(cfg)
    prefixes = origin.hf_read_prefixes
    if prefixes:
        def respell(name: str) -> str:
            for old, new in prefixes.items():
                if name.startswith(old):
                    return new + name[len(old):]
            return name
        mapping = mapping.respelled_hf(respell)
    if origin.hf_left_out is not None and origin.hf_left_out.names:
        mapping = mapping.combine(Mapping((), drop_hf=origin.hf_left_out.names))
    return mapping


def _left_out_notes(cfg: dict[str, Any], plan: Plan) -> list[str]:
    """One line naming what an import option left out of the source (``hf_left_out``)."""
    left = provenance_of(cfg).hf_left_out
    if left is None:
        return []
    count = sum(any(fnmatch.fnmatchcase(k, n) for n in left.names) for k in plan.dropped)
    return [f"{left.option}: left out {left.what} ({', '.join(left.names)}: {count} tensors)"]


def _mtp_notes(cfg: dict[str, Any], plan: Plan) -> list[str]:
    """One line for multi-token-prediction layers the ``.nemo`` leaves out (``hf_mtp``)."""
    origin = provenance_of(cfg)
    if not (origin.mtp_dropped or origin.mtp_absent):
        return []
    first = geometry_of(cfg).layers
    if origin.mtp_dropped:
        n = origin.mtp_dropped
        count = sum(k.startswith(tuple(f"model.layers.{first + i}." for i in range(n))) for k in plan.dropped)
        return [f"--drop-mtp: left out the source's {n} multi-token-prediction layer(s) (model.layers.{first}"
                f"{'' if n == 1 else f'-{first + n - 1}'}.*, {count} tensors); export writes num_nextn_predict_layers: 0"]
    if origin.mtp_absent:
        return [f"config.json announces {origin.mtp_absent} multi-token-prediction layer(s) that the checkpoint does not "
                f"store (no model.layers.{first}.*; transformers never saves them): none imported, and export "
                "announces them again"]
    return []


@gc_paused
def import_hf(src: str | os.PathLike[str], out: str | os.PathLike[str], *, family: str | None = None,
              dtype: str | torch.dtype | None = None,
              layout: str | None = None, overwrite: bool = False, packed: bool = True,
              progress: Progress | None = None, registry: Registry | None = None,
              allow_unmapped: tuple[str, ...] = (), trust_pickle: bool = False,
              options: dict[str, Any] | None = None, ignore_config_keys: Sequence[str] = (),
              parallel: Parallelism | None = None,
              check_finite: bool = False, device: DeviceOption = "cpu",
              workers: Workers = SINGLE, to: str = "nemo") -> ConversionReport:
    """Convert a Hugging Face model folder into a ``.nemo`` (or, with
    ``to="megatron-bridge"``, a Megatron-Bridge checkpoint directory).

    :param src: HF folder (``config.json`` + safetensors or ``pytorch_model*.bin``).
    :param out: the ``.nemo`` to write (the unpacked folder form when ``packed=False``).
    :param family: model family name; detected from ``config.json`` when None.
    :param dtype: cast floating tensors (``"bf16"``, ``"fp16"``, ``"fp32"``); None keeps each.
    :param layout: ``"dist"`` or ``"legacy"``; the family's default when None.
    :param overwrite: replace an existing ``out``.
    :param allow_unmapped: globs of source tensors to drop instead of failing.
    :param options: family-specific import options (e.g. ``{"embed_vision_tower": True}``).
    :param ignore_config_keys: ``config.json`` keys to translate as if absent (a family
        refuses keys it does not understand); recorded in ``nemo_convert.ignored_config_keys``.
    :param check_finite: count NaN/Inf in every tensor and report the tensors that have any.
    :param parallel: target tensor/pipeline parallelism (default TP=PP=1). The dist layout
        stores global tensors and records the sizes; the legacy layout writes per-rank files.
    :param device: where the transforms run: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``
        (see :mod:`nemo_convert.compute`).
    :param to: the output target (``Registry.targets()``): ``"nemo"``, ``"megatron-bridge"``
        (``layout`` and ``packed`` then do not apply; TP × PP is recorded in
        ``run_config.yaml``) or one a plugin registers (:mod:`nemo_convert.convert.output`).
    """
    src, out = os.fspath(src), os.fspath(out)
    reg = registry_or_default(registry)
    target = choose_target(reg, to, layout=layout, workers=workers)
    compute = Compute.of(device)
    refuse_overlap(src, out)
    check_output(target, out, overwrite=overwrite, packed=packed)
    require_kind(src, ("hf",), "a Hugging Face model folder")
    want = parse_dtype(dtype)
    hf_cfg = read_config_json(src)
    fam = reg.family(family) if family else reg.family_for_hf_config(hf_cfg)
    unknown = sorted(set(options or {}) - set(fam.options.keys))
    if unknown:
        raise NemoConvertError(f"family {fam.name!r} has no import option(s) {', '.join(unknown)} "
                               f"(it accepts: {', '.join(fam.options.keys) or 'none'})")
    layout = layout or fam.nemo.default_layout
    if layout not in LAYOUTS:
        raise NemoConvertError(f"unknown layout {layout!r} (use {' or '.join(LAYOUTS)})")
    ckpt = open_hf(src, tokenizer_files=fam.hf.tokenizer_files, trust_pickle=trust_pickle)
    notes: list[str] = []
    try:
        quantized, note = dequantize_on_read(ckpt, want)  # fp8 / MXFP4 pairs: decoded one tensor at a time
        if note:
            notes.append(note)
        cfg, plan = plan_import(fam, ckpt.config, ckpt.source, allow_unmapped=allow_unmapped, options=options,
                                ignore_config_keys=ignore_config_keys)
        if quantized is not None:
            cfg[SECTION]["hf_dequantized"] = copy.deepcopy(quantized)
        notes += _mtp_notes(cfg, plan) + _left_out_notes(cfg, plan)
        plan.check_finite = check_finite
        warnings = apply_dtype(plan, want)
        plan.pool.enabled = True  # the writers consume each fused tensor before the next task
        if want is not None:
            cfg["precision"] = precision_of_dtype_name(str(want).removeprefix("torch."))
        if ckpt.generation_config is not None:
            cfg[SECTION]["hf_generation_config"] = ckpt.generation_config
        tok, refs, artifacts = pack_tokenizer(fam, ckpt.config, ckpt.extra_files, src, notes)
        warnings += tokenizer_rows_warning({n: _read(p) for n, p in ckpt.extra_files.items()
                                            if n in ("tokenizer.json", "tokenizer.model")},
                                           ckpt.config.get("vocab_size"))
        if tok is not None:
            cfg["tokenizer"] = tok
            cfg[SECTION]["tokenizer_files"] = refs
        kinds = nemo_parallel_kinds(fam.mapping(cfg), cfg)
        par = parallel or Parallelism()
        job = OutputJob("import", out, cfg, plan, ckpt.source, fam, kinds, reg.strategies(), reg.providers(),
                        tp=par.tp, pp=par.pp, ep=par.ep, stage_layers=par.stage_layers, layout=layout,
                        packed=packed, overwrite=overwrite, progress=progress, workers=workers, compute=compute,
                        artifacts=lambda: artifacts,
                        tokenizer=lambda: {n: _read(p) for n, p in ckpt.extra_files.items()},
                        notes=notes, warnings=warnings)
        stats, layout = write_output(target, job)
        notes += compute.notes(plan, ckpt.source)
    finally:
        ckpt.close()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, layout, plan.dropped,
                            warnings + finite_warning(stats.non_finite), notes, stats.non_finite)
