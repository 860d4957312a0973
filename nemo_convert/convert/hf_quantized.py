"""A quantized HF checkpoint (``quantization_config``) seen as the plain model it encodes.

``import`` and ``verify`` open an HF folder the same way: every quantized pair is
dequantized on read, one tensor at a time (:mod:`nemo_convert.mapping.dequant`), and the
config loses ``quantization_config`` — the ``.nemo`` holds plain weights and its export
writes a plain model. Export never re-quantizes (MXFP4 and block fp8 are lossy).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.hf.hf import HFCheckpoint
from nemo_convert.mapping.dequant import DequantSource, codec_for


def config_dtype(hf_cfg: dict[str, Any]) -> torch.dtype:
    """The dtype ``config.json`` names (``dtype`` / ``torch_dtype``), bfloat16 by default."""
    name = str(hf_cfg.get("dtype") or hf_cfg.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16


def dequantize_on_read(ckpt: HFCheckpoint, dtype: torch.dtype | None = None) -> tuple[dict[str, Any] | None, str]:
    """Replace ``ckpt``'s source by its dequantized view and drop ``quantization_config``
    from its config. Returns the removed ``quantization_config`` (None: the checkpoint is
    not quantized, nothing changed) and a one-line note. ``dtype`` is the dequantized
    tensors' (``--dtype``; default: the config's)."""
    quantized = ckpt.config.get("quantization_config")
    if quantized is None:
        return None, ""
    codec = codec_for(quantized)  # refuses what is not dequantized here, by name
    out = dtype or config_dtype(ckpt.config)
    ckpt.config = {k: v for k, v in ckpt.config.items() if k != "quantization_config"}
    deq = DequantSource(ckpt.source, codec, out)
    if not deq.dequantized:
        raise UnsupportedError(f"{ckpt.folder}: quantization_config quant_method={codec.method!r}, but no tensor is "
                               f"stored that way (no X{codec.data_suffix} beside X{codec.scale_suffix}); remove "
                               "quantization_config from config.json if the weights are plain")
    ckpt.source = deq
    return quantized, (f"dequantized {deq.dequantized} {codec.method} tensors ({codec.detail}) to {out}; "
                       "quantization_config is not kept (export writes the plain model)")
