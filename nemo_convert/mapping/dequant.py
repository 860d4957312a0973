"""Block-scaled FP8 checkpoints (DeepSeek-V3's hub weights) read as plain floating tensors.

Such a checkpoint stores a linear weight ``W`` as ``float8_e4m3fn`` beside
``W_scale_inv`` (float32, one entry per ``[b0, b1]`` block, edge blocks partial), with
``quantization_config = {"quant_method": "fp8", "weight_block_size": [b0, b1], …}``.
:class:`BlockDequantSource` presents each such pair as one tensor ``W.float() × scale``
(the scale repeated over its block) in the model's dtype — what DeepSeek's own
``weight_dequant`` and transformers' ``dequantize`` compute — one tensor at a time, and
hides the scales. Megatron-Core runs the dequantized weights; nothing else is refused or
guessed: another ``quant_method`` is refused by name.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_convert.errors import ShapeError, UnsupportedError
from nemo_convert.tensors.base import TensorInfo, TensorSource

SCALE_SUFFIX = "_scale_inv"


def dequantize_blocks(w: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                      dtype: torch.dtype) -> torch.Tensor:
    """``w`` (``[R, C]``, FP8) times its per-block scales (``[ceil(R/b0), ceil(C/b1)]``), in
    float32, cast to ``dtype``."""
    b0, b1 = block
    if w.dim() != 2 or scale_inv.dim() != 2:
        raise ShapeError(f"block-scaled weight {list(w.shape)} / scales {list(scale_inv.shape)} must both be 2-d")
    rows, cols = w.shape
    want = (-(-rows // b0), -(-cols // b1))
    if tuple(scale_inv.shape) != want:
        raise ShapeError(f"scales of shape {list(scale_inv.shape)} do not tile a {list(w.shape)} weight in "
                         f"{b0}×{b1} blocks (expected {list(want)})")
    if w.is_meta:
        return torch.empty(w.shape, dtype=dtype, device="meta")
    scale = scale_inv.float().repeat_interleave(b0, 0)[:rows].repeat_interleave(b1, 1)[:, :cols]
    return (w.float() * scale).to(dtype)


def fp8_block_size(quantization: Any) -> tuple[int, int]:
    """The ``[b0, b1]`` of a ``quantization_config`` this module dequantizes; any other
    method or shape is refused by name."""
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    block = quantization.get("weight_block_size") if isinstance(quantization, dict) else None
    if method != "fp8" or not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise UnsupportedError(f"quantization_config quant_method={method!r} weight_block_size={block!r}: only "
                               "block-scaled fp8 (DeepSeek-V3) is dequantized on import")
    return int(block[0]), int(block[1])


class BlockDequantSource:
    """``inner`` with every ``W`` / ``W_scale_inv`` pair presented as one dequantized ``W``."""

    def __init__(self, inner: TensorSource, block: tuple[int, int], dtype: torch.dtype) -> None:
        self._inner, self._block, self._dtype = inner, block, dtype
        names = set(inner.keys())
        self._scaled = {k[: -len(SCALE_SUFFIX)] for k in names
                        if k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)] in names}
        self._keys = [k for k in inner.keys() if not (k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)]
                                                      in self._scaled)]

    @property
    def dequantized(self) -> int:
        """How many tensors are dequantized."""
        return len(self._scaled)

    def keys(self) -> list[str]:
        return list(self._keys)

    def info(self, key: str) -> TensorInfo:
        info = self._inner.info(key)
        return TensorInfo(key, info.shape, self._dtype) if key in self._scaled else info

    def load(self, key: str) -> torch.Tensor:
        if key not in self._scaled:
            return self._inner.load(key)
        return dequantize_blocks(self._inner.load(key), self._inner.load(key + SCALE_SUFFIX), self._block,
                                 self._dtype)

    def group(self, key: str) -> str:
        return self._inner.group(key)

    def close(self) -> None:
        self._inner.close()
