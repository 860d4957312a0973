"""Add tokens to a tokenizer: a SentencePiece ``.model``, an HF tokenizer folder, or the
tokenizer embedded in a ``.nemo``.

The patch itself is done by a :class:`~nemo_convert.plugins.records.TokenizerPatcher`
chosen through the registry (the first whose ``detect(path)`` is true); ours live in the
``nemo_convert_tokenizers`` plugin. For a ``.nemo`` (tar, gzipped tar or unpacked folder)
the embedded tokenizer files are patched and a **new** ``.nemo`` is written: every other
member is streamed unchanged from the input into a :class:`TarWriter` (nothing is
extracted), the patched files get new artifact names, and ``model_config.yaml`` is
updated to reference them. Embeddings are never resized: the report says so.
Every output is atomic (:func:`staged_output`); inputs are only read.
"""

from __future__ import annotations

import copy
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import yaml

from nemo_convert.convert.common import SECTION, dict_at, registry_or_default
from nemo_convert.convert.nemo_defaults import complete_nemo_config
from nemo_convert.convert.nemo_write import override_vocab_size
from nemo_convert.errors import InputError, NemoConvertError
from nemo_convert.formats.nemo.nemo import CONFIG_MEMBER, artifact_name, dump_yaml, load_yaml
from nemo_convert.formats.io.staging import check_target, staged_output
from nemo_convert.formats.io.tar_archive import Container, find_member, open_nemo_container
from nemo_convert.formats.io.tar_writer import TarWriter
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import TokenizerPatcher
from nemo_convert.tokenizers import detect_tokenizer_kind

PieceType = Literal["user_defined", "control"]

SP_FILE = "tokenizer.model"
HF_FILE = "tokenizer.json"
_COPY_CHUNK = 16 << 20
_HASHED = re.compile(r"^[0-9a-f]{32}_")


@dataclass
class PatchedFile:
    """One tokenizer patched by one patcher."""

    file: str  # "tokenizer.model", or "tokenizer.json" for an HF folder
    patcher: str
    old_vocab_size: int
    new_vocab_size: int
    added: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class AddTokensReport:
    """What ``tokenizer add-tokens`` did; ``--json`` prints :meth:`as_dict`.

    ``old_vocab_size`` / ``new_vocab_size`` / ``added`` / ``skipped`` are those of the
    tokenizer the model uses (for a ``.nemo`` with both a SentencePiece model and an HF
    ``tokenizer.json``, the one ``cfg.tokenizer.library`` names); ``tokenizers`` lists
    every tokenizer patched. ``artifacts`` maps each replaced ``.nemo`` member to its new
    name. ``embeddings_resized`` is always false: only the tokenizer changes.
    """

    input: str
    output: str
    kind: str  # "sentencepiece", "hf", another patcher's name, or "nemo"
    old_vocab_size: int
    new_vocab_size: int
    added: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tokenizers: list[PatchedFile] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    embeddings_resized: bool = False

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["added"] = [list(a) for a in self.added]
        d["tokenizers"] = [{**t.__dict__, "added": [list(a) for a in t.added]} for t in self.tokenizers]
        return d


# -- choosing a patcher ------------------------------------------------------------------


def choose_patcher(path: str, registry: Registry | None = None) -> TokenizerPatcher:
    """The first registered patcher whose ``detect(path)`` is true.

    :raises InputError: none handles ``path`` (with the most specific reason we know).
    """
    reg = registry_or_default(registry)
    for provided in reg.tokenizer_patchers.values():
        rec: TokenizerPatcher = provided.record
        if rec.detect(path):
            return rec
    known = ", ".join(sorted(reg.tokenizer_patchers)) or "none"
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    try:
        detect_tokenizer_kind(path)  # raises with a precise message for the usual mistakes
    except InputError as exc:
        raise InputError(f"{exc} (tokenizer patchers installed: {known})") from None
    raise InputError(f"{path}: no installed tokenizer patcher handles it (installed: {known})")


