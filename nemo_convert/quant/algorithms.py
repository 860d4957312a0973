"""The quantization algorithms by name, and the checks every algorithm shares.

Each algorithm lives in its own module (:mod:`.int8`, :mod:`.int4`, :mod:`.fp8`,
:mod:`.awq`) as a pair of pure torch functions:

* ``quantize_*(weight, ...) -> dict[str, Tensor]`` takes one linear weight in the
  Hugging Face orientation ``[out_features, in_features]`` and returns the tensors
  TensorRT-LLM stores for that linear, keyed by TensorRT-LLM's *suffix* names
  (``weight``, ``per_channel_scale``, ``weights_scaling_factor``, ...). The caller
  prefixes them with the linear's name (see :mod:`.trtllm_names`).
* ``dequantize_*(tensors) -> Tensor`` rebuilds the float32 ``[out, in]`` weight the
  quantized linear effectively multiplies by.

The checks they share are in :mod:`.checks`. This module maps the algorithm names to those functions so callers (the ``quantize``
and ``verify`` commands) can stay generic. Everything is device-agnostic: results
live on the weight's device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.quant.awq import dequantize_int4_awq, quantize_int4_awq
from nemo_convert.quant.fp8 import dequantize_fp8, quantize_fp8
from nemo_convert.quant.int4 import dequantize_int4_wo, quantize_int4_wo
from nemo_convert.quant.int8 import dequantize_int8_wo, quantize_int8_wo
from nemo_convert.quant.checks import (  # noqa: F401  (re-exported)
    DEFAULT_GROUP_SIZE, FLOAT_DTYPES, as_float_tensor, check_linear_weight, resolve_dtype)

#: The algorithm names nemo-convert accepts, in the order the docs list them.
ALGORITHMS: tuple[str, ...] = ("int8_wo", "int4_wo", "fp8", "int4_awq")


class ActivationStatsLike(Protocol):
    """What the algorithms read from calibration (see :class:`.calibrate.Stats`)."""

    input_amax: torch.Tensor
    act_mean: torch.Tensor
    samples: torch.Tensor | None


def quantize_linear(algo: str, weight: torch.Tensor,
                    stats: ActivationStatsLike | None = None, *,
                    dtype: torch.dtype | None = None,
                    group_size: int = DEFAULT_GROUP_SIZE,
                    awq_grid: int = 20) -> dict[str, torch.Tensor]:
    """Quantize one linear weight with algorithm ``algo``.

    ``stats`` is the calibration record of that linear's input; ``fp8`` needs its
    ``input_amax`` and ``int4_awq`` its ``act_mean`` (and uses ``samples`` if present).
    ``dtype`` is the checkpoint's model dtype (defaults to the weight's dtype).
    """
    if algo == "int8_wo":
        return quantize_int8_wo(weight, dtype=dtype)
    if algo == "int4_wo":
        return quantize_int4_wo(weight, group_size=group_size, dtype=dtype)
    if algo == "fp8":
        if stats is None:
            raise ConfigError("fp8 needs calibration: the linear's input amax is missing")
        return quantize_fp8(weight, stats.input_amax, dtype=dtype)
    if algo == "int4_awq":
        if stats is None:
            raise ConfigError("int4_awq needs calibration: the linear's per-channel "
                              "activation statistics are missing")
        return quantize_int4_awq(weight, stats.act_mean, samples=stats.samples,
                                     group_size=group_size, n_grid=awq_grid, dtype=dtype)
    raise UnsupportedError(f"unknown quantization algorithm {algo!r}; "
                           f"expected one of {', '.join(ALGORITHMS)}")


def dequantizer(algo: str) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The ``dequantize_*`` function of ``algo``."""
    table: dict[str, Callable[[dict[str, torch.Tensor]], torch.Tensor]] = {
        "int8_wo": dequantize_int8_wo,
        "int4_wo": dequantize_int4_wo,
        "fp8": dequantize_fp8,
        "int4_awq": dequantize_int4_awq,
    }
    try:
        return table[algo]
    except KeyError:
        raise UnsupportedError(f"unknown quantization algorithm {algo!r}; "
                               f"expected one of {', '.join(ALGORITHMS)}") from None


def dequantize_linear(algo: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild the float32 ``[out, in]`` weight from one linear's quantized tensors."""
    return dequantizer(algo)(tensors)
