"""Producing one item's global tensors: read, fuse, cast, quantize.

Memory: one item (one fused linear and its quantized tensors) at a time. Quantization runs
on ``device`` (the weight is moved there after fusing) and results come back to the CPU
for writing. Calibration statistics are looked up here and must be complete: the driver
checks them (:func:`check_stats`) before any output exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from nemo_convert.errors import ConfigError, NemoConvertError
from nemo_convert.mapping.rules import Parallel
from nemo_convert.qnemo.plan import CALIBRATED, Item, QuantPlan
from nemo_convert.quant import awq, fp8, int4, int8
from nemo_convert.quant.calibrate import Stats, merge_stats
from nemo_convert.tensors.base import TensorSource

#: ``kv_cache_scaling_factor = max(√2·k_amax, v_amax)/448``: K is measured before RoPE,
#: which can raise one element of a rotated pair by up to √2 (docs/quantization.md).
KV_K_MARGIN = 2.0 ** 0.5


@dataclass
class Producer:
    """Makes the global tensors of plan items from ``source`` (HF names)."""

    plan: QuantPlan
    source: TensorSource
    stats: Mapping[str, Stats] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    awq_grid: int = 20
    #: α chosen by AWQ per linear, so re-producing an item (one tar member per rank)
    #: does not search again.
    awq_alpha: dict[str, float] = field(default_factory=dict)

    def __call__(self, item: Item) -> dict[str, torch.Tensor]:
        """``{output suffix: global tensor on the CPU}`` for ``item``."""
        if item.kind == "kv":
            k, v = (self.stats[m].output_amax for m in item.modules)
            assert k is not None and v is not None
            return {"": fp8.fp8_kv_cache_scaling_factor(k, v, k_margin=KV_K_MARGIN)}
        full = self._load(item)
        if item.kind == "tensor":
            want = item.outputs[0].dtype
            return {"": full.to(want) if full.dtype.is_floating_point and full.dtype != want else full}
        out = self._quantize(item, full.to(self.device))
        want = {o.suffix for o in item.outputs}
        if set(out) != want:
            raise NemoConvertError(f"internal error: {item.key}: the algorithm produced {sorted(out)}, "
                                   f"planned {sorted(want)}")
        return {k: v.cpu() for k, v in out.items()}

    def search_awq(self, item: Item) -> float:
        """Search (and remember) AWQ's α of the linear ``item``, without quantizing it."""
        st = self._stats(item)
        assert st is not None
        w = self._load(item).to(self.device)
        found = awq.awq_search(w, st.act_mean, samples=st.samples, group_size=self.plan.group_size,
                               n_grid=self.awq_grid, dtype=self.plan.dtype)
        self.awq_alpha[item.key] = found.alpha
        return found.alpha

    def _load(self, item: Item) -> torch.Tensor:
        """The item's sources, read and fused along dim 0."""
        parts = [self.source.load(n) for n in item.sources]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def _stats(self, item: Item) -> Stats | None:
        if self.plan.algo not in CALIBRATED:
            return None
        return merge_stats([self.stats[m] for m in item.modules])

    def _quantize(self, item: Item, w: torch.Tensor) -> dict[str, torch.Tensor]:
        algo, dtype, g = self.plan.algo, self.plan.dtype, self.plan.group_size
        if algo == "none":
            return {"weight": w.to(dtype)}
        if algo == "int8_wo":
            # The float weight on the int8 grid, no per_channel_scale (docs/quantization.md):
            # TensorRT-LLM quantizes each rank's weight while loading, per output channel
            # over the rank's own input columns. So a row-parallel weight is put on the grid
            # of each TP rank's column block, and TensorRT-LLM finds the same int8 values.
            blocks = w.chunk(self.plan.tp, dim=1) if item.spec is not None and \
                item.spec.parallel is Parallel.ROW else (w,)
            deq = [int8.fake_quantize_int8_wo(b, dtype=dtype) for b in blocks]
            return {"weight": deq[0] if len(deq) == 1 else torch.cat(deq, dim=1)}
        if algo == "int4_wo":
            return int4.quantize_int4_wo(w, group_size=g, dtype=dtype)
        st = self._stats(item)
        assert st is not None
        if algo == "fp8":
            return fp8.quantize_fp8(w, st.input_amax, dtype=dtype)
        if algo == "int4_awq":
            return self._awq(item, w, st)
        raise ConfigError(f"unknown algorithm {algo!r}")  # pragma: no cover

    def _awq(self, item: Item, w: torch.Tensor, st: Stats) -> dict[str, torch.Tensor]:
        dtype, g = self.plan.dtype, self.plan.group_size
        alpha = self.awq_alpha.get(item.key)
        if alpha is None:
            found = awq.awq_search(w, st.act_mean, samples=st.samples, group_size=g,
                                   n_grid=self.awq_grid, dtype=dtype)
            self.awq_alpha[item.key] = found.alpha
            s, pre = found.scales, found.prequant
        else:
            s, pre = awq.awq_channel_scales(st.act_mean.to(w.device), alpha, dtype)
        q, scale = int4.quantize_groupwise(w.detach().float() * s[None, :], g, dtype)
        return {"weight": int4.pack_int4(q, dim=0), "weights_scaling_factor": scale,
                "prequant_scaling_factor": pre}


def check_stats(plan: QuantPlan, stats: Mapping[str, Stats]) -> None:
    """Every quantized linear and KV-cache scale has the calibration it needs, finite."""
    problems: list[str] = []
    for it in plan.items():
        if it.kind == "linear" and plan.algo in CALIBRATED:
            for m in it.modules:
                st = stats.get(m)
                if st is None:
                    problems.append(f"{m} (no statistics: the module never ran)")
                elif not bool(torch.isfinite(st.input_amax)) or not bool(torch.isfinite(st.act_mean).all()):
                    problems.append(f"{m} (non-finite activations)")
        if it.kind == "kv":
            for m in it.modules:
                st = stats.get(m)
                if st is None or st.output_amax is None or not bool(torch.isfinite(st.output_amax)):
                    problems.append(f"{m} (no finite output amax for the KV-cache scale)")
    if problems:
        shown = ", ".join(problems[:6]) + (f", … ({len(problems) - 6} more)" if len(problems) > 6 else "")
        raise ConfigError(f"calibration is incomplete, so scale tensors would be missing: {shown}")
