"""W8A16: symmetric per-output-channel int8 weights (TensorRT-LLM ``quant_algo: W8A16``).

What TensorRT-LLM stores for such a linear (``WeightOnlyQuantLinear`` in
``tensorrt_llm/quantization/layers.py``):

* ``weight`` — int8, shape ``[in_features, out_features]`` (the transpose of the HF
  weight; the layer declares ``Parameter(shape=(in, out), dtype="int8")``);
* ``per_channel_scale`` — shape ``[out_features]`` in the model dtype.

The scale is ``amax(|W[o, :]|) / 127`` per output channel, as TensorRT-LLM's own
``symmetric_quantize_last_axis_of_batched_matrix`` computes it.

**Layout caveat.** When a checkpoint's ``weight`` is already int8, TensorRT-LLM loads
it verbatim into the mixed-precision GEMM, which expects the bytes *interleaved* by
``preprocess_weights_for_mixed_gemm`` for the GPU architecture it runs on
(``tensorrt_llm/models/convert_utils.py`` ``weight_only_quantize_dict`` skips int8
tensors). That interleave is architecture specific, so this module returns the plain
row-major ``[in, out]`` int8 matrix. A checkpoint that ``trtllm-build`` consumes
correctly on any GPU stores the *float* weight under ``weight`` (use
:func:`dequantize_int8_wo`, cast to the model dtype) and lets TensorRT-LLM quantize
it: its per-channel amax/127 recovers these int8 values (see docs/quantization.md).
"""

from __future__ import annotations

import torch

from nemo_convert.errors import ShapeError
from nemo_convert.quant.checks import check_linear_weight, resolve_dtype

INT8_QMAX = 127


def int8_channel_scales(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-output-channel scales ``amax/127`` rounded to ``dtype`` (all-zero rows → 1)."""
    amax = weight.detach().float().abs().amax(dim=1)
    scale = amax / INT8_QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale.to(dtype)


def quantize_int8_wo(weight: torch.Tensor, *,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Quantize an HF ``[out, in]`` weight to W8A16.

    Returns ``{"weight": int8 [in, out], "per_channel_scale": [out] (model dtype)}``.
    The quantization uses the scale *as stored* (already rounded to ``dtype``), so
    ``q * per_channel_scale`` is exactly what the kernel dequantizes to and
    ``|W - deq| ≤ per_channel_scale / 2`` holds element-wise.
    """
    check_linear_weight(weight)
    scale_dtype = resolve_dtype(weight, dtype)
    w = weight.detach().float()
    scale = int8_channel_scales(w, scale_dtype)
    q = torch.round(w / scale.float()[:, None]).clamp_(-INT8_QMAX, INT8_QMAX)
    return {
        "weight": q.to(torch.int8).t().contiguous(),
        "per_channel_scale": scale,
    }


def fake_quantize_int8_wo(weight: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The HF ``[out, in]`` weight moved onto its W8A16 grid, in ``dtype``: the same values
    as ``dequantize_int8_wo(quantize_int8_wo(weight)).to(dtype)``, computed in place on one
    fp32 copy (no int8, transposed or product temporaries — 4–5× faster on large weights).
    """
    check_linear_weight(weight)
    out_dtype = resolve_dtype(weight, dtype)
    w = weight.detach().to(torch.float32, copy=True)
    scale = int8_channel_scales(w, out_dtype).float()[:, None]
    # add_(0.0) turns -0.0 into +0.0, as the round trip through int8 does
    w.div_(scale).round_().clamp_(-INT8_QMAX, INT8_QMAX).add_(0.0).mul_(scale)
    return w.to(out_dtype)


def dequantize_int8_wo(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild the float32 HF ``[out, in]`` weight from W8A16 tensors."""
    q = tensors["weight"]
    scale = tensors["per_channel_scale"].float().reshape(-1)
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ShapeError(f"W8A16 weight must be a 2-D int8 tensor, got {q.dtype} "
                         f"{tuple(q.shape)}")
    if q.shape[1] != scale.numel():
        raise ShapeError(f"W8A16 weight [in, out]={tuple(q.shape)} does not match "
                         f"per_channel_scale of {scale.numel()} channels")
    return q.t().float() * scale[:, None]
