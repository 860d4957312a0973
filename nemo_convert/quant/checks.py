"""The checks and constants every quantization algorithm shares: the accepted weight
dtypes, the default int4 group size, and the validation of a linear weight and of an
amax. The algorithm modules (:mod:`.int8`, :mod:`.int4`, :mod:`.fp8`, :mod:`.awq`) import
these; :mod:`.algorithms` names the algorithms and imports those modules."""

from __future__ import annotations

import torch

from nemo_convert.errors import ConfigError, ShapeError, UnsupportedError

#: Weight dtypes the algorithms accept as input.
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

#: Default group size of the group-wise int4 algorithms (TensorRT-LLM and ModelOpt
#: both default to 128; the group-wise kernels also accept 64).
DEFAULT_GROUP_SIZE = 128


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
