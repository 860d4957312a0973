"""The true (unpadded) vocabulary of a checkpoint's vocab-parallel tensors — what
``from-ckpt`` records and what export, ``verify`` and ``inspect`` trim to
(:mod:`~nemo_convert.convert.export_config`). Its own module so that reading a config does
not load the ``from-ckpt`` conversion (and its writers)."""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import ConfigError
from nemo_convert.mapping.ops import padded_vocab_size
from nemo_convert.mapping.rules import Kind, Parallel
from nemo_convert.spec import recorded_vocab
from nemo_convert.tensors.base import TensorSource

NEMO_DEFAULT_DIVISIBLE_BY = 128  # NeMo's default make_vocab_size_divisible_by


def _sentencepiece_size(data: bytes) -> int | None:
    try:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(data)
        return int(sp.GetPieceSize())
    except Exception:  # noqa: BLE001 - not installed, or not a SentencePiece model
        return None


def true_vocab_size(cfg: dict[str, Any], source: TensorSource, kinds: dict[str, Kind], src_tp: int,
                    explicit: int | None, tokenizer_model: bytes | None) -> tuple[int | None, str | None]:
    """The unpadded vocabulary of the vocab-parallel tensors, and how it was found.

    In order: ``explicit``; the size our own config section recorded; the SentencePiece
    tokenizer's size when padding it as Megatron does at the source TP gives exactly the
    stored rows. None (keep every row) otherwise."""
    rows = [source.info(k).shape[0] for k in source.keys() if kinds.get(k) is Parallel.VOCAB]
    if not rows:
        return None, None
    stored = min(rows)
    if explicit is not None:
        if not 0 < explicit <= stored:
            raise ConfigError(f"--vocab-size {explicit} does not fit the {stored} rows of the embedding")
        return explicit, f"vocabulary size {explicit} (given)"
    recorded = recorded_vocab(cfg)
    if recorded is not None and 0 < recorded <= stored:
        return recorded, None
    if tokenizer_model is not None:
        n = _sentencepiece_size(tokenizer_model)
        div = int(cfg.get("make_vocab_size_divisible_by") or NEMO_DEFAULT_DIVISIBLE_BY)
        if n is not None and n <= stored and padded_vocab_size(n, div, src_tp) == stored:
            return n, (f"vocabulary size {n} from tokenizer.model (the checkpoint stores {stored} rows: "
                       f"padded to a multiple of {div}×TP{src_tp})")
    return None, None
