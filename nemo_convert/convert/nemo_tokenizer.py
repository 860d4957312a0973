"""The tokenizer of a ``.nemo``, as export writes it into the HF folder.

A config we wrote names the HF originals in our section (``nemo_convert.tokenizer_files``):
those are given back unchanged. A config NeMo wrote describes the tokenizer NeMo builds in
``MegatronBaseModel._build_tokenizer`` (``nemo/collections/nlp/models/language_modeling/
megatron_base_model.py`` L442-469 at NeMo ``8cfedd72``) through ``get_nmt_tokenizer``
(``nemo/collections/nlp/modules/common/tokenizer_utils.py`` L164-285), one kind per
``tokenizer.library``:

=================================================  =========================================
``tokenizer:`` section NeMo writes                 export writes
=================================================  =========================================
``library: sentencepiece``, ``model: nemo:…``      ``tokenizer.model`` (``tokenizer_model`` when
(also ``megatron`` / ``GPTSentencePieceTokenizer``) ``model`` names a missing member)
``library: huggingface``, ``type: <id or path>``   the HF files: a folder packed in the archive,
                                                   the local folder ``type`` names, or the hub
                                                   cache; ``vocab_file`` / ``merge_file`` /
                                                   ``model`` artifacts over them
``library: megatron``, ``type: GPT2BPETokenizer``  ``vocab.json``, ``merges.txt``,
``vocab_file`` + ``merge_file``                    ``tokenizer_config.json``, ``tokenizer.json``
``library: tiktoken``, ``vocab_file: nemo:…``      ``tokenizer.json``, ``tokenizer_config.json``
=================================================  =========================================

With each come the number of ids (what NeMo pads the embedding from) and the
``bos``/``eos``/``pad`` ids. Nothing is downloaded: what is neither in the archive nor on
this machine is one warning line naming the command that fetches it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from nemo_convert.convert.common import SECTION
from nemo_convert.errors import InputError
from nemo_convert.formats.hf.hub import cached_snapshot, hub_cache_dir, is_hub_id
from nemo_convert.tokenizers.gpt2_bpe import gpt2_facts, gpt2_hf_files
from nemo_convert.tokenizers.hf_files import DEFINING_FILES, HF_TOKENIZER_FILES, hf_tokenizer_facts
from nemo_convert.tokenizers.sentencepiece_patch import sentencepiece_special_ids, sentencepiece_vocab_size
from nemo_convert.tokenizers.tekken import TokenizerConversionError, read_tekken, tekken_hf_files

#: NeMo's artifact names: ``<32 hex>_<original basename>`` (save_restore_connector.py L466-474).
_ARTIFACT = re.compile(r"[0-9a-f]{32}_(?P<base>.+)")
#: GPT-2's files, which NeMo downloads by name when a GPT2BPETokenizer config names none
#: (megatron_utils.py L48-54, L158-193: Hugging Face's ``gpt2`` vocabulary and merges).
_GPT2_HUB_IDS = ("openai-community/gpt2", "gpt2")


@dataclass
class ExportTokenizer:
    """The tokenizer export writes, and what it tells about the model's vocabulary.

    ``files()`` builds the files on first use (a Tekken conversion takes seconds); a
    conversion that fails there is one more warning and no files."""

    kind: str  # "recorded", "sentencepiece", "huggingface", "gpt2-bpe", "tiktoken" or "none"
    vocab_size: int | None = None
    special_ids: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    build: Callable[[], dict[str, bytes]] | None = None
    _files: dict[str, bytes] | None = None

    def files(self) -> dict[str, bytes]:
        """``{file name: bytes}`` of the HF tokenizer folder (empty when there is none)."""
        if self._files is None:
            try:
                self._files = self.build() if self.build is not None else {}
            except (InputError, TokenizerConversionError) as exc:
                self.warnings.append(f"{exc}; no tokenizer files written")
                self._files = {}
        return self._files


def _member(ckpt: Any, ref: str) -> str | None:
    """The archive member ``ref`` (``nemo:<name>`` or a bare name) resolves to, if any."""
    name = ref[5:] if ref.startswith("nemo:") else ref
    member = ckpt.prefix + name
    if name and ckpt.container.exists(member) and not ckpt.container.is_dir(member):
        return member
    return None


def _original_name(ref: str) -> str:
    base = os.path.basename(ref[5:] if ref.startswith("nemo:") else ref)
    m = _ARTIFACT.fullmatch(base)
    return m.group("base") if m else base


def _nemo_added_tokens(tok: dict[str, Any]) -> list[str]:
    """Tokens the section makes NeMo add to an HF tokenizer when it loads
    (``special_tokens``: auto_tokenizer.py L95-165; ``additional_special_tokens``:
    megatron_base_model.py L467-469)."""
    out: list[str] = []
    special = tok.get("special_tokens")
    if isinstance(special, dict):
        for value in special.values():
            out += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    extra = tok.get("additional_special_tokens")
    if isinstance(extra, (list, dict)):
        out += [str(v) for v in (extra.values() if isinstance(extra, dict) else extra)]
    return out


def _added_tokens_warning(where: str, tok: dict[str, Any]) -> list[str]:
    added = _nemo_added_tokens(tok)
    if not added:
        return []
    shown = ", ".join(added[:6]) + (f" and {len(added) - 6} more" if len(added) > 6 else "")
    return [f"{where}: the tokenizer section lists special tokens ({shown}) that NeMo adds to the tokenizer when "
            "it loads (new ids after the vocabulary where they are not in it); the exported tokenizer does not "
            "have them"]


# ----------------------------------------------------------------------------- kinds

def _recorded(ckpt: Any, refs: dict[str, Any], facts: bool) -> ExportTokenizer:
    files = {os.path.basename(n): ckpt.artifact(ref) for n, ref in refs.items()}
    out = ExportTokenizer("recorded", build=lambda: files)
    if not facts:
        return out
    try:
        out.vocab_size, out.special_ids = hf_tokenizer_facts(files)
    except InputError as exc:
        out.warnings.append(f"{ckpt.path}: the tokenizer files could not be read ({exc})")
    return out


def _sentencepiece(ckpt: Any, tok: dict[str, Any]) -> ExportTokenizer:
    where = ckpt.path
    named = [(k, tok[k]) for k in ("model", "tokenizer_model") if isinstance(tok.get(k), str) and tok[k]]
    if not named:
        return ExportTokenizer("none", warnings=[f"{where}: the sentencepiece tokenizer section names no model "
                                                 "(tokenizer.model): no tokenizer files written"])
    found = next(((k, ref, m) for k, ref in named if (m := _member(ckpt, ref)) is not None), None)
    if found is None:
        refs = " or ".join(f"tokenizer.{k} {ref!r}" for k, ref in named)
        return ExportTokenizer("none", warnings=[f"{where}: the archive lacks the tokenizer model ({refs}): "
                                                 "no tokenizer files written"])
    key, ref, member = found
    model = ckpt.container.read_bytes(member)
    out = ExportTokenizer("sentencepiece", build=lambda: {"tokenizer.model": model})
    if key != named[0][0]:
        out.warnings.append(f"{where}: tokenizer.model names {named[0][1]!r}, which the archive lacks; used "
                            f"tokenizer.tokenizer_model {ref!r}, which NeMo's converters record beside it")
    try:
        out.vocab_size, out.special_ids = sentencepiece_vocab_size(model), sentencepiece_special_ids(model)
    except InputError as exc:
        out.warnings.append(f"the tokenizer model in the .nemo could not be read ({exc}); "
                            "config.json has no special token ids")
    return out


def _folder_files(read: Callable[[str], bytes | None]) -> dict[str, bytes]:
    files = {}
    for name in HF_TOKENIZER_FILES:
        data = read(name)
        if data is not None:
            files[name] = data
    return files if any(n in files for n in DEFINING_FILES) else {}


def _read_local(folder: str) -> Callable[[str], bytes | None]:
    def read(name: str) -> bytes | None:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    return read


def _hf_named_files(ckpt: Any, name: str) -> tuple[dict[str, bytes], str | None]:
    """The files of the HF tokenizer ``tokenizer.type`` names, and where they came from:
    a folder packed in the archive, the local folder (as ``from_pretrained`` looks first),
    or the hub cache."""
    rel = name[5:] if name.startswith("nemo:") else name
    folder = ckpt.prefix + rel.strip("/")
    if rel.strip("/") and ".." not in rel.split("/") and ckpt.container.is_dir(folder):
        files = _folder_files(lambda n: ckpt.container.read_bytes(f"{folder}/{n}")
                              if ckpt.container.exists(f"{folder}/{n}") else None)
        if files:
            return files, f"the folder {rel!r} packed in the .nemo"
    if name.startswith("nemo:"):
        return {}, None
    if os.path.isdir(name):
        files = _folder_files(_read_local(name))
        if files:
            return files, f"the local folder {os.path.abspath(name)}"
    if is_hub_id(name):
        snap = cached_snapshot(name, needs=DEFINING_FILES)
        if snap is not None:
            files = _folder_files(_read_local(snap))
            if files:
                return files, f"the hub cache ({snap})"
    return {}, None


def _overlay_name(key: str, ref: str) -> str:
    base = _original_name(ref)
    if base in HF_TOKENIZER_FILES:
        return base
    if key == "merge_file":
        return "merges.txt"
    if key == "model":
        return "tokenizer.model"
    return "vocab.json" if base.endswith(".json") else "vocab.txt"


def _huggingface(ckpt: Any, tok: dict[str, Any]) -> ExportTokenizer:
    where = ckpt.path
    name = tok.get("type")
    files, origin = _hf_named_files(ckpt, name) if isinstance(name, str) and name else ({}, None)
    out = ExportTokenizer("huggingface")
    if origin is not None:
        out.notes.append(f"tokenizer: {name!r} (tokenizer.library huggingface) from {origin}")
    for key in ("vocab_file", "merge_file", "model"):  # what NeMo passes from_pretrained besides the name
        ref = tok.get(key)
        if not isinstance(ref, str) or not ref:
            continue
        member = _member(ckpt, ref)
        if member is None:
            out.warnings.append(f"{where}: tokenizer.{key} names {ref!r}, which the archive lacks; not written")
            continue
        files[_overlay_name(key, ref)] = ckpt.container.read_bytes(member)
    if not any(n in files for n in DEFINING_FILES):
        if not files and isinstance(name, str) and is_hub_id(name):
            out.warnings.append(
                f"{where}: the tokenizer is the Hugging Face tokenizer {name!r} (tokenizer.library huggingface), "
                f"which the .nemo does not contain and the hub cache ({hub_cache_dir()}) does not hold: no "
                f"tokenizer files written; nemo-convert never downloads: run `hf download {name} --include "
                "'tokenizer*'`, then export again")
        else:
            out.warnings.append(
                f"{where}: the tokenizer is the Hugging Face tokenizer in {name!r} (tokenizer.library huggingface), "
                "which is neither in the .nemo nor on this machine"
                + (": only " + ", ".join(sorted(files)) + " written" if files else ": no tokenizer files written")
                + "; copy that folder's tokenizer files into the output")
    out.warnings += _added_tokens_warning(where, tok)
    out.build = lambda: files
    try:
        out.vocab_size, out.special_ids = hf_tokenizer_facts(files)
    except InputError as exc:
        out.warnings.append(f"{where}: the Hugging Face tokenizer files could not be read ({exc})")
    return out


def _gpt2_from_cache() -> tuple[bytes, bytes, str] | None:
    for hub_id in _GPT2_HUB_IDS:
        snap = cached_snapshot(hub_id, needs=("vocab.json",))
        if snap is not None and os.path.isfile(os.path.join(snap, "merges.txt")):
            read = _read_local(snap)
            return read("vocab.json") or b"", read("merges.txt") or b"", snap
    return None


def _gpt2(ckpt: Any, tok: dict[str, Any]) -> ExportTokenizer:
    where = ckpt.path
    refs = {k: tok.get(k) for k in ("vocab_file", "merge_file")}
    out = ExportTokenizer("gpt2-bpe")
    if not any(isinstance(r, str) and r for r in refs.values()):
        # NeMo fetches GPT-2's own files by name (megatron-gpt-345m): take them from the hub cache
        cached = _gpt2_from_cache()
        if cached is None:
            out.warnings.append(
                f"{where}: the GPT2BPETokenizer section names no vocab_file/merge_file, so NeMo uses GPT-2's "
                f"own, which the hub cache ({hub_cache_dir()}) does not hold: no tokenizer files written; "
                "nemo-convert never downloads: run `hf download openai-community/gpt2 --include vocab.json "
                "merges.txt`, then export again")
            return out
        vocab, merges, snap = cached
        out.notes.append(f"tokenizer: GPT-2's vocabulary and merges (NeMo downloads them for a GPT2BPETokenizer "
                         f"that names none) from the hub cache ({snap})")
    else:
        members = {k: _member(ckpt, r) if isinstance(r, str) and r else None for k, r in refs.items()}
        missing = [f"tokenizer.{k} {refs[k]!r}" for k, m in members.items() if m is None]
        if missing:
            out.warnings.append(f"{where}: the archive lacks the GPT-2 BPE files ({', '.join(missing)}): no "
                                "tokenizer files written")
            return out
        vocab, merges = (ckpt.container.read_bytes(str(members[k])) for k in ("vocab_file", "merge_file"))
    out.warnings += _added_tokens_warning(where, tok)
    try:
        out.vocab_size, out.special_ids = gpt2_facts(vocab, where)
    except InputError as exc:
        out.warnings.append(f"{exc}; no tokenizer files written")
        return out
    out.build = lambda: gpt2_hf_files(vocab, merges, where)
    return out


def _tiktoken(ckpt: Any, tok: dict[str, Any]) -> ExportTokenizer:
    where = ckpt.path
    ref = tok.get("vocab_file")
    member = _member(ckpt, ref) if isinstance(ref, str) and ref else None
    if member is None:
        return ExportTokenizer("none", warnings=[f"{where}: the archive lacks the tiktoken vocabulary "
                                                 f"(tokenizer.vocab_file {ref!r}): no tokenizer files written"])
    try:
        spec = read_tekken(ckpt.container.read_bytes(member), f"{where}: {member}")
    except InputError as exc:
        return ExportTokenizer("none", warnings=[f"{exc}; no tokenizer files written"])
    return ExportTokenizer("tiktoken", spec.vocab_size, spec.special_ids(),
                           build=lambda: tekken_hf_files(spec, f"{where}: {member}"))


def special_ids_of(files: dict[str, bytes]) -> dict[str, int]:
    """The ``bos``/``eos``/``pad`` token ids a tokenizer folder's ``files`` tell, as export
    reads them from a ``.nemo`` (a SentencePiece ``tokenizer.model`` alone, or the HF
    files); none when they cannot be read."""
    try:
        if set(files) == {"tokenizer.model"}:
            return sentencepiece_special_ids(files["tokenizer.model"])
        return hf_tokenizer_facts(files)[1] if files else {}
    except InputError:
        return {}


def export_tokenizer(ckpt: Any, *, facts: bool = True) -> ExportTokenizer:
    """The tokenizer of ``ckpt`` (a :class:`~nemo_convert.formats.nemo.nemo.NemoCheckpoint`
    or a reader like it) as an HF tokenizer folder, with its size and special ids
    (``facts=False``: not read from the files our section names, for a config that records
    them itself)."""
    cfg = ckpt.config
    ours = cfg.get(SECTION) if isinstance(cfg.get(SECTION), dict) else {}
    if ours.get("tokenizer_files"):
        return _recorded(ckpt, ours["tokenizer_files"], facts)
    tok = cfg.get("tokenizer")
    if not isinstance(tok, dict):
        return ExportTokenizer("none")
    library = str(tok.get("library") or ("sentencepiece" if tok.get("model") else "")).lower()
    kind = tok.get("type")
    if library == "sentencepiece" or (library == "megatron" and kind == "GPTSentencePieceTokenizer"):
        return _sentencepiece(ckpt, tok)
    if library == "megatron" and kind in ("GPT2BPETokenizer", "megatron-gpt-345m"):
        return _gpt2(ckpt, tok)
    if library == "huggingface":
        return _huggingface(ckpt, tok)
    if library == "tiktoken":
        return _tiktoken(ckpt, tok)
    if not library:
        return ExportTokenizer("none")
    return ExportTokenizer("none", warnings=[
        f"{ckpt.path}: tokenizer.library {library!r}" + (f" (type {kind!r})" if kind else "")
        + " has no Hugging Face equivalent export knows: no tokenizer files written"])
