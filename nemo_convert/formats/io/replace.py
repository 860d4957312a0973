"""What ``--overwrite`` may replace: only an output of the kind being written, or an empty folder.

Every writer checks its target here, through :func:`~nemo_convert.formats.io.staging.check_target`
(before any work) and :func:`~nemo_convert.formats.io.staging.staged_output` (again at install
time). An existing target is recognised by its **content**, never by its name:

=====================  ======================================================================
kind                   replaced when the existing target is …
=====================  ======================================================================
``nemo``               a tar (or gzipped tar) with ``model_config.yaml`` among its first
                       members, or a folder with ``model_config.yaml`` whose other entries are
                       ``.nemo`` members (weights, rank folders, artifacts)
``hf``                 a folder with ``config.json`` and weights, holding nothing but
                       Hugging Face checkpoint files (no subfolders)
``megatron-bridge``    a folder with ``latest_checkpointed_iteration.txt`` or ``iter_*``
                       folders, holding nothing else a Megatron-Bridge directory does not
``qnemo``              a folder (or tar) with ``config.json`` and ``rank{i}.safetensors``
``tokenizer``          a SentencePiece model file, or a folder with ``tokenizer.json``
                       holding nothing but Hugging Face checkpoint files
=====================  ======================================================================

and, for every kind, an **empty folder**. Anything else is refused by name, with what was
found there (``mymodels: holds files that are not a Hugging Face checkpoint (notes.txt,
other-project/)``). A symbolic link is never replaced. Some folders are never replaced
whatever they hold (:func:`protected_reason`): ``/``, the home folder, the current folder
and every folder above it (``-o .``, ``-o ~``, ``-o ..``).

The module reads names, tar headers and at most a small file; it never parses weights.
"""

from __future__ import annotations

import os
import re
import tarfile
from typing import Literal

from nemo_convert.errors import InputError, OutputError, OutputExistsError
from nemo_convert.tokenizers.sentencepiece_patch import sentencepiece_vocab_size

OutputKind = Literal["nemo", "hf", "megatron-bridge", "qnemo", "tokenizer"]

#: How each kind is named in messages.
KIND_NAMES: dict[str, str] = {
    "nemo": "a .nemo checkpoint",
    "hf": "a Hugging Face checkpoint",
    "megatron-bridge": "a Megatron-Bridge checkpoint directory",
    "qnemo": "a .qnemo checkpoint",
    "tokenizer": "a tokenizer",
}
#: The file name a kind's file output is usually given (for the trailing-``/`` message).
FILE_EXAMPLES: dict[str, str] = {"nemo": "model.nemo", "qnemo": "model.qnemo", "tokenizer": "tokenizer.model"}

#: Files a Hugging Face model or tokenizer folder holds (what ``export`` and the hub write).
HF_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json", "vocab.txt",
    "merges.txt", "chat_template.json", "chat_template.jinja", "preprocessor_config.json", "processor_config.json",
    "README.md", "LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "USE_POLICY.md", ".gitattributes",
})
HF_WEIGHTS = re.compile(r"^(.+\.safetensors|pytorch_model(-\d+-of-\d+)?\.bin)$")
HF_INDEX = re.compile(r"^(.+\.safetensors|pytorch_model\.bin)\.index\.json$")
_RANK_FILE = re.compile(r"^rank\d+\.safetensors$")
_NEMO_RANK_DIR = re.compile(r"^(mp_rank_\d{2,}|tp_rank_\d{2,}_pp_rank_\d{3,})$")
_NEMO_ARTIFACT = re.compile(r"^[0-9a-f]{32}_.+$")  # NeMo's artifact names: <md5>_<basename>
_MEGATRON_ITER = re.compile(r"^(iter_\d{7,}|release)$")
_MEGATRON_FILES = frozenset({"latest_checkpointed_iteration.txt", "latest_train_state.pt"})
#: Tar members looked at (a .nemo or .qnemo tar starts with its config), and for a gzipped
#: tar the decompressed bytes read at most, while looking.
_TAR_PEEK = 64
_GZIP_PEEK_BYTES = 64 << 20
_SP_MAX_BYTES = 256 << 20
_LISTED = 6


