"""dtype names on the command line, and which casts lose information."""

from __future__ import annotations

import torch

from nemo_convert.errors import NemoConvertError

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}
SHORT: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise NemoConvertError(f"unknown dtype {name!r} (use bf16, fp16 or fp32)") from None


def lossy_cast(src: torch.dtype, dst: torch.dtype) -> str | None:
    """Why casting ``src`` to ``dst`` may lose information, or None when it cannot."""
    if src == dst or not src.is_floating_point or not dst.is_floating_point:
        return None
    s, d = torch.finfo(src), torch.finfo(dst)
    reasons = []
    if d.bits < s.bits or d.eps > s.eps:
        reasons.append("precision")
    if d.max < s.max:
        reasons.append(f"range (values beyond ±{d.max:.4g} overflow)")
    return " and ".join(reasons) or None


def cast_for_output(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None or t.dtype == dtype or not t.dtype.is_floating_point:
        return t
    return t.to(dtype)
