"""Calibration for ``quantize``: run a transformers model over text, collect statistics.

The model is loaded with ``transformers`` from an HF folder (the source, or a temporary
export of a ``.nemo``) in the checkpoint dtype, on ``device``; forward pre-hooks on the
selected linears record what :func:`nemo_convert.quant.collect_activation_stats` records.
Text comes from a file (one sample per line) or the built-in English sample, and is cut
into ``n`` rows of ``seq_len`` tokens by :func:`nemo_convert.quant.tokenize_calibration`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_convert.errors import ConfigError, InputError, PluginError
from nemo_convert.quant.calibrate import (
    KV_MODULES,
    Stats,
    builtin_calibration_texts,
    collect_activation_stats,
    tokenize_calibration,
)


@dataclass
class CalibrationInfo:
    """What calibration ran on (recorded in the report)."""

    source: str           # the text file, or "built-in"
    samples: int
    seq_len: int
    tokens: int
    device: str
    dtype: str
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_calibration_texts(path: str | None) -> list[str]:
    """The lines of ``path`` (blank lines skipped), or the built-in sample when None."""
    if path is None:
        return builtin_calibration_texts()
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except FileNotFoundError:
        raise InputError(f"{path}: no such calibration file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read calibration text ({exc})") from None
    texts = [t for t in lines if t]
    if not texts:
        raise InputError(f"{path}: the calibration file has no text")
    return texts


class _SentencePieceTok:
    """A minimal tokenizer over ``tokenizer.model`` when transformers cannot load one."""

    def __init__(self, path: str) -> None:
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor(model_file=path)
        self.bos_token_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None
        self.eos_token_id = self._sp.eos_id() if self._sp.eos_id() >= 0 else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._sp.encode(text))


def load_tokenizer(folder: str) -> Any:
    """The HF folder's tokenizer (transformers ``AutoTokenizer``, else ``tokenizer.model``)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds here
        sp = os.path.join(folder, "tokenizer.model")
        if os.path.isfile(sp):
            return _SentencePieceTok(sp)
        raise InputError(f"{folder}: cannot load a tokenizer for calibration ({type(exc).__name__}: {exc})") \
            from None


def calibration_tokens(folder: str, texts: Sequence[str], *, n: int, seq_len: int,
                       vocab_size: int | None = None) -> torch.Tensor:
    """``[n, seq_len]`` token ids of ``texts`` under the folder's tokenizer."""
    if n < 1 or seq_len < 2:
        raise ConfigError(f"calibration needs --calib-size ≥ 1 and a sequence length ≥ 2, got {n}, {seq_len}")
    ids = tokenize_calibration(load_tokenizer(folder), texts, seq_len, n)
    if vocab_size is not None and int(ids.max()) >= vocab_size:
        raise ConfigError(f"the tokenizer produced token id {int(ids.max())}, outside the model's vocabulary "
                          f"of {vocab_size}")
    return ids


def _batches(ids: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, ids.shape[0], batch_size):
        yield ids[start:start + batch_size]


def hf_model_class(name: str) -> Any:
    """The ``transformers`` class called ``name`` (a family's ``hf_model_class``)."""
    import transformers

    cls = getattr(transformers, name, None)
    if not isinstance(cls, type) or not hasattr(cls, "from_pretrained"):
        raise PluginError(f"hf_model_class {name!r}: transformers {transformers.__version__} has no model "
                          "class of that name")
    return cls


def calibrate(folder: str, ids: torch.Tensor, modules: Sequence[str], *, dtype: torch.dtype,
              device: torch.device, batch_size: int = 4, max_samples: int = 64,
              kv_modules: Sequence[str] = KV_MODULES, model_class: str = "AutoModelForCausalLM") -> dict[str, Stats]:
    """Load the HF model in ``folder`` as ``transformers.<model_class>`` (the family's
    ``hf_model_class``) and collect statistics of ``modules`` over ``ids``."""
    model = hf_model_class(model_class).from_pretrained(folder, dtype=dtype)
    try:
        model.to(device)
        return collect_activation_stats(model, _batches(ids, max(1, batch_size)), list(modules),
                                        kv_modules=kv_modules, max_samples=max_samples, device=device)
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
