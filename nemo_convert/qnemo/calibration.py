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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from nemo_convert.engine import NoProgress, Progress
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
    sized: str = ""       # how samples × seq_len were chosen (given, or the default's reasoning)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: The default calibration on CUDA: ModelOpt-like, 64 rows of 512 tokens.
CUDA_ROWS, CUDA_SEQ_LEN = 64, 512
#: On the CPU the default is sized to take about ``CPU_TARGET_S`` seconds at
#: ``CPU_FLOPS`` (a conservative bf16 CPU rate), within ``CPU_ROWS`` rows of up to
#: ``CPU_SEQ_LEN`` tokens.
CPU_FLOPS, CPU_TARGET_S = 5e9, 20.0
CPU_ROWS, CPU_SEQ_LEN = (4, 16), 256


@dataclass(frozen=True)
class CalibrationSize:
    """How many rows of how many tokens calibration runs, and why."""

    samples: int
    seq_len: int
    reason: str
    est_seconds: float | None = None  # the CPU estimate behind a default


def flops_per_token(n_params: int, num_layers: int, hidden: int, seq_len: int) -> float:
    """Forward FLOPs per token: the matmuls (2 per parameter) plus attention scores and
    values (4 · layers · seq_len · hidden)."""
    return 2.0 * n_params + 4.0 * num_layers * seq_len * hidden


def calibration_size(*, n_params: int, num_layers: int, hidden: int, max_positions: int | None,
                     device: torch.device, samples: int | None = None,
                     seq_len: int | None = None) -> CalibrationSize:
    """The calibration's rows × tokens: what was given, else a default sized to the model
    and the device — 64 × 512 on CUDA; on the CPU as many rows (4 to 16) of up to 256 tokens
    as take about 20 s at a conservative 5 GFLOP/s. Never longer than the model's
    ``max_position_embeddings``."""
    cap = max_positions if max_positions and max_positions >= 2 else None
    default_seq = CUDA_SEQ_LEN if device.type == "cuda" else CPU_SEQ_LEN
    seq = seq_len if seq_len is not None else min(default_seq, cap or default_seq)
    per_token = flops_per_token(n_params, num_layers, hidden, seq)
    if samples is not None:
        return CalibrationSize(samples, seq, "given" if seq_len is not None else
                               f"given rows, {seq} tokens by default")
    if device.type == "cuda":
        return CalibrationSize(CUDA_ROWS, seq, f"default on {device.type}")
    lo, hi = CPU_ROWS
    rows = int(max(lo, min(hi, CPU_FLOPS * CPU_TARGET_S // max(per_token * seq, 1.0))))
    est = rows * seq * per_token / CPU_FLOPS
    return CalibrationSize(rows, seq, f"default on the CPU for {n_params / 1e6:.3g}M parameters "
                                      f"(about {_human_s(est)} at {CPU_FLOPS / 1e9:g} GFLOP/s)", est)


def _human_s(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 0.1):.2g} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


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
        raise InputError(f"{folder}: cannot load a tokenizer for calibration ({_first_line(exc)})") from None


def calibration_tokens(folder: str, texts: Sequence[str], *, n: int, seq_len: int,
                       vocab_size: int | None = None) -> torch.Tensor:
    """``[n, seq_len]`` token ids of ``texts`` under the folder's tokenizer."""
    if n < 1 or seq_len < 2:
        raise ConfigError(f"calibration needs --calib-size ≥ 1 and a sequence length ≥ 2, got {n}, {seq_len}")
    tok = load_tokenizer(folder)
    try:
        ids = tokenize_calibration(tok, texts, seq_len, n)
    except (ConfigError, InputError):
        raise
    except Exception as exc:  # noqa: BLE001 - a tokenizer's own (often multi-line) errors: one line
        raise InputError(f"{folder}: the tokenizer failed on the calibration text ({_first_line(exc)})") from None
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


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars from transformers or huggingface_hub (``Loading weights …``): our
    own bar shows calibration. Their previous settings are restored afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    bars, hub_bars = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        if hub_bars:
            enable_progress_bars()


def _counted(batches: Iterator[torch.Tensor], progress: Progress) -> Iterator[torch.Tensor]:
    for b in batches:
        yield b
        progress.advance(int(b.numel()), int(b.shape[0]))


#: ``select(names) -> (modules, kv_modules)``: what to calibrate, given the loaded model's
#: parameter names (the spelling transformers loaded the checkpoint in).
Selector = Callable[[Sequence[str]], tuple[Sequence[str], Sequence[str]]]


def calibrate(folder: str, ids: torch.Tensor, modules: Sequence[str] | Selector, *, dtype: torch.dtype,
              device: torch.device, batch_size: int = 4, max_samples: int = 64,
              kv_modules: Sequence[str] = KV_MODULES, model_class: str = "AutoModelForCausalLM",
              progress: Progress | None = None) -> dict[str, Stats]:
    """Load the HF model in ``folder`` as ``transformers.<model_class>`` (the family's
    ``hf_model_class``) and collect statistics of ``modules`` over ``ids``. ``modules`` may be
    a :data:`Selector` that chooses them (and the KV modules) from the loaded model's parameter
    names. ``progress`` sees ``start("calibrate", tokens, rows)`` and one
    ``advance(tokens, rows)`` per batch."""
    progress = progress or NoProgress()
    with quiet_transformers():
        try:
            model = hf_model_class(model_class).from_pretrained(folder, dtype=dtype)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
            raise InputError(f"{folder}: transformers cannot load the model for calibration "
                             f"({_first_line(exc)})") from None
    try:
        if callable(modules):
            modules, kv_modules = modules([n for n, _ in model.named_parameters()])
        model.to(device)
        progress.start("calibrate", int(ids.numel()), int(ids.shape[0]))
        try:
            return collect_activation_stats(model, _counted(_batches(ids, max(1, batch_size)), progress),
                                            list(modules), kv_modules=kv_modules, max_samples=max_samples,
                                            device=device)
        finally:
            progress.finish()
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
