"""Group-wise symmetric int4 weights, and the int4 packing TensorRT-LLM reads.

Layout (TensorRT-LLM group-wise weight-only linears, the ``W4A16_AWQ`` family):

* ``weight`` — int8, shape ``[out_features // 2, in_features]``: two signed int4
  values per byte, packed along the **output** axis. Byte ``[j, k]`` holds
  ``q[2j, k]`` in its low nibble and ``q[2j + 1, k]`` in its high nibble
  (two's complement, -8..7). This is the layout ModelOpt exports and which
  ``preprocess_perlayer_weights`` in ``tensorrt_llm/models/modeling_utils.py``
  transposes to ``[in, out // 2]`` and interleaves for the GPU itself, so it is
  architecture independent.
* ``weights_scaling_factor`` — shape ``[out_features, in_features // group_size]``
  in the model dtype; TensorRT-LLM transposes it to the layer's
  ``(in // group_size, out)`` parameter.

The scale is ``amax(|group|) / 7`` (ModelOpt's ``maxbound`` for 4 bits); values are
rounded and clamped to -8..7. ``in_features`` must be a multiple of the group size:
the layer's scale parameter is ``(in // group_size, out)``, ModelOpt's exporter
refuses other shapes, and zero-padding ``in`` would change the layer's input width,
so it is an error here rather than a silent pad.

TensorRT-LLM's plain ``W4A16`` algorithm is *per-channel* int4 (no groups); a
group-wise int4 weight-only checkpoint is therefore written as ``W4A16_AWQ`` with
``pre_quant_scale: false`` (see :mod:`.trtllm_names`).
"""

from __future__ import annotations

import torch

from nemo_convert.errors import ShapeError, UnsupportedError
from nemo_convert.quant.checks import DEFAULT_GROUP_SIZE, check_linear_weight, resolve_dtype

