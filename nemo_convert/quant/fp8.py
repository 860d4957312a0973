"""FP8 (E4M3) weights and activations, and the FP8 KV-cache scale.

What TensorRT-LLM stores for an FP8 linear (``FP8Linear`` / ``FP8RowLinear`` in
``tensorrt_llm/quantization/layers.py``; names from checkpoint.md, "FP8 Quantization
Scaling Factors"):

* ``weight`` — ``float8_e4m3fn``, HF orientation ``[out, in]`` (an int8 tensor with
  the same bits is also accepted: ``preprocess_perlayer_weights`` views it as fp8);
* ``weights_scaling_factor`` — float32, shape ``(1,)``: per-tensor ``amax(|W|) / 448``;
* ``activation_scaling_factor`` — float32, shape ``(1,)``: calibrated input
  ``amax / 448``.

The attention's ``kv_cache_scaling_factor`` (float32, shape ``(1,)``; added by
``kv_cache_quantize`` in ``tensorrt_llm/quantization/quantize.py``) is the larger of
the K and V scales, ``max(k_amax, v_amax) / 448`` (ModelOpt merges separate K/V
scales with ``max``, and TensorRT-LLM's loader does the same for ``k_/v_cache_*``).
"""

from __future__ import annotations

import math

import torch

from nemo_convert.errors import ShapeError
from nemo_convert.quant.checks import as_float_tensor, check_linear_weight

FP8_E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
#: Half the spacing of E4M3 normal numbers relative to their magnitude (3 mantissa bits).
FP8_REL_ERROR = 2.0 ** -4
#: Smallest positive normal E4M3 value; below it values are subnormal with spacing 2^-9.
FP8_MIN_NORMAL = 2.0 ** -6
FP8_SUBNORMAL_ABS_ERROR = 2.0 ** -10


def fp8_scale(amax: float | torch.Tensor, device: torch.device | None = None,
              what: str = "amax") -> torch.Tensor:
    """Per-tensor FP8 scale ``amax / 448`` as float32 of shape ``(1,)`` (amax 0 → 1)."""
    if device is None:
        device = amax.device if isinstance(amax, torch.Tensor) else torch.device("cpu")
    a = as_float_tensor(amax, device, what)
    scale = a / FP8_E4M3_MAX
    if float(scale) == 0.0:
        scale = torch.ones_like(scale)
    return scale.reshape(1)


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` saturated to ±448 and rounded to E4M3."""
    y = x.detach().float() / scale.float().reshape(())
    return y.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)


def fake_quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize then dequantize ``x`` through E4M3 with a per-tensor ``scale``.

    Mirrors what an FP8 linear does to its *input* with ``activation_scaling_factor``;
    returns ``x``'s dtype.
    """
    return (to_fp8(x, scale).float() * scale.float().reshape(())).to(x.dtype)


def quantize_fp8(weight: torch.Tensor, input_amax: float | torch.Tensor, *,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Quantize an HF ``[out, in]`` weight to FP8 with per-tensor scales.

    ``input_amax`` is the calibrated max ``|x|`` of this linear's input. ``dtype`` is
    accepted for a uniform signature; FP8 scales are always float32.
    Returns ``{"weight": float8_e4m3fn [out, in], "weights_scaling_factor": f32 (1,),
    "activation_scaling_factor": f32 (1,)}``.
    """
    del dtype
    check_linear_weight(weight)
    w_scale = fp8_scale(weight.detach().float().abs().amax(), weight.device, "weight amax")
    a_scale = fp8_scale(input_amax, weight.device, "input amax")
    return {
        "weight": to_fp8(weight, w_scale),
        "weights_scaling_factor": w_scale,
        "activation_scaling_factor": a_scale,
    }


def dequantize_fp8(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild the float32 ``[out, in]`` weight from FP8 tensors."""
    w = tensors["weight"]
    if w.dtype == torch.int8:           # same bits, older exporters' storage
        w = w.view(FP8_DTYPE)
    if w.dtype != FP8_DTYPE or w.dim() != 2:
        raise ShapeError(f"FP8 weight must be a 2-D float8_e4m3fn tensor, got {w.dtype} "
                         f"{tuple(w.shape)}")
    return w.float() * tensors["weights_scaling_factor"].float().reshape(())


def fp8_error_bound(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Element-wise bound on ``|W - dequantize(quantize(W))|`` for E4M3 with ``scale``.

    Round-to-nearest gives a relative error ≤ 2^-4 for normal values and an absolute
    error ≤ 2^-10·scale in the subnormal range (|W/scale| < 2^-6).
    """
    s = float(scale.reshape(()))
    w = weight.detach().float().abs()
    return torch.maximum(w * FP8_REL_ERROR, torch.full_like(w, FP8_SUBNORMAL_ABS_ERROR * s))


def fp8_kv_cache_scaling_factor(k_amax: float | torch.Tensor,
                                v_amax: float | torch.Tensor, *,
                                k_margin: float = 1.0,
                                floor: float | None = None) -> torch.Tensor:
    """``kv_cache_scaling_factor`` for one attention: ``max(k_amax·k_margin, v_amax)/448``.

    ``k_amax`` and ``v_amax`` are the calibrated output amax of ``k_proj`` and
    ``v_proj``. K is measured before rotary embedding; RoPE can raise one element of
    a rotated pair by up to √2, so ``k_margin=math.sqrt(2)`` guarantees K never
    saturates. ``floor`` (e.g. 1.0, ModelOpt's default recommendation) raises the
    scale to at least that value. Returns float32 of shape ``(1,)``.
    """
    if k_margin < 1.0 or not math.isfinite(k_margin):
        raise ValueError(f"k_margin must be a finite value ≥ 1, got {k_margin}")
    dev = k_amax.device if isinstance(k_amax, torch.Tensor) else torch.device("cpu")
    k = as_float_tensor(k_amax, dev, "k amax") * k_margin
    v = as_float_tensor(v_amax, dev, "v amax")
    scale = fp8_scale(torch.maximum(k, v), dev, "kv amax")
    if floor is not None:
        scale = torch.clamp(scale, min=float(floor))
    return scale
