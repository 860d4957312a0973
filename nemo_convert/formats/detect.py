"""What kind of checkpoint a path is — the one detector every command asks first.

``detect(path)`` looks only at names (folder entries, the first members of a tar, a
file's first bytes); it never parses a config or a tensor header. A command that is given
the wrong kind says what it was given and which command takes it
(:func:`require_kind`), instead of failing later on a missing file.
"""

from __future__ import annotations

import os
import re
import tarfile
import zipfile
from dataclasses import dataclass
from typing import Literal

from nemo_convert.errors import InputError
from nemo_convert.formats.megatron.megatron_dir import is_megatron_dir

Kind = Literal["hf", "nemo", "nemo2", "megatron", "qnemo", "training", "safetensors", "missing", "unknown"]

#: How each kind is named in messages.
DESCRIPTIONS: dict[str, str] = {
    "hf": "a Hugging Face folder",
    "nemo": "a .nemo checkpoint",
    "nemo2": "a NeMo 2.0 checkpoint folder",
    "megatron": "a Megatron-Bridge / Megatron-LM checkpoint directory",
    "qnemo": "a .qnemo (a TensorRT-LLM checkpoint written by quantize)",
    "training": "a training checkpoint",
    "safetensors": "a single .safetensors file",
    "missing": "missing",
    "unknown": "not a checkpoint nemo-convert reads",
}

#: What to do with each kind, when a command does not take it.
HINTS: dict[str, str] = {
    "hf": "to convert it into a .nemo use `nemo-convert import`",
    "nemo": "to convert it into a Hugging Face folder use `nemo-convert export`",
    "nemo2": "to convert it into a .nemo use `nemo-convert reshard`",
    "megatron": ("to convert it into a Hugging Face folder use `nemo-convert export`, into a .nemo "
                 "`nemo-convert reshard`"),
    "qnemo": "it is read by trtllm-build; `nemo-convert inspect` shows it, no command converts it",
    "training": "to convert it into a .nemo use `nemo-convert from-ckpt`",
    "safetensors": "pass the Hugging Face folder that holds it (with its config.json)",
    "unknown": ("expected a Hugging Face folder (config.json), a .nemo (model_config.yaml), a NeMo 2.0 "
                "folder (weights/, context/), a Megatron-Bridge / Megatron-LM directory, a .qnemo or a training "
                "checkpoint"),
}

RANK_FILE = re.compile(r"rank\d+\.safetensors")
_RANK_DIR = re.compile(r"(mp_rank_\d+|tp_rank_\d+_pp_rank_\d+)")
#: How many tar members to look at before deciding (a .qnemo tar starts with config.json).
_TAR_PEEK = 64


@dataclass(frozen=True)
class Detected:
    path: str
    kind: Kind

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.kind]


def _folder_kind(path: str) -> Kind:
    try:
        names = set(os.listdir(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot list the folder ({exc.strerror or exc})") from None
    if "config.json" in names:
        return "qnemo" if any(RANK_FILE.fullmatch(n) for n in names) else "hf"
    if "model_config.yaml" in names:
        return "nemo"
    if {"weights", "context"} <= names and os.path.isdir(os.path.join(path, "weights")):
        return "nemo2"
    if is_megatron_dir(path):  # before the training test: an iter_* folder is a dist checkpoint
        return "megatron"
    if "metadata.json" in names or any(n.endswith(".ckpt") for n in names) \
            or any(_RANK_DIR.fullmatch(n) and os.path.isdir(os.path.join(path, n)) for n in names):
        return "training"
    return "unknown"


def _tar_kind(path: str) -> Kind:
    """A plain tar's first members say .nemo or .qnemo (headers only: the reader seeks past
    the data). A gzipped tar is a .nemo: quantize --compress writes plain tars, and peeking
    into a gzip would mean decompressing whatever comes first."""
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            return "nemo"
    try:
        with tarfile.open(path, "r:") as tf:
            for i, ti in enumerate(tf):
                name = os.path.basename(ti.name.rstrip("/"))
                if name == "model_config.yaml":
                    return "nemo"
                if RANK_FILE.fullmatch(name):
                    return "qnemo"
                if i >= _TAR_PEEK:
                    break
    except (tarfile.TarError, OSError, EOFError):
        pass
    return "nemo"  # a tar: the .nemo reader says what is wrong with it


def _file_kind(path: str) -> Kind:
    if path.endswith(".safetensors"):
        return "safetensors"
    if _is_tar(path):  # before the zip test: a legacy .nemo tar ends with a zip member
        return _tar_kind(path)
    if path.endswith(".ckpt") or zipfile.is_zipfile(path):
        return "training"  # a torch.save zip: a Lightning .ckpt
    return "nemo"  # anything else: the .nemo reader says what is wrong with it


def _is_tar(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar"


def detect(path: str) -> Detected:
    """The kind of checkpoint ``path`` is (``"missing"`` when nothing is there)."""
    if os.path.isdir(path):
        return Detected(path, _folder_kind(path))
    if os.path.isfile(path):
        return Detected(path, _file_kind(path))
    return Detected(path, "missing")


def require_kind(path: str, accepted: tuple[Kind, ...], what: str) -> Detected:
    """``detect(path)``, refusing (one line, naming the right command) a kind not in
    ``accepted``; ``what`` is what the command wants, e.g. ``"a .nemo"``."""
    found = detect(path)
    if found.kind in accepted:
        return found
    if found.kind == "missing":
        raise InputError(f"{path}: no such file or folder")
    if found.kind == "unknown":
        raise InputError(f"{path}: not {what}, nor any checkpoint nemo-convert reads; {HINTS['unknown']}")
    raise InputError(f"{path}: this is {found.description}, not {what}; {HINTS[found.kind]}")
