"""The public Python API: everything the CLI can do, as functions.

>>> from nemo_convert import api
>>> report = api.import_hf("llama-hf/", "llama.nemo")           # doctest: +SKIP
>>> report = api.export_hf("llama.nemo", "llama-back/")          # doctest: +SKIP
>>> with api.open_checkpoint("llama.nemo") as ckpt:              # doctest: +SKIP
...     ckpt.source.load("embedding.word_embeddings.weight")
"""

from __future__ import annotations

import copy
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from nemo_convert import __version__
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import Progress, apply_dtype, run_plan
from nemo_convert.errors import InputError, NemoConvertError
from nemo_convert.formats.hf import HFWeightsWriter, is_hf_folder, open_hf, write_json
from nemo_convert.formats.nemo import CONFIG_MEMBER, NemoCheckpoint, add_artifact, dump_yaml, open_nemo
from nemo_convert.formats.nemo_weights import LAYOUTS, make_weights_writer
from nemo_convert.formats.sink import DirectorySink, MemberSink
from nemo_convert.formats.staging import staged_output
from nemo_convert.formats.tar_writer import TarWriter
from nemo_convert.hf_config import dtype_name_of_precision, read_config_json, set_dtype_name
from nemo_convert.mapping.planner import Plan, plan_conversion
from nemo_convert.plugins.manager import Registry, get_registry
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.tensors.base import TensorSource

SECTION = "nemo_convert"


@dataclass
class ConversionReport:
    """What a conversion did; ``--json`` prints this."""

    output: str
    family: str
    tensors: int
    bytes: int
    seconds: float
    layout: str | None = None
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _registry(registry: Registry | None) -> Registry:
    return registry if registry is not None else get_registry()