INT4_MIN = -8
INT4_MAX = 7
#: ModelOpt's bound for symmetric 4-bit scales: scale = amax / 7.
INT4_SCALE_BOUND = 7.0

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def pack_int4(q: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Pack signed int4 values (-8..7, any integer dtype) two per int8 byte along ``dim``.

    Element ``2j`` along ``dim`` goes to the low nibble of byte ``j``, element ``2j+1``
    to the high nibble. ``dim=0`` on an HF ``[out, in]`` matrix gives TensorRT-LLM's
    ``[out // 2, in]`` layout.
    """
    if q.dtype not in _INT_DTYPES:
        raise TypeError(f"pack_int4 needs an integer tensor, got {q.dtype}")
    if q.dim() == 0 or q.shape[dim] % 2:
        raise ShapeError(f"cannot pack int4 along dim {dim} of shape {tuple(q.shape)}: "
                         "the size must be even")
    wide = q.to(torch.int32)
    if wide.numel() and (int(wide.min()) < INT4_MIN or int(wide.max()) > INT4_MAX):
        raise ValueError(f"int4 values must lie in [{INT4_MIN}, {INT4_MAX}]")
    wide = wide.movedim(dim, 0)
    low = wide[0::2] & 0xF
    high = wide[1::2] & 0xF
    packed = (low | (high << 4)).to(torch.uint8).view(torch.int8)
    return packed.movedim(0, dim).contiguous()


def unpack_int4(packed: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int8 bytes → int8 values in -8..7, twice as long."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"unpack_int4 needs an int8/uint8 tensor, got {packed.dtype}")
    if packed.dim() == 0:
        raise ShapeError("cannot unpack a 0-d tensor")
    b = packed.movedim(dim, 0).to(torch.int32) & 0xFF
    low = b & 0xF
    high = b >> 4
    low = low - ((low & 0x8) << 1)      # sign-extend the nibble: 8..15 → -8..-1
    high = high - ((high & 0x8) << 1)
    n = b.shape[0]
    out = torch.stack((low, high), dim=1).reshape(2 * n, *b.shape[1:])
    return out.to(torch.int8).movedim(0, dim).contiguous()


def check_int4_shape(out_features: int, in_features: int, group_size: int) -> None:
    """Raise :class:`UnsupportedError` unless the shape suits group-wise int4."""
    if group_size <= 0:
        raise UnsupportedError(f"group size must be positive, got {group_size}")
    if in_features % group_size:
        raise UnsupportedError(
            f"int4 group-wise quantization needs in_features ({in_features}) to be a "
            f"multiple of the group size ({group_size}); TensorRT-LLM does not accept "
            "a partial last group and padding would change the layer's input width. "
            "Use a group size that divides it (TensorRT-LLM kernels take 64 or 128) "
            "or an int8/fp8 algorithm")
    if out_features % 2:
        raise UnsupportedError(f"int4 packing needs an even out_features, got "
                               f"{out_features}")


def group_scales(weight: torch.Tensor, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """``amax/7`` per ``group_size`` consecutive inputs, ``[out, in // g]`` in ``dtype``.

    All-zero groups get scale 1 (so nothing divides by zero; they quantize to 0).
    """
    out_f, in_f = weight.shape
    amax = weight.detach().float().abs().reshape(out_f, in_f // group_size,
                                                 group_size).amax(dim=2)
    scale = amax / INT4_SCALE_BOUND
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale.to(dtype)


def quantize_groupwise(weight: torch.Tensor, group_size: int,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-wise symmetric int4: ``(q int8 [out, in] in -8..7, scales [out, in // g])``.

    Quantizes with the scale as stored in ``dtype``, so ``q * scale`` is exactly the
    kernel's dequantized value and ``|W - q * scale| ≤ scale / 2``.
    """
    out_f, in_f = weight.shape
    check_int4_shape(out_f, in_f, group_size)
    scale = group_scales(weight, group_size, dtype)
    w = weight.detach().float().reshape(out_f, in_f // group_size, group_size)
    q = torch.round(w / scale.float()[:, :, None]).clamp_(INT4_MIN, INT4_MAX)
    return q.reshape(out_f, in_f).to(torch.int8), scale


def dequantize_groupwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``q * scale`` with ``scale`` ``[out, in // g]`` broadcast over each group."""
    out_f, in_f = q.shape
    if scale.dim() != 2 or scale.shape[0] != out_f or scale.shape[1] == 0 \
            or in_f % scale.shape[1]:
        raise ShapeError(f"int4 scales of shape {tuple(scale.shape)} do not fit a weight "
                         f"of shape [{out_f}, {in_f}]")
    g = in_f // scale.shape[1]
    w = q.float().reshape(out_f, in_f // g, g) * scale.float()[:, :, None]
    return w.reshape(out_f, in_f)


def quantize_int4_wo(weight: torch.Tensor, *, group_size: int = DEFAULT_GROUP_SIZE,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Quantize an HF ``[out, in]`` weight to group-wise int4 (weight-only).

    Returns ``{"weight": int8 [out // 2, in] (packed), "weights_scaling_factor":
    [out, in // group_size] (model dtype)}``.
    """
    check_linear_weight(weight)
    q, scale = quantize_groupwise(weight, group_size, resolve_dtype(weight, dtype))
    return {"weight": pack_int4(q, dim=0), "weights_scaling_factor": scale}


def dequantize_int4_wo(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild the float32 HF ``[out, in]`` weight from group-wise int4 tensors.

    If a ``prequant_scaling_factor`` is present (AWQ), the effective weight
    ``deq[:, k] * prequant[k]`` is returned, which is what the layer applies to an
    unscaled input.
    """
    packed = tensors["weight"]
    if packed.dim() != 2:
        raise ShapeError(f"packed int4 weight must be 2-D, got {tuple(packed.shape)}")
    w = dequantize_groupwise(unpack_int4(packed, dim=0), tensors["weights_scaling_factor"])
    pre = tensors.get("prequant_scaling_factor")
    if pre is not None:
        pre = pre.float().reshape(-1)
        if pre.numel() != w.shape[1]:
            raise ShapeError(f"prequant_scaling_factor has {pre.numel()} values, the "
                             f"weight {w.shape[1]} input channels")
        w = w * pre[None, :]
    return w
