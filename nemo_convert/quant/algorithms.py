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

This module maps the algorithm names to those functions so callers (the ``quantize``
and ``verify`` commands) can stay generic. Everything is device-agnostic: results
live on the weight's device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from nemo_convert.errors import ConfigError, ShapeError, UnsupportedError

#: The algorithm names nemo-convert accepts, in the order the docs list them.
ALGORITHMS: tuple[str, ...] = ("int8_wo", "int4_wo", "fp8", "int4_awq")

#: Weight dtypes the algorithms accept as input.
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

#: Default group size of the group-wise int4 algorithms (TensorRT-LLM and ModelOpt
#: both default to 128; the group-wise kernels also accept 64).
DEFAULT_GROUP_SIZE = 128


class ActivationStatsLike(Protocol):
    """What the algorithms read from calibration (see :class:`.calibrate.Stats`)."""

    input_amax: torch.Tensor
    act_mean: torch.Tensor
    samples: torch.Tensor | None


def check_linear_weight(weight: torch.Tensor, what: str = "weight") -> None:
    """Raise unless ``weight`` is a finite, non-empty 2-D float tensor."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ShapeError(f"{what}: a linear weight must be 2-D [out, in], got shape "
                         f"{tuple(weight.shape)}")
    if weight.numel() == 0:
        raise ShapeError(f"{what}: empty weight of shape {tuple(weight.shape)}")
    if weight.dtype not in FLOAT_DTYPES:
        raise UnsupportedError(f"{what}: cannot quantize dtype {weight.dtype}; expected "
                               "float32, float16 or bfloat16")
    if not bool(torch.isfinite(weight).all()):
        raise ConfigError(f"{what}: contains NaN or infinite values")


def resolve_dtype(weight: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype scale tensors are stored in: ``dtype`` if given, else the weight's."""
    out = weight.dtype if dtype is None else dtype
    if out not in FLOAT_DTYPES:
        raise UnsupportedError(f"model dtype {out} is not one of float32/float16/bfloat16")
    return out


def as_float_tensor(value: float | torch.Tensor, device: torch.device,
                    what: str) -> torch.Tensor:
    """``value`` as a 0-d float32 tensor on ``device``; raises if not finite and ≥ 0."""
    t = torch.as_tensor(value, dtype=torch.float32, device=device).reshape(())
    if not bool(torch.isfinite(t)) or float(t) < 0:
        raise ConfigError(f"{what}: expected a finite non-negative amax, got {float(t)}")
    return t


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
    from nemo_convert.quant import awq, fp8, int4, int8

    if algo == "int8_wo":
        return int8.quantize_int8_wo(weight, dtype=dtype)
    if algo == "int4_wo":
        return int4.quantize_int4_wo(weight, group_size=group_size, dtype=dtype)
    if algo == "fp8":
        if stats is None:
            raise ConfigError("fp8 needs calibration: the linear's input amax is missing")
        return fp8.quantize_fp8(weight, stats.input_amax, dtype=dtype)
    if algo == "int4_awq":
        if stats is None:
            raise ConfigError("int4_awq needs calibration: the linear's per-channel "
                              "activation statistics are missing")
        return awq.quantize_int4_awq(weight, stats.act_mean, samples=stats.samples,
                                     group_size=group_size, n_grid=awq_grid, dtype=dtype)
    raise UnsupportedError(f"unknown quantization algorithm {algo!r}; "
                           f"expected one of {', '.join(ALGORITHMS)}")


def dequantizer(algo: str) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The ``dequantize_*`` function of ``algo``."""
    from nemo_convert.quant import awq, fp8, int4, int8

    table: dict[str, Callable[[dict[str, torch.Tensor]], torch.Tensor]] = {
        "int8_wo": int8.dequantize_int8_wo,
        "int4_wo": int4.dequantize_int4_wo,
        "fp8": fp8.dequantize_fp8,
        "int4_awq": awq.dequantize_int4_awq,
    }
    try:
        return table[algo]
    except KeyError:
        raise UnsupportedError(f"unknown quantization algorithm {algo!r}; "
                               f"expected one of {', '.join(ALGORITHMS)}") from None


def dequantize_linear(algo: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild the float32 ``[out, in]`` weight from one linear's quantized tensors."""
    return dequantizer(algo)(tensors)