def _result(file: str, patcher: TokenizerPatcher, rep: Any) -> PatchedFile:
    """Normalise a patcher's report (ours return :class:`PatchReport`; plugins may return a dict)."""
    get = rep.get if isinstance(rep, dict) else (lambda k, d=None: getattr(rep, k, d))
    return PatchedFile(file, patcher.name, int(get("old_vocab_size", 0) or 0), int(get("new_vocab_size", 0) or 0),
                       [(str(t), int(i)) for t, i in (get("added", None) or [])], list(get("skipped", None) or []),
                       list(get("notes", None) or []))


def _check_args(src: str, out: str, tokens: Sequence[str], piece_type: str) -> list[str]:
    if isinstance(tokens, (str, bytes)):
        raise InputError("tokens must be a list of strings, not a single string")
    tokens = list(tokens)
    if not tokens:
        raise InputError("no tokens given")
    if piece_type not in ("user_defined", "control"):
        raise InputError(f"piece_type must be 'user_defined' or 'control', not {piece_type!r}")
    if not os.path.exists(src):
        raise InputError(f"{src}: no such file or folder")
    if os.path.exists(out) and os.path.samefile(src, out):
        raise InputError("the output must differ from the input (inputs are never modified)")
    src_real, out_real = os.path.realpath(src), os.path.realpath(out)
    if os.path.isdir(src) and out_real.startswith(src_real + os.sep):
        raise InputError("the output must not be inside the input folder")
    if src_real.startswith(out_real + os.sep):
        raise InputError("the output must not be a folder that holds the input")
    return tokens


