"""The tokenizer of a ``.qnemo``: ``tokenizer_config.yaml`` plus the tokenizer files.

As NeMo writes it (nemo-formats.md §8.1): ``tokenizer_config.yaml`` is the ``tokenizer:``
section of the model config with every ``nemo:`` artifact path replaced by the name of the
file copied beside it (``tokenizer.model`` for the ``model`` key). NeMo's loader
(``nemo/export/trt_llm/qnemo/tokenizer_utils.py``) opens ``<dir>/<model>`` for
``library: sentencepiece`` and ``AutoTokenizer.from_pretrained(type)`` for
``library: huggingface``. The HF tokenizer files travel too, so
``AutoTokenizer.from_pretrained(<qnemo folder>)`` also works.

For an HF source the section is built the way ``import`` builds it for a ``.nemo``, so
an HF folder and the ``.nemo`` imported from it give the same files.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

from nemo_convert.convert.reshard import FOLDER_SOURCES, carried_tokenizer_section
from nemo_convert.spec import provenance_of

TOKENIZER_CONFIG = "tokenizer_config.yaml"
#: NeMo names a copied artifact after its config key.
_ARTIFACT_KEYS = ("model", "vocab_file", "merge_file")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _hf_section(files: dict[str, bytes], hf_cfg: dict[str, Any], folder: str) -> dict[str, Any] | None:
    if not files:
        return None
    if "tokenizer.model" in files:
        return {"library": "sentencepiece", "type": None, "model": "tokenizer.model", "vocab_file": None,
                "merge_file": None, "delimiter": None, "sentencepiece_legacy": False}
    name = hf_cfg.get("_name_or_path") or os.path.basename(os.path.normpath(folder))
    return {"library": "huggingface", "type": name, "model": None, "vocab_file": None, "merge_file": None,
            "delimiter": None, "use_fast": True}


def tokenizer_from_hf(folder: str, hf_cfg: dict[str, Any],
                      names: Sequence[str]) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
    """``(tokenizer section, {file name: bytes})`` of an HF folder's tokenizer files."""
    files = {n: _read(os.path.join(folder, n)) for n in names if os.path.isfile(os.path.join(folder, n))}
    return _hf_section(files, hf_cfg, folder), files


def tokenizer_from_nemo(ckpt: Any, cfg: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
    """``(tokenizer section, {file name: bytes})`` of a ``.nemo`` (``ckpt``: a
    :class:`~nemo_convert.formats.nemo.nemo.NemoCheckpoint`), a NeMo 2 folder or a Megatron
    directory: for those two, the section of the ``.nemo`` that ``reshard`` writes of them
    (:func:`~nemo_convert.convert.reshard.carried_tokenizer_section`), so that quantizing
    either gives the same ``.qnemo``."""
    files: dict[str, bytes] = {}
    section = copy.deepcopy(cfg.get("tokenizer")) if isinstance(cfg.get("tokenizer"), dict) else None
    prov = provenance_of(cfg)
    ours = prov.tokenizer_files
    if prov.source_format in FOLDER_SOURCES:  # the section the .nemo that reshard writes of it holds
        carried = carried_tokenizer_section({name: os.path.basename(name) for name in ours})
        section = carried if carried is not None else section
    for name, ref in ours.items():
        files[os.path.basename(name)] = ckpt.artifact(ref)
    if section is not None:
        for key in _ARTIFACT_KEYS:
            ref = section.get(key)
            if isinstance(ref, str) and ref.startswith("nemo:"):
                base = "tokenizer.model" if key == "model" else f"tokenizer.{key}"
                if base not in files:
                    files[base] = ckpt.artifact(ref)
                section[key] = base
    return section, files