# --------------------------------------------------------------------------- import
def _tokenizer_section(hf_cfg: dict[str, Any], files: dict[str, str], sink: MemberSink,
                       folder: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The NeMo ``tokenizer`` section, with every tokenizer file packed as an artifact."""
    refs = {name: add_artifact(sink, path, name) for name, path in sorted(files.items())}
    if "tokenizer.model" in refs:
        tok = {"library": "sentencepiece", "type": None, "model": refs["tokenizer.model"],
               "vocab_file": None, "merge_file": None, "delimiter": None, "sentencepiece_legacy": False}
    else:
        name = hf_cfg.get("_name_or_path") or os.path.basename(os.path.normpath(folder))
        tok = {"library": "huggingface", "type": name, "model": None, "vocab_file": None,
               "merge_file": None, "delimiter": None, "use_fast": True}
    return tok, refs


def plan_import(family: ModelFamily, hf_cfg: dict[str, Any], source: TensorSource,
                *, allow_unmapped: tuple[str, ...] = ()) -> tuple[dict[str, Any], Plan]:
    """The NeMo config and the checked plan for importing ``source`` (no I/O beyond headers)."""
    cfg = family.config_to_nemo(copy.deepcopy(hf_cfg))
    ours = cfg.setdefault(SECTION, {})
    ours.update({"version": __version__, "family": family.name, "source_format": "hf",
                 "hf_config": copy.deepcopy(hf_cfg)})
    cfg.setdefault("target", family.nemo_target)
    plan = plan_conversion(family.mapping(cfg), cfg, source, "to_nemo", allow_unmapped=allow_unmapped)
    return cfg, plan


def import_hf(src: str, out: str, *, family: str | None = None, dtype: str | torch.dtype | None = None,
              layout: str | None = None, overwrite: bool = False, packed: bool = True,
              progress: Progress | None = None, registry: Registry | None = None,
              allow_unmapped: tuple[str, ...] = (), trust_pickle: bool = False) -> ConversionReport:
    """Convert a Hugging Face model folder into a ``.nemo``.

    :param src: HF folder (``config.json`` + safetensors or ``pytorch_model*.bin``).
    :param out: the ``.nemo`` to write (a folder instead when ``packed=False``).
    :param family: model family name; detected from ``config.json`` when None.
    :param dtype: cast floating tensors (``"bf16"``, ``"fp16"``, ``"fp32"``); None keeps each.
    :param layout: ``"dist"`` or ``"legacy"``; the family's default when None.
    :param overwrite: replace an existing ``out``.
    """
    reg = _registry(registry)
    if not is_hf_folder(src):
        raise InputError(f"{src}: not a Hugging Face model folder (no config.json)")
    want = parse_dtype(dtype)
    hf_cfg = read_config_json(src)
    fam = reg.family(family) if family else reg.family_for_hf_config(hf_cfg)
    layout = layout or fam.default_layout
    if layout not in LAYOUTS:
        raise NemoConvertError(f"unknown layout {layout!r} (use {' or '.join(LAYOUTS)})")
    ckpt = open_hf(src, tokenizer_files=fam.tokenizer_files, trust_pickle=trust_pickle)
    try:
        cfg, plan = plan_import(fam, ckpt.config, ckpt.source, allow_unmapped=allow_unmapped)
        warnings = apply_dtype(plan, want)
        if want is not None:
            cfg["precision"] = {torch.bfloat16: "bf16", torch.float16: 16, torch.float32: 32}[want]
        if ckpt.generation_config is not None:
            cfg[SECTION]["hf_generation_config"] = ckpt.generation_config
        with staged_output(out, overwrite=overwrite, is_dir=not packed) as stage:
            sink_cm = TarWriter(stage) if packed else _dir_sink(stage)
            with sink_cm as sink:
                tok, refs = _tokenizer_section(ckpt.config, ckpt.extra_files, sink, src)
                if refs:
                    cfg["tokenizer"] = tok
                    cfg[SECTION]["tokenizer_files"] = refs
                sink.add_bytes(CONFIG_MEMBER, dump_yaml(cfg))
                writer = make_weights_writer(layout, sink, plan.outputs())
                stats = run_plan(plan, ckpt.source, writer.write, progress=progress, description="import")
                writer.close()
    finally:
        ckpt.close()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, layout,
                            plan.dropped, warnings)


@contextmanager
def _dir_sink(path: str) -> Iterator[DirectorySink]:
    yield DirectorySink(path)


# --------------------------------------------------------------------------- export
def export_hf(src: str, out: str, *, dtype: str | torch.dtype | None = None, overwrite: bool = False,
              family: str | None = None, max_shard_bytes: int = 5 * 1024**3,
              progress: Progress | None = None, registry: Registry | None = None,
              trust_pickle: bool = False) -> ConversionReport:
    """Convert a ``.nemo`` (any layout) into a Hugging Face folder that
    ``transformers`` loads with no missing or unexpected keys."""
    reg = _registry(registry)
    want = parse_dtype(dtype)
    ckpt = open_nemo(src, trust_pickle=trust_pickle)
    try:
        fam = reg.family(family) if family else reg.family_for_nemo_config(ckpt.config)
        cfg = ckpt.config
        hf_cfg = fam.config_to_hf(copy.deepcopy(cfg))
        plan = plan_conversion(fam.mapping(cfg), cfg, ckpt.source, "to_hf")
        warnings = apply_dtype(plan, want)
        if want is None and ("dtype" in hf_cfg or "torch_dtype" in hf_cfg) and "precision" in cfg:
            set_dtype_name(hf_cfg, dtype_name_of_precision(cfg["precision"]))
        if want is not None:
            set_dtype_name(hf_cfg, {torch.bfloat16: "bfloat16", torch.float16: "float16",
                                    torch.float32: "float32"}[want])
        with staged_output(out, overwrite=overwrite, is_dir=True) as stage:
            os.makedirs(stage, exist_ok=True)
            write_json(os.path.join(stage, "config.json"), hf_cfg)
            gen = (cfg.get(SECTION) or {}).get("hf_generation_config")
            if gen is not None:
                write_json(os.path.join(stage, "generation_config.json"), gen)
            _export_tokenizer(ckpt, stage)
            writer = HFWeightsWriter(stage, plan.outputs(), max_shard_bytes=max_shard_bytes)
            stats = run_plan(plan, ckpt.source, writer.write, progress=progress, description="export")
            writer.close()
    finally:
        ckpt.close()
    return ConversionReport(out, fam.name, stats.tensors, stats.bytes, stats.seconds, None,
                            plan.dropped, warnings)


def _export_tokenizer(ckpt: NemoCheckpoint, folder: str) -> None:
    files = (ckpt.config.get(SECTION) or {}).get("tokenizer_files") or {}
    for name, ref in files.items():
        with open(os.path.join(folder, os.path.basename(name)), "wb") as f:
            f.write(ckpt.artifact(ref))
    if not files:
        tok = ckpt.config.get("tokenizer") or {}
        model = tok.get("model")
        if isinstance(model, str) and model:
            with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
                f.write(ckpt.artifact(model))


# --------------------------------------------------------------------------- open / inspect
@dataclass
class Checkpoint:
    """Any checkpoint we read, opened lazily: its format, config and tensors."""

    path: str
    format: str  # "hf" or "nemo"
    config: dict[str, Any]
    source: TensorSource
    layout: str | None
    _closer: Any = None

    def close(self) -> None:
        (self._closer or self.source).close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checkpoint(path: str, *, trust_pickle: bool = False) -> Checkpoint:
    """Open an HF folder or a ``.nemo`` (tar, gzip, folder) lazily."""
    if is_hf_folder(path):
        hf = open_hf(path, trust_pickle=trust_pickle)
        return Checkpoint(path, "hf", hf.config, hf.source, None, hf)
    if os.path.exists(path):
        nemo = open_nemo(path, trust_pickle=trust_pickle)
        return Checkpoint(path, "nemo", nemo.config, nemo.source, nemo.layout, nemo)
    raise InputError(f"{path}: no such file or folder")


CONFIG_SUMMARY_KEYS = ("architectures", "model_type", "num_hidden_layers", "num_layers", "hidden_size",
                       "intermediate_size", "ffn_hidden_size", "num_attention_heads", "num_key_value_heads",
                       "num_query_groups", "head_dim", "kv_channels", "vocab_size", "tie_word_embeddings",
                       "share_embeddings_and_output_weights", "torch_dtype", "precision",
                       "tensor_model_parallel_size", "pipeline_model_parallel_size", "target")


def inspect_checkpoint(path: str, *, trust_pickle: bool = False) -> dict[str, Any]:
    """Format, config summary and tensor table of a checkpoint (no tensor bytes read)."""
    with open_checkpoint(path, trust_pickle=trust_pickle) as ck:
        tensors = [{"name": k, "shape": list(ck.source.info(k).shape),
                    "dtype": str(ck.source.info(k).dtype).replace("torch.", ""),
                    "bytes": ck.source.info(k).nbytes} for k in ck.source.keys()]
        summary = {k: ck.config[k] for k in CONFIG_SUMMARY_KEYS if k in ck.config}
        fam = None
        try:
            reg = get_registry()
            fam = (reg.family_for_hf_config(ck.config) if ck.format == "hf"
                   else reg.family_for_nemo_config(ck.config)).name
        except NemoConvertError:
            pass
        return {"path": path, "format": ck.format, "layout": ck.layout, "family": fam, "config": summary,
                "num_tensors": len(tensors), "total_bytes": sum(t["bytes"] for t in tensors),
                "tensors": tensors}


def copy_tree(src: str, dst: str) -> None:  # small helper for tests and docs examples
    shutil.copytree(src, dst)