def is_nemo(path: str) -> bool:
    """A ``.nemo``: a (gzipped) tar, or a folder holding ``model_config.yaml``."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, CONFIG_MEMBER))
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            return True
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


# -- the public function ------------------------------------------------------------------


def add_tokens(src: str | os.PathLike[str], out: str | os.PathLike[str], tokens: Sequence[str], *,
               piece_type: PieceType = "user_defined",
               skip_existing: bool = False, overwrite: bool = False,
               registry: Registry | None = None) -> AddTokensReport:
    """Write a copy of the tokenizer ``src`` with ``tokens`` appended, at ``out``.

    :param src: a SentencePiece ``.model`` file, an HF tokenizer folder (with
        ``tokenizer.json``), or a ``.nemo`` (tar, gzipped tar or unpacked folder).
    :param out: the file / folder / ``.nemo`` (always a tar) to write; never ``src``.
    :param tokens: tokens to add, in order; they get the ids after every existing one.
    :param piece_type: ``"user_defined"`` (SentencePiece USER_DEFINED; a plain HF added
        token) or ``"control"`` (SentencePiece CONTROL; an HF special token).
    :param skip_existing: leave out (and report) tokens already present instead of failing.
    :param overwrite: replace an existing ``out``.
    :param registry: where the patchers come from (default: the installed plugins).
    """
    src, out = os.fspath(src), os.fspath(out)
    tokens = _check_args(src, out, tokens, piece_type)
    options = {"piece_type": piece_type, "skip_existing": skip_existing}
    nemo = is_nemo(src)
    check_target(out, overwrite=overwrite, kind="nemo" if nemo else "tokenizer", is_dir=not nemo and os.path.isdir(src))
    if nemo:
        return _patch_nemo(src, out, tokens, options, registry, overwrite)
    patcher = choose_patcher(src, registry)
    with staged_output(out, overwrite=overwrite, is_dir=os.path.isdir(src), kind="tokenizer") as stage:
        res = _result(HF_FILE if os.path.isdir(src) else os.path.basename(src), patcher,
                      patcher.add_tokens(src, stage, tokens, options))
    return AddTokensReport(src, out, patcher.name, res.old_vocab_size, res.new_vocab_size, res.added, res.skipped,
                           list(res.notes), [res])


# -- .nemo ---------------------------------------------------------------------------------


def _ref_member(ref: str, prefix: str) -> str:
    return prefix + (ref[5:] if ref.startswith("nemo:") else ref)


def _plain_basename(member: str) -> str:
    """``<32 hex>_tokenizer.model`` → ``tokenizer.model``."""
    base = member.rsplit("/", 1)[-1]
    return _HASHED.sub("", base, count=1)


def _replace_refs(obj: Any, old: dict[str, str]) -> Any:
    """Every string in ``obj`` equal to an old reference (``nemo:x`` or bare ``x``) → new one."""
    if isinstance(obj, dict):
        return {k: _replace_refs(v, old) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace_refs(v, old) for v in obj]
    if isinstance(obj, str):
        key = obj[5:] if obj.startswith("nemo:") else obj
        if key in old:
            return "nemo:" + old[key]
    return obj


def _read_raw_config(container: Container, cfg_name: str) -> tuple[Any, dict[str, Any]]:
    """The YAML document as stored, and the model config inside it (unwrapping ``model:``)."""
    data = container.read_bytes(cfg_name)
    load_yaml(data, f"{container.path}:{cfg_name}")  # validates, with our error messages
    raw = yaml.safe_load(data.decode("utf-8"))
    wrapped = isinstance(raw.get("model"), dict) and len(raw) == 1
    return raw, (raw["model"] if wrapped else raw)


def _copy_member(container: Container, name: str, w: TarWriter) -> None:
    region = container.region(name)
    reader = container.open(name)
    try:
        with w.open_member(name) as dst:
            left = region.length
            while left:
                chunk = reader.read(min(_COPY_CHUNK, left))
                if not chunk:
                    raise InputError(f"{container.path}: member {name!r} is truncated")
                dst.write(chunk)
                left -= len(chunk)
    finally:
        reader.close()


def _patch_nemo(src: str, out: str, tokens: list[str], options: dict[str, Any], registry: Registry | None,
                overwrite: bool) -> AddTokensReport:
    container = open_nemo_container(src)
    try:
        cfg_name = find_member(container, CONFIG_MEMBER)
        prefix = cfg_name[: -len(CONFIG_MEMBER)]
        raw, cfg = _read_raw_config(container, cfg_name)
        ours = dict_at(cfg, SECTION)
        files: dict[str, str] = {k: v for k, v in (ours.get("tokenizer_files") or {}).items() if isinstance(v, str)}
        tok = dict_at(cfg, "tokenizer")
        library = str(tok.get("library") or "")

        sp_members: list[str] = []  # distinct SentencePiece members
        if SP_FILE in files:
            sp_members.append(_ref_member(files[SP_FILE], prefix))
        model_ref = tok.get("model")
        if isinstance(model_ref, str) and model_ref and (library == "sentencepiece" or model_ref.endswith(".model")):
            m = _ref_member(model_ref, prefix)
            if m not in sp_members:
                sp_members.append(m)
        hf_members = {n: _ref_member(r, prefix) for n, r in files.items() if n != SP_FILE}
        if HF_FILE not in hf_members:
            hf_members = {}
        if not sp_members and not hf_members:
            raise InputError(f"{src}: carries no tokenizer to patch (no {SP_FILE} artifact in cfg.tokenizer.model "
                             f"and no tokenizer files in cfg.{SECTION}.tokenizer_files)")
        for m in sp_members + list(hf_members.values()):
            if not container.exists(m) or container.is_dir(m):
                raise InputError(f"{src}: the config references artifact {m[len(prefix):]!r}, which the archive lacks")

        new_bytes: dict[str, tuple[str, bytes]] = {}  # old member -> (new member, bytes)
        results: list[PatchedFile] = []
        with tempfile.TemporaryDirectory(prefix="nemo-convert-tok-") as tmp:
            for i, member in enumerate(sp_members):
                base = _plain_basename(member)
                path = os.path.join(tmp, f"sp{i}", base)
                os.makedirs(os.path.dirname(path))
                with open(path, "wb") as f:
                    f.write(container.read_bytes(member))
                patcher = choose_patcher(path, registry)
                dst = os.path.join(tmp, f"sp{i}", "patched_" + base)
                res = _result(SP_FILE, patcher, patcher.add_tokens(path, dst, tokens, options))
                results.append(res)
                with open(dst, "rb") as f:
                    data = f.read()
                if data != container.read_bytes(member):
                    new_bytes[member] = (prefix + artifact_name(data, base), data)
            if hf_members:
                folder, patched = os.path.join(tmp, "hf"), os.path.join(tmp, "hf_patched")
                os.makedirs(folder)
                for name, member in hf_members.items():
                    with open(os.path.join(folder, os.path.basename(name)), "wb") as f:
                        f.write(container.read_bytes(member))
                patcher = choose_patcher(folder, registry)
                res = _result(HF_FILE, patcher, patcher.add_tokens(folder, patched, tokens, options))
                results.append(res)
                for name, member in hf_members.items():
                    with open(os.path.join(patched, os.path.basename(name)), "rb") as f:
                        data = f.read()
                    if data != container.read_bytes(member):
                        new_bytes[member] = (prefix + artifact_name(data, os.path.basename(name)), data)

        clash = [new for old, (new, _) in new_bytes.items() if container.exists(new) and new not in new_bytes]
        if clash:
            raise InputError(f"{src}: already holds member(s) named like the patched tokenizer: {', '.join(clash)}")

        primary = next((r for r in results if r.file == (HF_FILE if library == "huggingface" else SP_FILE)),
                       results[0])
        notes: list[str] = []
        for r in results:
            notes.extend(f"{r.file}: {n}" for n in r.notes)
        if len(results) > 1 and len({tuple(r.added) for r in results}) > 1:
            notes.append("the tokenizers in this .nemo gave the new tokens different ids: "
                         + "; ".join(f"{r.file}: {r.added}" for r in results))
        rows = (ours.get("hf_config") or {}).get("vocab_size") if isinstance(ours.get("hf_config"), dict) else None
        if primary.added:
            line = (f"vocabulary grew from {primary.old_vocab_size} to {primary.new_vocab_size}; "
                    "embeddings were not resized")
            if isinstance(rows, int) and primary.new_vocab_size > rows:
                line += (f" (the model's embedding has {rows} rows: token ids {rows} and above have no row "
                         "until the embedding and output layer are resized)")
            notes.insert(0, line)
        else:
            notes.insert(0, f"no token added (all already present); vocabulary stays {primary.old_vocab_size}")

        renames = {old[len(prefix):]: new[len(prefix):] for old, (new, _) in new_bytes.items()}
        new_cfg = _replace_refs(cfg, renames)
        vocab, padded = ours.get("vocab_size"), ours.get("padded_vocab_size")
        if isinstance(vocab, int) and isinstance(padded, int):  # NeMo would size the embedding from the tokenizer
            override_vocab_size(new_cfg, [(new[len(prefix):], data) for new, data in new_bytes.values()], vocab, padded)
        # what NeMo's class reads at construction, where missing; our section stays last
        complete_nemo_config(new_cfg, registry_or_default(registry).nemo_runtime_defaults())
        if isinstance(new_cfg.get(SECTION), dict):
            new_cfg[SECTION] = new_cfg.pop(SECTION)
        if primary.added:
            sec = new_cfg.setdefault(SECTION, {})
            sec.setdefault("tokenizer_patches", []).append(
                {"tokens": [t for t, _ in primary.added], "piece_type": options["piece_type"],
                 "old_vocab_size": primary.old_vocab_size, "new_vocab_size": primary.new_vocab_size,
                 "embeddings_resized": False})
        if raw is cfg:
            doc: Any = new_cfg
        else:
            doc = copy.copy(raw)
            doc["model"] = new_cfg

        with staged_output(out, overwrite=overwrite, is_dir=False, kind="nemo") as stage:
            with TarWriter(stage) as w:
                for name in container.names():
                    if name == cfg_name:
                        w.add_bytes(name, dump_yaml(doc))
                    elif name in new_bytes:
                        w.add_bytes(*new_bytes[name])
                    else:
                        _copy_member(container, name, w)
    except NemoConvertError:
        raise
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"{src}: unreadable config ({exc})") from None
    finally:
        container.close()
    return AddTokensReport(src, out, "nemo", primary.old_vocab_size, primary.new_vocab_size, primary.added,
                           primary.skipped, notes, results, renames)


__all__ = ["AddTokensReport", "PatchedFile", "add_tokens", "choose_patcher", "is_nemo"]
