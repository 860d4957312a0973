"""Quantized Hugging Face checkpoints read as plain floating tensors, one tensor at a time.

A quantized checkpoint stores some weights as a *pair* of tensors — the packed values and
their scales — and says how in ``config.json``'s ``quantization_config``. A
:class:`PairCodec` names the pair and decodes it; :class:`DequantSource` presents every
pair of its inner source as the one tensor it encodes, in the requested dtype, and hides
the partner. Nothing else is refused or guessed: a ``quant_method`` without a codec here is
refused by name (:func:`codec_for`). Two codecs:

* **Block-scaled fp8** (DeepSeek-V3's hub weights; ``quant_method: fp8``,
  ``weight_block_size: [b0, b1]``): ``W`` (``float8_e4m3fn``) beside ``W_scale_inv``
  (float32, one entry per ``[b0, b1]`` block, edge blocks partial) is ``W.float() × scale``
  with the scale repeated over its block — what DeepSeek's own ``weight_dequant`` and
  transformers' ``dequantize`` compute.
* **MXFP4** (GPT-OSS's hub experts; ``quant_method: mxfp4``): ``X_blocks`` (uint8
  ``[..., R, G, 16]``, two FP4 E2M1 codes per byte) beside ``X_scales`` (uint8
  ``[..., R, G]``, one E8M0 power of two per block of 32 values) is ``X`` — decoded
  exactly as transformers 5.24 does (``transformers/integrations/mxfp4.py``: the code table
  ``FP4_VALUES``, lines 29–46; ``_convert_moe_packed_tensors``, lines 229–285): the low
  nibble is the even element and the high nibble the odd one (lines 270–276), each code's
  value times ``2 ** (scale - 127)`` (lines 243, 279, ``torch.ldexp``), the ``G`` blocks of a
  row concatenated (``[..., R, G·32]``, line 283), and the last two dimensions swapped
  (``[..., G·32, R]``, line 285) — the layout of transformers' ``GptOssExperts``
  parameters (``gate_up_proj`` ``[E, H, 2I]``, ``down_proj`` ``[E, I, H]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from nemo_convert.errors import ShapeError, UnsupportedError
from nemo_convert.tensors.base import TensorInfo, TensorSource

SCALE_SUFFIX = "_scale_inv"

#: FP4 E2M1 values by 4-bit code (sign bit 3, then two exponent bits and one mantissa bit):
#: the OCP Microscaling Formats (MX) v1.0 element table, as transformers' ``FP4_VALUES``.
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: E8M0 scales: ``2 ** (code - 127)``.
E8M0_BIAS = 127
#: Values per MXFP4 block (one scale each): 16 bytes of two codes.
MXFP4_BLOCK = 32


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
    # The same float32 products whichever way the scales are broadcast: without a
    # repeated copy of them where the blocks tile the weight exactly (the hub's 128×128
    # on most weights) or where one block covers it (small weights); repeated otherwise.
    s, (n0, n1) = scale_inv.float(), want
    if rows == n0 * b0 and cols == n1 * b1:
        out = (w.float().reshape(n0, b0, n1, b1) * s[:, None, :, None]).reshape(rows, cols)
    elif want == (1, 1):
        out = w.float() * s
    else:
        out = w.float() * s[:, None, :, None].expand(n0, b0, n1, b1).reshape(n0 * b0, n1 * b1)[:rows, :cols]
    return out.to(dtype)


def mxfp4_shape(blocks: tuple[int, ...], scales: tuple[int, ...]) -> tuple[int, ...]:
    """The decoded shape of MXFP4 ``blocks`` ``[..., R, G, 16]`` with ``scales``
    ``[..., R, G]``: ``[..., G·32, R]``; anything else is a :class:`ShapeError`."""
    if len(blocks) < 3 or blocks[-1] != MXFP4_BLOCK // 2 or tuple(blocks[:-1]) != tuple(scales):
        raise ShapeError(f"MXFP4 blocks {list(blocks)} / scales {list(scales)}: expected [..., R, G, "
                         f"{MXFP4_BLOCK // 2}] blocks and [..., R, G] scales")
    *lead, rows, groups, _ = blocks
    return (*lead, groups * MXFP4_BLOCK, rows)


def _decode_rows(blocks: torch.Tensor, scales: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``[R, G, 16]`` codes and ``[R, G]`` scales → ``[R, G·32]`` float32 values (exact:
    every code value has at most two significant bits, the scales are powers of two)."""
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()  # low nibble first
    values = table[codes].reshape(*scales.shape, MXFP4_BLOCK)
    return torch.ldexp(values, (scales.to(torch.int32) - E8M0_BIAS)[..., None]).flatten(-2)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """MXFP4 ``blocks`` (uint8 ``[..., R, G, 16]``) and E8M0 ``scales`` (uint8 ``[..., R, G]``)
    → ``[..., G·32, R]`` in ``dtype``, bit for bit transformers' ``convert_moe_packed_tensors``
    (module docstring). Decoded one leading index (one expert) at a time, exact in float32,
    rounded once to ``dtype``."""
    shape = mxfp4_shape(tuple(blocks.shape), tuple(scales.shape))
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ShapeError(f"MXFP4 blocks ({blocks.dtype}) and scales ({scales.dtype}) must be uint8")
    if blocks.is_meta:
        return torch.empty(shape, dtype=dtype, device="meta")
    out = torch.empty(shape, dtype=dtype)
    table = torch.tensor(FP4_E2M1, dtype=torch.float32)
    rows = blocks.reshape(-1, *blocks.shape[-3:])
    dst = out.view(-1, *shape[-2:])
    for j in range(rows.shape[0]):
        dst[j] = _decode_rows(rows[j], scales.reshape(-1, *scales.shape[-2:])[j], table).T
    return out


