"""Facts about a Hugging Face tokenizer given as its files (``{file name: bytes}``).

What export needs to know of the tokenizer it writes: which files make an HF tokenizer
folder, how many ids the tokenizer has (``len(tokenizer)``, what NeMo's ``AutoTokenizer``
wrapper reports as ``vocab_size``: ``nemo/collections/common/tokenizers/huggingface/
auto_tokenizer.py`` L207-215 at NeMo ``8cfedd72``) and the ids of its ``bos``/``eos``/``pad``
tokens. Read with ``tokenizers`` (``tokenizer.json``) or SentencePiece
(``tokenizer.model``), never by running anything from the files.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_convert.errors import InputError
from nemo_convert.tokenizers.sentencepiece_patch import sentencepiece_special_ids, sentencepiece_vocab_size

#: The files ``transformers.AutoTokenizer.from_pretrained`` reads from a folder, and nothing
#: else: these are what export copies out of a hub snapshot or a tokenizer folder.
HF_TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.jinja",
    "chat_template.json",
)

#: The files that make a folder an HF tokenizer on their own (with the class they name or imply).
DEFINING_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

_ROLES = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "pad_token_id"))


def json_file(obj: Any) -> bytes:
    """A JSON file as ``transformers`` writes its tokenizer files (indented, UTF-8, newline)."""
    return (json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])  # an AddedToken as transformers serialises it
    return None


def _json(files: dict[str, bytes], name: str) -> Any:
    if name not in files:
        return None
    try:
        return json.loads(files[name].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{name} is not valid JSON ({exc})") from None


def special_token_names(files: dict[str, bytes]) -> dict[str, str]:
    """``{"bos_token": text, …}`` as ``tokenizer_config.json`` names them (else
    ``special_tokens_map.json``)."""
    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        obj = _json(files, name)
        if not isinstance(obj, dict):
            continue
        for role, _ in _ROLES:
            text = _token_text(obj.get(role))
            if text is not None:
                out[role] = text
    return out


def hf_tokenizer_facts(files: dict[str, bytes]) -> tuple[int | None, dict[str, int]]:
    """``(number of ids, {"bos_token_id": …, "eos_token_id": …, "pad_token_id": …})`` of
    an HF tokenizer's files; ``None`` when they do not tell (no ``tokenizer.json``, and a
    ``tokenizer.model`` with extra ``added_tokens.json``).

    Raises:
        InputError: a file that should parse does not.
    """
    if "tokenizer.json" in files:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
        except Exception as exc:  # tokenizers raises plain Exception
            raise InputError(f"tokenizer.json does not load: {exc}") from None
        ids: dict[str, int] = {}
        for role, key in _ROLES:
            text = special_token_names(files).get(role)
            found = tok.token_to_id(text) if text is not None else None
            if found is not None:
                ids[key] = int(found)
        return int(tok.get_vocab_size(with_added_tokens=True)), ids
    if "tokenizer.model" in files:
        size = sentencepiece_vocab_size(files["tokenizer.model"])
        return (None if "added_tokens.json" in files else size), sentencepiece_special_ids(files["tokenizer.model"])
    return None, {}
