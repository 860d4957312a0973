"""Open any checkpoint we read, lazily, and describe it (``inspect``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from nemo_convert.convert.common import SECTION, kinds_for
from nemo_convert.convert.export_config import complete_config
from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.detect import Kind, require_kind
from nemo_convert.formats.hf.hf import open_hf
from nemo_convert.formats.open_any import open_model_checkpoint
from nemo_convert.formats.trtllm.qnemo_read import open_qnemo
from nemo_convert.plugins.manager import Registry, get_registry
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.tensors.base import TensorSource


@dataclass
class Checkpoint:
    """A checkpoint opened lazily: its format, config and tensors (logical NeMo names for
    ``.nemo``, HF names for HF folders)."""

    path: str
    format: str  # "hf", "nemo", "qnemo", or the directory kind: "megatron-bridge", "megatron-lm"
    config: dict[str, Any]
    source: TensorSource
    layout: str | None
    handle: Any = None  # the format object that owns the files

    def close(self) -> None:
        (self.handle or self.source).close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: What ``open_checkpoint`` reads, as :mod:`nemo_convert.formats.detect` names it.
READABLE: tuple[Kind, ...] = ("hf", "nemo", "nemo2", "megatron", "qnemo")


def open_checkpoint(path: str | os.PathLike[str], *, trust_pickle: bool = False, accept: tuple[Kind, ...] = READABLE,
                    what: str = "a checkpoint inspect reads", iteration: int | None = None,
                    registry: Registry | None = None) -> Checkpoint:
    """Open an HF folder, a ``.nemo`` (tar, gzip, unpacked folder), a NeMo 2.0 folder, a
    Megatron-Bridge / Megatron-LM directory (``iteration``: which ``iter_XXXXXXX/``) or a
    ``.qnemo`` folder lazily. Any other kind is refused, naming the command that takes it.
    A NeMo-side checkpoint is read with ``registry``'s families and sharding strategies
    (default: the installed plugins')."""
    path = os.fspath(path)
    kind = require_kind(path, accept, what).kind
    if kind == "hf" and iteration is None:
        hf = open_hf(path, trust_pickle=trust_pickle)
        return Checkpoint(path, "hf", hf.config, hf.source, None, hf)
    if kind == "qnemo" and iteration is None:
        q = open_qnemo(path)
        return Checkpoint(path, "qnemo", q.config, q.source, None, q)
    reg = registry if registry is not None else get_registry()
    nemo = open_model_checkpoint(path, strategies=reg.strategies(), providers=reg.providers(), trust_pickle=trust_pickle,
                                 kinds_for=kinds_for(reg), iteration=iteration)
    return Checkpoint(path, getattr(nemo, "kind", "nemo"), nemo.config, nemo.source, nemo.layout, nemo)


CONFIG_SUMMARY_KEYS = ("architectures", "model_type", "num_hidden_layers", "num_layers", "hidden_size",
                       "intermediate_size", "ffn_hidden_size", "num_attention_heads", "num_key_value_heads",
                       "num_query_groups", "head_dim", "kv_channels", "vocab_size", "tie_word_embeddings",
                       "share_embeddings_and_output_weights", "torch_dtype", "dtype", "precision",
                       "tensor_model_parallel_size", "pipeline_model_parallel_size", "target",
                       "architecture", "quantization", "mapping")


def inspect_checkpoint(path: str | os.PathLike[str], *, trust_pickle: bool = False,
                       iteration: int | None = None) -> dict[str, Any]:
    """Format, config summary and tensor table of a checkpoint (no tensor bytes read)."""
    path = os.fspath(path)
    with open_checkpoint(path, trust_pickle=trust_pickle, iteration=iteration) as ck:
        tensors: list[dict[str, Any]] = []
        for k in ck.source.keys():
            info = ck.source.info(k)
            tensors.append({"name": k, "shape": list(info.shape), "dtype": info.dtype_name,
                            "bytes": info.nbytes})
        summary = {k: ck.config[k] for k in CONFIG_SUMMARY_KEYS if k in ck.config}
        family = None
        if ck.format == "qnemo":
            return {"path": path, "format": "qnemo", "layout": None, "family": None, "config": summary,
                    "ranks": ck.handle.ranks, "num_tensors": len(tensors),
                    "total_bytes": sum(t["bytes"] for t in tensors), "tensors": tensors}
        notes: list[str] = []
        try:
            reg = get_registry()
            fam = reg.family_for_hf_config(ck.config) if ck.format == "hf" else reg.family_for_nemo_config(ck.config)
            family = fam.name
        except NemoConvertError:
            fam = None
        if fam is not None and ck.format != "hf":
            try:
                notes += _true_vocabulary(ck, fam, summary)
            except (NemoConvertError, KeyError, TypeError, ValueError):  # a config its family cannot plan
                pass
        out: dict[str, Any] = {"path": path, "format": ck.format, "layout": ck.layout, "family": family, "config": summary,
               "num_tensors": len(tensors), "total_bytes": sum(t["bytes"] for t in tensors), "tensors": tensors}
        if getattr(ck.handle, "backend", None) == "zarr":
            out["backend"] = "zarr"
            notes.append("weights in Megatron-Core's zarr backend: read chunk by chunk in place; reshard writes "
                         "torch_dist")
        if ck.format in ("megatron-bridge", "megatron-lm"):
            out["iteration_dir"] = ck.handle.iteration_dir
        notes = list(getattr(ck.handle, "notes", [])) + list(getattr(ck.handle, "warnings", [])) + notes
        if notes:
            out["notes"] = notes
        return out


def _true_vocabulary(ck: Checkpoint, fam: ModelFamily, summary: dict[str, Any]) -> list[str]:
    """Put the true vocabulary size into ``summary`` (``vocab_size``) as export completes it
    (:func:`~nemo_convert.convert.export_config.complete_config`), which the tensor table's
    vocabulary rows may exceed by Megatron's padding; the completion's warnings."""
    prep = complete_config(ck.handle, fam)
    ours = prep.cfg.get(SECTION)
    vocab = ours.get("vocab_size") if isinstance(ours, dict) else None
    notes = list(prep.warnings)
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        summary["vocab_size"] = vocab
        padded = sorted({n for n in ck.source.keys() if prep.source.info(n).shape != ck.source.info(n).shape})
        if padded:
            rows = ck.source.info(padded[0]).shape[0]
            notes.append(f"vocab_size {vocab} is the true vocabulary; {', '.join(padded)} hold {rows} rows "
                         f"({rows - vocab} of Megatron's padding)")
    return notes
