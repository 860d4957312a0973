"""Tokenizer patchers: add tokens to SentencePiece models and HF tokenizer folders.

NeMo recipes such as NeVA need extra tokens (``<extra_id_0>`` … ``<extra_id_7>``,
``<image>``) in the tokenizer. :func:`add_tokens_sentencepiece` edits a serialized
SentencePiece model (bytes in, bytes out); :func:`add_tokens_hf` writes a patched copy of
an HF tokenizer folder. Both append the new tokens after every existing id, so existing
ids and the encoding of text without the new tokens do not change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from nemo_convert.errors import InputError
from nemo_convert.tokenizers.hf_patch import add_tokens_hf
from nemo_convert.tokenizers.sentencepiece_patch import (
    PatchReport,
    TokenizerPatchError,
    add_tokens_sentencepiece,
    encode_probe,
    sentencepiece_vocab_size,
)

__all__ = [
    "PatchReport",
    "TokenizerPatchError",
    "add_tokens_hf",
    "add_tokens_sentencepiece",
    "detect_tokenizer_kind",
    "encode_probe",
    "sentencepiece_vocab_size",
    "tokenizer_size",
]

TokenizerKind = Literal["sentencepiece", "hf"]

# Real SentencePiece models are a few MB (a 256k-piece vocab is about 4 MB).
_MAX_SP_MODEL_BYTES = 256 * 1024 * 1024


def detect_tokenizer_kind(path: str | os.PathLike[str]) -> TokenizerKind:
    """Say whether ``path`` is a SentencePiece model file or an HF tokenizer folder.

    A file is ``"sentencepiece"`` when SentencePiece can load it. A folder is ``"hf"``
    when it holds a ``tokenizer.json``.

    Raises:
        InputError: the path is missing, a file that is not a SentencePiece model, a
            folder with only a SentencePiece ``tokenizer.model`` (the message names the
            file to patch), or a folder without ``tokenizer.json``.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        if os.path.isfile(os.path.join(p, "tokenizer.json")):
            return "hf"
        sp_path = os.path.join(p, "tokenizer.model")
        if os.path.isfile(sp_path):
            raise InputError(
                f"{p} has no tokenizer.json, only a SentencePiece tokenizer.model; "
                f"patch the .model file instead ({sp_path})"
            )
        raise InputError(f"{p} has no tokenizer.json; not an HF tokenizer folder")
    if os.path.isfile(p):
        if os.path.basename(p) == "tokenizer.json":
            raise InputError(f"{p}: pass the folder that holds tokenizer.json, not the file")
        if os.path.getsize(p) > _MAX_SP_MODEL_BYTES:
            raise InputError(f"{p} is too large to be a SentencePiece model")
        try:
            with open(p, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise InputError(f"cannot read {p}: {exc}") from exc
        try:
            sentencepiece_vocab_size(data)
        except InputError as exc:
            raise InputError(
                f"{p} is neither a SentencePiece model nor an HF tokenizer folder ({exc})"
            ) from exc
        return "sentencepiece"
    raise InputError(f"{p} does not exist")


def _tokenizer_json_size(data: bytes) -> int | None:
    """One past the largest id of an HF ``tokenizer.json``: its model's vocabulary (a
    ``{token: id}`` map, or a Unigram list whose index is the id) and its added tokens."""
    try:
        doc: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    ids: list[int] = []
    vocab = (doc.get("model") or {}).get("vocab") if isinstance(doc, dict) else None
    if isinstance(vocab, dict):
        ids += [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):
        ids.append(len(vocab) - 1)
    for t in (doc.get("added_tokens") or []) if isinstance(doc, dict) else []:
        if isinstance(t, dict) and isinstance(t.get("id"), int):
            ids.append(t["id"])
    return max(ids) + 1 if ids else None


def tokenizer_size(files: Mapping[str, bytes]) -> tuple[str, int] | None:
    """``(file, number of ids)`` of the tokenizer among ``files`` (name → bytes): its
    ``tokenizer.json`` (what transformers loads first), else its SentencePiece
    ``tokenizer.model``; None when there is neither or it cannot be read."""
    if "tokenizer.json" in files:
        size = _tokenizer_json_size(files["tokenizer.json"])
        if size is not None:
            return "tokenizer.json", size
    if "tokenizer.model" in files:
        try:
            return "tokenizer.model", sentencepiece_vocab_size(files["tokenizer.model"])
        except InputError:
            return None
    return None
