"""INT4 AWQ: activation-aware per-input-channel scaling before group-wise int4.

AWQ multiplies input channel ``k`` of the weight by ``s[k]`` before quantizing, and
the input by ``1/s[k]`` at run time, so salient channels (large activations) keep more
precision. With ``a[k]`` the mean ``|x[k]|`` from calibration, ``s = a^α`` normalised
to geometric-mean-of-extremes 1, and α chosen from the grid ``{0, 1/n, ..., (n-1)/n}``
to minimise the output error

* ``‖X·Wᵀ − X·W_effᵀ‖²`` on the calibration input rows ``X`` when samples are given,
* else the proxy ``Σ_k a[k]² · Σ_o (W − W_eff)[o, k]²`` (independent inputs of mean
  magnitude ``a``),

where ``W_eff = deq(Q(W·diag(s)))·diag(1/s)``. α = 0 (s = 1, plain int4) is on the
grid, so the chosen scaling never does worse than plain int4 on that objective.

TensorRT-LLM tensors (checkpoint.md "AWQ Quantization Scaling Factors";
``WeightOnlyGroupwiseQuantLinear`` with ``pre_quant_scale=True``): the packed int4
``weight`` and ``weights_scaling_factor`` of ``W·diag(s)`` as in :mod:`.int4`, and
``prequant_scaling_factor`` = ``1/s``, shape ``[in]`` in the model dtype (the loader
reshapes it to the layer's ``(1, in)``). The run-time input is multiplied by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nemo_convert.errors import ConfigError, ShapeError
from nemo_convert.quant.checks import DEFAULT_GROUP_SIZE, check_linear_weight, resolve_dtype
from nemo_convert.quant.int4 import (
    check_int4_shape,
    dequantize_groupwise,
    dequantize_int4_wo,
    pack_int4,
    quantize_groupwise,
)

#: Lower bound on activation magnitudes before raising them to α (avoids 0^α).
ACT_FLOOR = 1e-4
#: Output rows processed at once in the search (bounds the extra memory).
_ROW_CHUNK = 4096


@dataclass
class AwqSearchResult:
    """The outcome of the α search for one linear."""

    alpha: float
    #: The per-input-channel multipliers ``s`` applied to the weight (float32 ``[in]``),
    #: such that ``1/s`` is exactly representable in the model dtype.
    scales: torch.Tensor
    #: ``1/s`` in the model dtype: the ``prequant_scaling_factor``.
    prequant: torch.Tensor
    #: ``(alpha, loss)`` for every grid point, in grid order.
    losses: list[tuple[float, float]] = field(default_factory=list)


def awq_channel_scales(act_mean: torch.Tensor, alpha: float,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, 1/s in dtype)`` for one α: ``s = a^α / sqrt(max(a^α)·min(a^α))``.

    ``s`` is recomputed from the rounded ``1/s`` so the pair is exactly consistent.
    """
    a = act_mean.detach().float().clamp(min=ACT_FLOOR)
    s = a.pow(alpha)
    s = s / torch.sqrt(s.max() * s.min())
    pre = (1.0 / s).to(dtype)
    return 1.0 / pre.float(), pre


def _effective_weight(w: torch.Tensor, s: torch.Tensor, group_size: int,
                      dtype: torch.dtype) -> torch.Tensor:
    """``deq(Q(W·diag(s))) · diag(1/s)`` in float32."""
    q, scale = quantize_groupwise(w * s[None, :], group_size, dtype)
    return dequantize_groupwise(q, scale) / s[None, :]


def _check_stats(weight: torch.Tensor, act_mean: torch.Tensor,
                 samples: torch.Tensor | None) -> None:
    in_f = weight.shape[1]
    if act_mean.dim() != 1 or act_mean.numel() != in_f:
        raise ShapeError(f"AWQ activation means must have shape [{in_f}], got "
                         f"{tuple(act_mean.shape)}")
    if not bool(torch.isfinite(act_mean).all()) or bool((act_mean < 0).any()):
        raise ConfigError("AWQ activation means must be finite and non-negative")
    if samples is not None:
        if samples.dim() != 2 or samples.shape[1] != in_f:
            raise ShapeError(f"AWQ calibration samples must have shape [n, {in_f}], got "
                             f"{tuple(samples.shape)}")
        if not bool(torch.isfinite(samples).all()):
            raise ConfigError("AWQ calibration samples contain NaN or infinite values")


