"""Append tokens to a Hugging Face tokenizer folder by editing its JSON files.

The folder is never loaded and re-saved through ``transformers`` (that rewrites every
file); instead:

* ``tokenizer.json``: each new token is appended to ``added_tokens`` with the next free
  id. ``tokenizers`` ignores the ``id`` written there for a token that is not in the
  model's vocab and numbers such tokens itself, continuing from the model's vocab size
  (or from the largest added id, when that is larger). That matches "next free id" for
  every model whose vocab ids are contiguous (always for Unigram, whose vocab is a
  list). A BPE / WordPiece / WordLevel vocab (a ``token -> id`` map) can have holes or
  ids past its length; there the tokens are also put into ``model.vocab`` with their ids,
  because ``tokenizers`` honours the id of an added token found in the model's vocab.
  The result is reloaded with ``tokenizers`` and checked before anything is written.
* ``tokenizer_config.json``: entries in ``added_tokens_decoder`` when the file has that
  map (``transformers`` 4.x writes it, 5.x does not, and creating it would switch
  ``transformers`` off reading ``special_tokens_map.json``); special tokens are appended
  to the special-token list: the list the file already has (``extra_special_tokens`` or
  ``additional_special_tokens``), otherwise the key the installed ``transformers`` uses
  (``extra_special_tokens`` from 5.0, ``additional_special_tokens`` before).
* ``special_tokens_map.json`` / ``added_tokens.json`` (legacy files): extended the same
  way when present. Every other file is copied unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from nemo_convert.errors import InputError, OutputExistsError, UnsupportedError
from nemo_convert.tokenizers.sentencepiece_patch import (
    PatchReport,
    TokenizerPatchError,
    check_new_tokens,
)

__all__ = ["add_tokens_hf"]

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS = "added_tokens.json"
SP_MODEL = "tokenizer.model"


def add_tokens_hf(
    src_dir: str,
    dst_dir: str,
    tokens: Sequence[str],
    *,
    special: bool = True,
    skip_existing: bool = False,
) -> PatchReport:
    """Write a copy of the HF tokenizer folder ``src_dir`` to ``dst_dir`` with ``tokens`` added.

    Args:
        src_dir: Folder holding ``tokenizer.json`` (and usually ``tokenizer_config.json``).
            It is only read.
        dst_dir: Output folder; must be empty or not exist yet.
        tokens: Tokens to add, in order; token ``i`` gets id ``old_vocab_size + i``,
            where ``old_vocab_size`` is one past the largest id the tokenizer has.
        special: Add them as special tokens (``special: true``, ``normalized: false``,
            listed among the extra special tokens) or as plain added tokens
            (``normalized: true``).
        skip_existing: Skip (and report) tokens the tokenizer already has, in its vocab or
            among its added tokens, instead of failing.

    Raises:
        InputError: ``src_dir`` is not an HF tokenizer folder (for one that only holds a
            SentencePiece ``tokenizer.model``, patch that file instead), a JSON file is
            unreadable, or a token is empty, duplicated, or already present.
        OutputExistsError: ``dst_dir`` exists and is not empty.
        UnsupportedError: the ids cannot be kept consistent for this model type.
        TokenizerPatchError: the patched ``tokenizer.json`` did not reload as expected.
    """
    wanted = check_new_tokens(tokens)
    tok_json_path = _check_src(src_dir)
    _check_dst(src_dir, dst_dir)

    text = _read_text(tok_json_path)
    data = _loads(text, tok_json_path)
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise InputError(f"{tok_json_path} has no 'model' section; not a tokenizers file")
    original = _load_tokenizer(text, tok_json_path)
    old_vocab: dict[str, int] = original.get_vocab(with_added_tokens=True)
    old_size = max(old_vocab.values()) + 1 if old_vocab else 0

    present = [t for t in wanted if t in old_vocab]
    if present and not skip_existing:
        raise InputError(
            "token(s) already in the tokenizer: "
            + ", ".join(f"{t!r} (id {old_vocab[t]})" for t in present)
            + "; pass --skip-existing (skip_existing=True in Python) to leave them out"
        )
    added = [(t, old_size + i) for i, t in enumerate(t for t in wanted if t not in old_vocab)]
    report = PatchReport(old_vocab_size=old_size, new_vocab_size=old_size + len(added),
                         added=added, skipped=present)

    edits: dict[str, str] = {}
    if added:
        edits[TOKENIZER_JSON] = _patch_tokenizer_json(data, text, old_vocab, added, special)
        for name, patch in ((TOKENIZER_CONFIG, _patch_config),
                            (SPECIAL_TOKENS_MAP, _patch_special_map),
                            (ADDED_TOKENS, _patch_added_tokens_file)):
            path = os.path.join(src_dir, name)
            if os.path.isfile(path):
                src_text = _read_text(path)
                new_obj = patch(_loads(src_text, path), added, special)
                edits[name] = _dumps_like(src_text, new_obj)
        if os.path.isfile(os.path.join(src_dir, SP_MODEL)):
            report.notes.append(
                f"{SP_MODEL} was copied unchanged and does not contain the new tokens; "
                "anything that loads it instead of tokenizer.json (slow tokenizers, NeMo's "
                "SentencePiece tokenizer) will not see them"
            )

    _write_output(src_dir, dst_dir, edits)
    return report


# -- input checks -------------------------------------------------------------------------


def _check_src(src_dir: str) -> str:
    """Return the path of ``tokenizer.json`` in ``src_dir`` or raise InputError."""
    if not os.path.isdir(src_dir):
        raise InputError(f"{src_dir} is not a folder (expected an HF tokenizer folder)")
    path = os.path.join(src_dir, TOKENIZER_JSON)
    if os.path.isfile(path):
        return path
    sp_path = os.path.join(src_dir, SP_MODEL)
    if os.path.isfile(sp_path):
        raise InputError(
            f"{src_dir} has no {TOKENIZER_JSON}, only a SentencePiece {SP_MODEL}; "
            f"patch the .model file instead ({sp_path})"
        )
    raise InputError(f"{src_dir} has no {TOKENIZER_JSON}; not an HF tokenizer folder")


def _check_dst(src_dir: str, dst_dir: str) -> None:
    if os.path.exists(dst_dir):
        if not os.path.isdir(dst_dir):
            raise OutputExistsError(f"{dst_dir} exists and is not a folder")
        if os.path.samefile(src_dir, dst_dir):
            raise InputError("the output folder must differ from the source folder")
        if os.listdir(dst_dir):
            raise OutputExistsError(f"output folder {dst_dir} is not empty")
    src = os.path.realpath(src_dir)
    dst = os.path.realpath(dst_dir)
    if dst.startswith(src + os.sep):
        raise InputError("the output folder must not be inside the source folder")


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc


def _loads(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from exc


def _load_tokenizer(text: str, what: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - comes with transformers
        raise UnsupportedError(f"the 'tokenizers' package is needed to patch {what}") from exc
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a plain Exception
        raise InputError(f"the tokenizers library cannot load {what}: {exc}") from exc


# -- tokenizer.json -----------------------------------------------------------------------


def _added_entry(token: str, idx: int, special: bool) -> dict[str, Any]:
    return {"id": idx, "content": token, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": not special, "special": special}


def _patch_tokenizer_json(data: dict[str, Any], text: str, old_vocab: dict[str, int],
                          added: list[tuple[str, int]], special: bool) -> str:
    """Return the new ``tokenizer.json`` text, verified by reloading it with ``tokenizers``."""
    entries = data.get("added_tokens")
    if entries is None:
        entries = data["added_tokens"] = []
    if not isinstance(entries, list):
        raise InputError("tokenizer.json: 'added_tokens' is not a list")
    entries.extend(_added_entry(t, i, special) for t, i in added)
    new_text = _dumps_like(text, data)
    if _ids_as_expected(_load_tokenizer(new_text, "the patched tokenizer.json"), added):
        return _verified(new_text, old_vocab, added)

    # tokenizers numbered the new tokens itself, differently (the vocab has holes or ids
    # past its length). It keeps the id of an added token that is in the model's vocab.
    model = data["model"]
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise UnsupportedError(
            f"cannot give the new tokens ids {added[0][1]}… in this "
            f"{model.get('type', 'unknown')} tokenizer: tokenizers numbers them differently "
            "and its vocab is not a token->id map"
        )
    vocab.update(dict(added))
    new_text = _dumps_like(text, data)
    return _verified(new_text, old_vocab, added)


def _ids_as_expected(tok: Any, added: list[tuple[str, int]]) -> bool:
    return all(tok.token_to_id(t) == i for t, i in added)


def _verified(new_text: str, old_vocab: dict[str, int], added: list[tuple[str, int]]) -> str:
    """Reload ``new_text`` and check old ids are kept and each new token has its id."""
    tok = _load_tokenizer(new_text, "the patched tokenizer.json")
    new_vocab = tok.get_vocab(with_added_tokens=True)
    moved = [t for t, i in old_vocab.items() if new_vocab.get(t) != i]
    if moved:
        raise TokenizerPatchError(
            f"patching changed the ids of existing tokens: {', '.join(map(repr, moved[:10]))}"
        )
    for t, i in added:
        got = tok.token_to_id(t)
        if got != i:
            raise TokenizerPatchError(f"patched tokenizer maps {t!r} to id {got}, expected {i}")
        if tok.id_to_token(i) != t:
            raise TokenizerPatchError(f"patched tokenizer maps id {i} to {tok.id_to_token(i)!r}")
        ids = tok.encode(t, add_special_tokens=False).ids
        if ids.count(i) != 1:
            raise TokenizerPatchError(f"patched tokenizer encodes {t!r} as {ids}, not with id {i}")
    return new_text


# -- tokenizer_config.json and legacy files ----------------------------------------------


def _transformers_major() -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 5


def _extend_list(obj: dict[str, Any], key: str, tokens: list[str]) -> None:
    current = obj.get(key) or []
    have = {t if isinstance(t, str) else str(t.get("content")) for t in current}
    obj[key] = list(current) + [t for t in tokens if t not in have]


def _special_list_key(obj: dict[str, Any]) -> str:
    """Which key lists the extra special tokens in this file (see the module docstring)."""
    for key in ("extra_special_tokens", "additional_special_tokens"):
        if isinstance(obj.get(key), list):
            return key
    if isinstance(obj.get("extra_special_tokens"), dict):
        # transformers 4.x: a dict of named model-specific tokens, not the list.
        return "additional_special_tokens"
    return "extra_special_tokens" if _transformers_major() >= 5 else "additional_special_tokens"


def _patch_config(obj: Any, added: list[tuple[str, int]], special: bool) -> Any:
    if not isinstance(obj, dict):
        raise InputError(f"{TOKENIZER_CONFIG} is not a JSON object")
    decoder = obj.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for t, i in added:
            decoder[str(i)] = {"content": t, "lstrip": False, "normalized": not special,
                               "rstrip": False, "single_word": False, "special": special}
    if special:
        _extend_list(obj, _special_list_key(obj), [t for t, _ in added])
    return obj


def _patch_special_map(obj: Any, added: list[tuple[str, int]], special: bool) -> Any:
    if not isinstance(obj, dict):
        raise InputError(f"{SPECIAL_TOKENS_MAP} is not a JSON object")
    if special:
        for key in ("extra_special_tokens", "additional_special_tokens"):
            if isinstance(obj.get(key), list):
                _extend_list(obj, key, [t for t, _ in added])
                break
    return obj


def _patch_added_tokens_file(obj: Any, added: list[tuple[str, int]], special: bool) -> Any:
    if not isinstance(obj, dict):
        raise InputError(f"{ADDED_TOKENS} is not a JSON object")
    obj.update(dict(added))
    return obj


def _dumps_like(original: str, obj: Any) -> str:
    """Serialize ``obj`` in the layout of ``original`` (indented or compact, final newline)."""
    if "\n" in original.strip():
        out = json.dumps(obj, indent=2, ensure_ascii=False)
    else:
        out = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return out + "\n" if original.endswith("\n") else out


# -- output -------------------------------------------------------------------------------


def _write_output(src_dir: str, dst_dir: str, edits: dict[str, str]) -> None:
    """Copy ``src_dir`` to ``dst_dir``, replacing the files named in ``edits``."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        src = os.path.join(src_dir, name)
        dst = os.path.join(dst_dir, name)
        if name in edits:
            with open(dst, "w", encoding="utf-8", newline="") as fh:
                fh.write(edits[name])
            shutil.copymode(src, dst)
        elif os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=False)
        else:
            shutil.copy2(src, dst)