@dataclass(frozen=True)
class PairCodec:
    """One quantized storage: the tensor ``X`` is stored as ``X + data_suffix`` beside
    ``X + scale_suffix``. ``decode(data, scales, dtype)`` rebuilds it (pure; a ``meta``
    input gives a ``meta`` output) and ``shape(data_shape, scale_shape)`` says its shape."""

    method: str
    data_suffix: str
    scale_suffix: str
    decode: Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]
    shape: Callable[[tuple[int, ...], tuple[int, ...]], tuple[int, ...]]
    detail: str = ""


def fp8_block_size(quantization: Any) -> tuple[int, int]:
    """The ``[b0, b1]`` of a block-scaled fp8 ``quantization_config``; another shape is
    refused by name."""
    block = quantization.get("weight_block_size") if isinstance(quantization, dict) else None
    if not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise UnsupportedError(f"quantization_config quant_method='fp8' weight_block_size={block!r}: only "
                               "block-scaled fp8 (DeepSeek-V3) is dequantized on import")
    return int(block[0]), int(block[1])


#: The ``quantization_config`` keys of an MXFP4 checkpoint (transformers' ``Mxfp4Config``:
#: ``to_dict`` writes the first two; ``dequantize`` is a loading switch).
MXFP4_KEYS = ("quant_method", "modules_to_not_convert", "dequantize")


def codec_for(quantization: Any) -> PairCodec:
    """The codec of a ``quantization_config``; any other method, or an MXFP4 config with a
    key that could change the decoding, is refused by name."""
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method == "fp8":
        block = fp8_block_size(quantization)
        return PairCodec("fp8", "", SCALE_SUFFIX,
                         lambda w, s, dtype: dequantize_blocks(w, s, block, dtype),
                         lambda w, s: w, f"{block[0]}×{block[1]} blocks")
    if method == "mxfp4":
        unknown = sorted(set(quantization) - set(MXFP4_KEYS))
        if unknown:
            raise UnsupportedError(f"quantization_config.{unknown[0]}={quantization[unknown[0]]!r} (mxfp4) is not "
                                   "understood: only transformers' MXFP4 layout is dequantized on import")
        return PairCodec("mxfp4", "_blocks", "_scales", dequantize_mxfp4, mxfp4_shape,
                         f"{MXFP4_BLOCK}-value blocks")
    raise UnsupportedError(f"quantization_config quant_method={method!r}: only block-scaled fp8 (DeepSeek-V3) and "
                           "MXFP4 (GPT-OSS) are dequantized on import")


class DequantSource:
    """``inner`` with every pair of ``codec`` presented as the one tensor it encodes, in
    ``dtype``; the pairs' stored names are hidden. Each ``load`` decodes one tensor."""

    def __init__(self, inner: TensorSource, codec: PairCodec, dtype: torch.dtype) -> None:
        self._inner, self._codec, self._dtype = inner, codec, dtype
        # The pairs hold the inner source's own name strings (one copy of each name per
        # process, not three: DeepSeek-V3 has 46k pairs), looked up through ``names``.
        names = {k: k for k in inner.keys()}
        data, scale = codec.data_suffix, codec.scale_suffix
        # stem -> the scale's name; the data's name is the stem + ``data`` (the stem itself,
        # the inner source's string, when ``data`` is empty): not a tuple per pair
        self._data = data
        self._pairs: dict[str, str] = {}
        for k in inner.keys():
            if k.endswith(scale):
                s = k[: len(k) - len(scale)]
                d = names.get(s + data)
                if d is not None:
                    self._pairs[d if not data else s] = k
        stem_of = {self._data_name(s): s for s in self._pairs}
        hidden = set(self._pairs.values())
        self._keys = [stem_of.get(k, k) for k in inner.keys() if k not in hidden]

    def _data_name(self, stem: str) -> str:
        return stem + self._data if self._data else stem

    @property
    def dequantized(self) -> int:
        """How many tensors are dequantized."""
        return len(self._pairs)

    @property
    def codec(self) -> PairCodec:
        return self._codec

    def keys(self) -> list[str]:
        return list(self._keys)

    def info(self, key: str) -> TensorInfo:
        scale = self._pairs.get(key)
        if scale is None:
            return self._inner.info(key)
        a, b = self._inner.info(self._data_name(key)), self._inner.info(scale)
        return TensorInfo(key, tuple(self._codec.shape(tuple(a.shape), tuple(b.shape))), self._dtype)

    def load(self, key: str) -> torch.Tensor:
        scale = self._pairs.get(key)
        if scale is None:
            return self._inner.load(key)
        return self._codec.decode(self._inner.load(self._data_name(key)), self._inner.load(scale), self._dtype)

    def group(self, key: str) -> str:
        return self._inner.group(self._data_name(key) if key in self._pairs else key)

    def close(self) -> None:
        self._inner.close()
