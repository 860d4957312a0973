"""Block-scaled fp8 (DeepSeek-V3's hub weights) is dequantized as a block-by-block
reference computes it, bit for bit, whatever the weight's shape against the blocks."""

from __future__ import annotations

import pytest
import torch

from nemo_convert.errors import ShapeError
from nemo_convert.mapping.dequant import dequantize_blocks

BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def reference(w: torch.Tensor, scale: torch.Tensor, b0: int, b1: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(w.shape, dtype=dtype)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1].float()
            out[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = (blk * scale[i, j]).to(dtype)
    return out


@pytest.mark.parametrize("dtype", list(BITS))
@pytest.mark.parametrize("rows,cols,b0,b1", [
    (256, 384, 128, 128),  # exact tiling (most hub weights)
    (32, 64, 128, 128),  # one block covers the weight (tiny widths)
    (576, 256, 128, 128),  # ragged rows (kv_a_proj_with_mqa: 512 + 64)
    (40, 50, 16, 16),  # ragged both ways
    (48, 20, 16, 32),  # rectangular blocks, one block column
    (1, 1, 128, 128),
])
def test_fp8_block_dequantization_equals_the_block_by_block_reference(rows, cols, b0, b1, dtype):
    g = torch.Generator().manual_seed(rows * 7 + cols)
    w = (torch.randn(rows, cols, generator=g) * 100).to(torch.float8_e4m3fn)
    scale = torch.rand(-(-rows // b0), -(-cols // b1), generator=g) * 1e-2 + 1e-5
    got = dequantize_blocks(w, scale, (b0, b1), dtype)
    want = reference(w, scale, b0, b1, dtype)
    assert got.dtype == dtype and got.shape == w.shape and got.is_contiguous()
    assert torch.equal(got.view(BITS[dtype]), want.view(BITS[dtype]))


def test_scales_that_do_not_tile_the_weight_are_refused():
    w = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ShapeError, match="do not tile"):
        dequantize_blocks(w, torch.ones(3, 2), (128, 128), torch.bfloat16)