def _same(a: str, b: str) -> bool:
    return a == b or (os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))


def protected_reason(path: str) -> str | None:
    """Why ``path`` is never replaced, or None: the root folder, the home folder, the
    current folder, or a folder that holds the current or the home folder."""
    real = os.path.realpath(path)
    if os.path.dirname(real) == real:
        return "the root folder"
    try:
        cwd: str | None = os.path.realpath(os.getcwd())
    except OSError:  # the current folder was deleted
        cwd = None
    home = os.path.realpath(os.path.expanduser("~"))
    if cwd is not None and _same(real, cwd):
        return "the current folder"
    if _same(real, home):
        return "your home folder"
    if cwd is not None and cwd.startswith(real.rstrip(os.sep) + os.sep):
        return "a folder that holds the current folder"
    if home.startswith(real.rstrip(os.sep) + os.sep):
        return "a folder that holds your home folder"
    return None


def _entries(path: str) -> list[str]:
    """The names in folder ``path``, sorted, folders shown with a trailing ``/``."""
    try:
        with os.scandir(path) as it:
            return sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in it)
    except OSError as exc:
        raise OutputError(f"{path}: cannot list the folder to see what it holds ({exc.strerror or exc})") from None


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def _tar_names(path: str) -> list[str] | None:
    """The base names of the first members of the tar (or gzipped tar) ``path``; None when
    it is not one."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        names: list[str] = []
        with tarfile.open(path, "r|gz" if gz else "r:") as tf:
            for ti in tf:
                names.append(os.path.basename(ti.name.rstrip("/")))
                if len(names) >= _TAR_PEEK or (gz and tf.offset > _GZIP_PEEK_BYTES):
                    break
        return names
    except (tarfile.TarError, OSError, EOFError, ValueError):
        return None


def _hf_unknown(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith("/") or not (n in HF_FILES or HF_WEIGHTS.match(n) or HF_INDEX.match(n))]


def _not_ours_folder(path: str, kind: str) -> str | None:
    """None when the folder ``path`` is an output of ``kind`` (or empty); else what it holds."""
    names = _entries(path)
    if not names:
        return None
    what = KIND_NAMES[kind]
    if kind == "hf" or kind == "tokenizer":
        marker = "config.json" if kind == "hf" else "tokenizer.json"
        unknown = _hf_unknown(names)
        if unknown:
            return f"holds files that are not {what} ({_listing(unknown)})"
        if marker not in names:
            return f"has no {marker}: it is not {what}"
        if kind == "hf" and not any(HF_WEIGHTS.match(n) for n in names):
            return f"has no weights: it is not {what}"
        return None
    if kind == "nemo":
        if "model_config.yaml" not in names:
            return f"has no model_config.yaml: it is not {what} (it holds {_listing(names)})"
        unknown = [n for n in names if not (
            n in ("model_config.yaml", "model_weights.ckpt", "model_weights/")
            or (n.endswith("/") and _NEMO_RANK_DIR.match(n[:-1]))
            or (not n.endswith("/") and (_NEMO_ARTIFACT.match(n) or n in HF_FILES)))]
        return f"holds files that are not {what} ({_listing(unknown)})" if unknown else None
    if kind == "megatron-bridge":
        if not any(n == "latest_checkpointed_iteration.txt" or
                   (n.endswith("/") and _MEGATRON_ITER.match(n[:-1])) for n in names):
            return f"has no latest_checkpointed_iteration.txt and no iter_* folder: it is not {what} " \
                   f"(it holds {_listing(names)})"
        unknown = [n for n in names if not (n in _MEGATRON_FILES or (n.endswith("/") and _MEGATRON_ITER.match(n[:-1])))]
        return f"holds files that are not {what} ({_listing(unknown)})" if unknown else None
    if kind == "qnemo":
        if "config.json" not in names or not any(_RANK_FILE.match(n) for n in names):
            return f"has no config.json with rank*.safetensors: it is not {what} (it holds {_listing(names)})"
        unknown = [n for n in names if not (_RANK_FILE.match(n) or n == "tokenizer_config.yaml" or n in HF_FILES)]
        return f"holds files that are not {what} ({_listing(unknown)})" if unknown else None
    raise ValueError(f"unknown output kind {kind!r}")


def _not_ours_file(path: str, kind: str) -> str | None:
    """None when the file ``path`` is an output of ``kind``; else what it is."""
    what = KIND_NAMES[kind]
    if kind in ("hf", "megatron-bridge"):
        return f"is a file, not {what} (a folder)"
    if kind in ("nemo", "qnemo"):
        names = _tar_names(path)
        if names is None:
            return f"is a file that is not {what} (not a tar archive)"
        if kind == "nemo" and "model_config.yaml" in names:
            return None
        if kind == "qnemo" and "config.json" in names and any(_RANK_FILE.match(n) for n in names):
            return None
        return f"is a tar archive that is not {what} (its first members are {_listing(names) or 'none'})"
    if kind == "tokenizer":
        try:
            if os.path.getsize(path) <= _SP_MAX_BYTES:
                with open(path, "rb") as f:
                    sentencepiece_vocab_size(f.read())
                return None
        except (InputError, OSError):
            pass
        return f"is a file that is not {what} (not a SentencePiece model)"
    raise ValueError(f"unknown output kind {kind!r}")


def not_ours(path: str, kind: str) -> str | None:
    """Why the existing ``path`` may not be replaced by an output of ``kind`` (a phrase
    saying what was found there), or None when it may."""
    if kind not in KIND_NAMES:
        raise ValueError(f"unknown output kind {kind!r}")
    if os.path.islink(path):
        return f"is a symbolic link (to {os.readlink(path)})"
    reason = protected_reason(path)
    if reason is not None:
        return f"is {reason}"
    if os.path.isdir(path):
        return _not_ours_folder(path, kind)
    if os.path.isfile(path):
        return _not_ours_file(path, kind)
    return "is neither a file nor a folder"


def check_replaceable(path: str, kind: str, *, shown: str | None = None) -> None:
    """Raise :class:`OutputExistsError` unless the existing ``path`` is an output of
    ``kind`` or an empty folder (see the module docstring); ``shown`` is how the user
    named it."""
    reason = protected_reason(path) if not os.path.islink(path) else None
    if reason is not None:
        raise OutputExistsError(f"{shown or path}: is {reason}, which nemo-convert never replaces, whatever it "
                                "holds; name a new file or folder for the output")
    found = not_ours(path, kind)
    if found is not None:
        raise OutputExistsError(
            f"{shown or path}: {found}; refusing to replace it (--overwrite replaces only {KIND_NAMES[kind]} "
            "or an empty folder): move it away or choose another output")


def check_not_empty(path: str) -> None:
    """Refuse an empty output path (``-o ""``): it would mean the current folder."""
    if not path:
        raise OutputError("the output path is empty; name the file or folder to write")


def check_output_path(path: str, kind: str, *, is_dir: bool) -> None:
    """Refuse an output path that cannot name an output: an empty one, and a path ending
    in ``/`` (a folder) for an output that is a file."""
    check_not_empty(path)
    if not is_dir and path.endswith(("/", os.sep)):
        example = os.path.join(path, FILE_EXAMPLES.get(kind, "name"))
        raise OutputError(f"{path}: a path ending in '/' names a folder, but this output is a file "
                          f"({KIND_NAMES[kind]}); name the file, e.g. {example}")
