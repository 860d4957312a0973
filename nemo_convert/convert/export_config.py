"""What export needs beyond a NeMo-native ``model_config.yaml``.

A ``.nemo`` written by NeMo itself has no ``nemo_convert`` section: nothing records the
true vocabulary size (the embedding may hold Megatron's padding rows), the tokenizer's
special ids or the source model's RoPE scaling. This module completes such a config for
any family, from what the archive holds:

- the true vocabulary: the tokenizer's size (any kind :mod:`.nemo_tokenizer` reads:
  SentencePiece, Hugging Face files, GPT-2 BPE, tiktoken) when it is the embedding's rows
  or Megatron's padding of it at the saved TP; else the embedding's rows (with a warning
  that they may be padded). Vocab-parallel tensors are trimmed to it;
- ``bos``/``eos``/``pad`` token ids from that tokenizer;
- ``torch_dtype`` from ``precision`` and ``tie_word_embeddings`` from
  ``share_embeddings_and_output_weights``, where the family's ``config.json`` lacks them;
- RoPE scaling as NeMo runs the model: ``scale_positional_embedding: True`` is llama3
  scaling (NeMo's ``scale_factor``/``low_freq_factor``/``high_freq_factor``/
  ``old_context_len``), unless the caller passes ``rope_scaling=False``.

A config we wrote from an HF folder (its section records the source ``config.json``)
goes through unchanged; ``reshard`` uses :func:`complete_config` too, so that the true
vocabulary is what it records.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from nemo_convert.convert.common import SECTION, dict_at
from nemo_convert.convert.nemo_tokenizer import ExportTokenizer, export_tokenizer
from nemo_convert.convert.vocab import NEMO_DEFAULT_DIVISIBLE_BY
from nemo_convert.formats.nemo.nemo import NemoCheckpoint, VocabTrimView
from nemo_convert.spec import dtype_name_of_precision, llama3_scaling, provenance_of, recorded_vocab, rope_of
from nemo_convert.mapping.ops import padded_vocab_size
from nemo_convert.mapping.planner import nemo_parallel_kinds
from nemo_convert.mapping.rules import Parallel
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.tensors.base import TensorSource

#: rotary_base of Llama 1/2 (and of most models that NeMo's converter marks for llama3 scaling).
_LLAMA2_ROPE_BASE = 10000.0


@dataclass
class ExportConfig:
    """The NeMo config an export plans with, the source it reads, what ``config.json``
    gets where the family's ``config_to_hf`` leaves a key out, and the tokenizer export
    writes (its own warnings and notes are the tokenizer's: ``reshard`` writes none)."""

    cfg: dict[str, Any]
    source: TensorSource
    hf_defaults: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tokenizer: ExportTokenizer = field(default_factory=lambda: ExportTokenizer("none"))


def _true_vocab(tokens: int | None, rows: int, cfg: dict[str, Any]) -> int | None:
    """``tokens`` when the embedding holds exactly them, or Megatron's padding of them at the
    saved TP (``make_vocab_size_divisible_by`` × TP, NeMo's ``_vocab_size_with_padding``)."""
    if tokens is None or tokens > rows:
        return None
    div = int(cfg.get("make_vocab_size_divisible_by") or NEMO_DEFAULT_DIVISIBLE_BY)
    tp = int(cfg.get("tensor_model_parallel_size") or 1)
    return tokens if tokens == rows or padded_vocab_size(tokens, div, tp) == rows else None


def rope_scaling_as_run(cfg: dict[str, Any], rope_scaling: bool, warnings: list[str]) -> None:
    """RoPE scaling as NeMo runs the model: ``scale_positional_embedding: True`` stays (llama3
    scaling, with a warning on a Llama-2 ``rotary_base``) unless ``rope_scaling`` is False,
    which turns it off in ``cfg``."""
    if llama3_scaling(cfg) is None:
        return
    if not rope_scaling:
        cfg["scale_positional_embedding"] = False
        return
    rope = rope_of(cfg)
    if rope is not None and rope.theta == _LLAMA2_ROPE_BASE and provenance_of(cfg).hf_config is None:
        warnings.append("the .nemo has scale_positional_embedding: True with rotary_base 10000, which NeMo's "
                        "HF->NeMo Llama converter sets by default (--llama31, convert_llama_hf_to_nemo.py); "
                        "exported with llama3 RoPE scaling as NeMo runs it (pass --no-rope-scaling if the "
                        "source model had none)")


def config_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` keys a NeMo config tells by itself: ``torch_dtype`` from
    ``precision``, ``tie_word_embeddings`` from ``share_embeddings_and_output_weights``."""
    defaults: dict[str, Any] = {}
    if "precision" in cfg:
        defaults["torch_dtype"] = dtype_name_of_precision(cfg["precision"])
    if "share_embeddings_and_output_weights" in cfg:
        defaults["tie_word_embeddings"] = bool(cfg["share_embeddings_and_output_weights"])
    return defaults


def complete_config(ckpt: NemoCheckpoint, fam: ModelFamily) -> ExportConfig:
    """``ckpt``'s config with the true vocabulary recorded (in our section) where it was not,
    the source trimmed to it, and the ``config.json`` keys the archive can tell where no
    source ``config.json`` was recorded. A config we wrote from HF goes through unchanged."""
    cfg = copy.deepcopy(ckpt.config)
    if provenance_of(cfg).hf_config is not None:
        return ExportConfig(cfg, ckpt.source, tokenizer=export_tokenizer(ckpt, facts=False))
    warnings: list[str] = []
    defaults = config_defaults(cfg)
    tok = export_tokenizer(ckpt)
    tokens = tok.vocab_size
    defaults.update(tok.special_ids)
    source = ckpt.source
    keys = set(source.keys())
    kinds = nemo_parallel_kinds(fam.mapping(cfg), cfg)
    names = {k for k, v in kinds.items() if v is Parallel.VOCAB and k in keys}
    recorded = recorded_vocab(cfg)
    if recorded is not None:
        defaults["vocab_size"] = recorded  # open_nemo trimmed to it already
    elif names:
        rows = min(source.info(k).shape[0] for k in names)
        vocab = _true_vocab(tokens, rows, cfg)
        if vocab is None:
            vocab = rows
            why = ("has no tokenizer export can read" if tokens is None
                   else f"has a tokenizer of {tokens} tokens, which padding does not take to {rows}")
            warnings.append(f"the true vocabulary size is unknown (the .nemo {why}): config.json has vocab_size "
                            f"{rows}, the embedding's rows, which may include Megatron's padding")
        ours = dict_at(cfg, SECTION)
        cfg[SECTION] = {**ours, "vocab_size": vocab}
        defaults["vocab_size"] = vocab
        if vocab < rows:
            source = VocabTrimView(source, names, vocab)
    return ExportConfig(cfg, source, defaults, warnings, tokenizer=tok)


def export_config(ckpt: NemoCheckpoint, fam: ModelFamily, *, rope_scaling: bool = True) -> ExportConfig:
    """:func:`complete_config`, and RoPE scaling as NeMo runs the model (llama3 scaling for
    ``scale_positional_embedding``, with a warning on a Llama-2 ``rotary_base``) unless
    ``rope_scaling`` is False."""
    prep = complete_config(ckpt, fam)
    rope_scaling_as_run(prep.cfg, rope_scaling, prep.warnings)
    return prep


def complete_hf_config(hf_cfg: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``hf_cfg`` with every key of ``defaults`` it lacks added."""
    for key, value in defaults.items():
        hf_cfg.setdefault(key, value)
    return hf_cfg