def awq_search(weight: torch.Tensor, act_mean: torch.Tensor, *,
               samples: torch.Tensor | None = None,
               group_size: int = DEFAULT_GROUP_SIZE, n_grid: int = 20,
               dtype: torch.dtype | None = None) -> AwqSearchResult:
    """Search α on the grid ``k / n_grid`` (k = 0..n_grid-1) for one linear.

    ``samples`` (``[n, in]`` calibration input rows, any float dtype) select the
    output-error objective; without them the statistics-only proxy is used. Ties keep
    the smaller α, so a weight AWQ cannot help stays plain int4.
    """
    check_linear_weight(weight)
    if n_grid < 1:
        raise ValueError(f"n_grid must be ≥ 1, got {n_grid}")
    act_mean = act_mean.to(weight.device)
    if samples is not None and samples.numel() == 0:
        samples = None
    if samples is not None:
        samples = samples.to(device=weight.device, dtype=torch.float32)
    _check_stats(weight, act_mean, samples)
    scale_dtype = resolve_dtype(weight, dtype)
    out_f, in_f = weight.shape
    check_int4_shape(out_f, in_f, group_size)
    w = weight.detach().float()
    a2 = act_mean.detach().float().pow(2)

    best: AwqSearchResult | None = None
    best_loss = float("inf")
    losses: list[tuple[float, float]] = []
    for k in range(n_grid):
        alpha = k / n_grid
        s, pre = awq_channel_scales(act_mean, alpha, scale_dtype)
        loss = 0.0
        for start in range(0, out_f, _ROW_CHUNK):
            rows = w[start:start + _ROW_CHUNK]
            diff = rows - _effective_weight(rows, s, group_size, scale_dtype)
            if samples is not None:
                loss += float((samples @ diff.t()).pow(2).sum())
            else:
                loss += float((diff.pow(2) * a2[None, :]).sum())
        losses.append((alpha, loss))
        if loss < best_loss:
            best_loss = loss
            best = AwqSearchResult(alpha=alpha, scales=s, prequant=pre)
    assert best is not None
    best.losses = losses
    return best


def quantize_int4_awq(weight: torch.Tensor, act_mean: torch.Tensor, *,
                      samples: torch.Tensor | None = None,
                      group_size: int = DEFAULT_GROUP_SIZE, n_grid: int = 20,
                      dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Quantize an HF ``[out, in]`` weight with AWQ.

    ``act_mean`` is the per-input-channel mean ``|x|`` of this linear's input;
    ``samples`` optional calibration input rows. Returns ``{"weight": int8
    [out // 2, in] (packed int4 of W·diag(s)), "weights_scaling_factor":
    [out, in // group_size], "prequant_scaling_factor": [in]}`` (scales in the model
    dtype).
    """
    found = awq_search(weight, act_mean, samples=samples, group_size=group_size,
                       n_grid=n_grid, dtype=dtype)
    scale_dtype = resolve_dtype(weight, dtype)
    scaled = weight.detach().float() * found.scales[None, :]
    q, scale = quantize_groupwise(scaled, group_size, scale_dtype)
    return {
        "weight": pack_int4(q, dim=0),
        "weights_scaling_factor": scale,
        "prequant_scaling_factor": found.prequant,
    }


def dequantize_int4_awq(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The effective float32 ``[out, in]`` weight: ``deq(Q(W·s)) · diag(prequant)``.

    Element-wise ``|W − result| ≤ weights_scaling_factor/2 · prequant`` (the int4
    bound in the scaled domain, mapped back).
    """
    if "prequant_scaling_factor" not in tensors:
        raise ShapeError("AWQ tensors lack prequant_scaling_factor")
    return dequantize_int4_wo(tensors)
