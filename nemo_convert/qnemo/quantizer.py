"""The quantization tasks' work: one linear's TensorRT-LLM tensors from its global weight.

``quantize`` adds one planner task per quantized linear after the task that makes its
weight (:mod:`.plan`); that task calls :meth:`Quantizer.linear`. A quantizer is made with
the plan and given its calibration statistics (and the HF module names each linear's
statistics come from) once calibration ran (:meth:`Quantizer.calibrated`). Quantization runs
on ``device``; results come back to the CPU for writing.

A linear is one weight ``[out, in]`` (HF orientation) or, for a layer's experts, ``[E, out,
in]``: each expert is quantized as its own linear, as TensorRT-LLM's MoE layer holds them
(``tensorrt_llm/layers/moe.py``, ``MOEWeightWrapper``: FP8 ``weights_scaling_factor``
``(experts, 1)``, one ``activation_scaling_factor`` ``(1,)`` for all experts — the max of
their input ranges).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from nemo_convert.errors import ConfigError, NemoConvertError
from nemo_convert.mapping.rules import Parallel
from nemo_convert.quant import awq, fp8, int4, int8
from nemo_convert.quant.calibrate import Stats, merge_stats
from nemo_convert.quant.trtllm_names import LINEAR_TENSORS

#: Algorithms that need activation statistics from calibration.
CALIBRATED = ("fp8", "int4_awq")
#: ``kv_cache_scaling_factor = max(√2·k_amax, v_amax)/448``: K is measured before RoPE,
#: which can raise one element of a rotated pair by up to √2 (docs/quantization.md).
KV_K_MARGIN = 2.0 ** 0.5


@dataclass(frozen=True)
class Linear:
    """One quantized linear of the plan.

    :param key: its global TensorRT-LLM prefix (``transformer.layers.5.mlp.fc``): unique.
    :param kind: ``COLUMN`` or ``ROW`` (TensorRT-LLM's split of the weight, of each expert).
    :param rows: the dim-0 sizes of the parts fused in it (q, k, v), split one by one.
    :param experts: the experts stacked on dim 0 (0: one weight).
    :param refs: the NeMo tensors (and part) whose HF modules' statistics calibrate it.
    """

    key: str
    kind: Parallel
    rows: tuple[int, ...]
    experts: int = 0
    refs: tuple[tuple[str, int | None], ...] = ()


@dataclass
class Quantizer:
    """Quantizes linears with one algorithm; holds calibration statistics and AWQ's α."""

    algo: str
    dtype: torch.dtype
    group_size: int
    tp: int
    ep: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    awq_grid: int = 20
    stats: Mapping[str, Stats] = field(default_factory=dict)
    #: linear key (or KV-cache scale name) → the calibration module names of its statistics
    modules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: α chosen by AWQ per linear, so re-producing a linear (one tar member per rank) does not search again
    awq_alpha: dict[str, float] = field(default_factory=dict)

    def calibrated(self, stats: Mapping[str, Stats], modules: dict[str, tuple[str, ...]]) -> None:
        """Take calibration's statistics and the module names each linear's come from."""
        self.stats, self.modules = stats, dict(modules)

    def suffixes(self) -> tuple[str, ...]:
        """The tensors one quantized linear becomes (``weight`` for ``none``)."""
        return ("weight",) if self.algo in ("none", "int8_wo") else LINEAR_TENSORS[self.algo]

    # ------------------------------------------------------------------- linears
    def linear(self, lin: Linear, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The global tensors of ``lin`` (in :meth:`suffixes` order), on the CPU."""
        out = self._quantize(lin, w.to(self.device))
        want = self.suffixes()
        if set(out) != set(want):
            raise NemoConvertError(f"internal error: {lin.key}: the algorithm produced {sorted(out)}, "
                                   f"planned {sorted(want)}")
        return tuple(out[s].cpu() for s in want)

    def _stats(self, lin: Linear) -> Stats | None:
        if self.algo not in CALIBRATED:
            return None
        return merge_stats([self.stats[m] for m in self.modules[lin.key]])

    def _quantize(self, lin: Linear, w: torch.Tensor) -> dict[str, torch.Tensor]:
        algo, dtype, g = self.algo, self.dtype, self.group_size
        if algo == "none":
            return {"weight": w.to(dtype)}
        if algo == "int8_wo":
            # The float weight on the int8 grid, no per_channel_scale (docs/quantization.md):
            # TensorRT-LLM quantizes each rank's weight while loading, per output channel
            # over the rank's own input columns. So a row-parallel weight is put on the grid
            # of each TP rank's column block, and TensorRT-LLM finds the same int8 values.
            ranks = self.tp // self.ep if lin.experts else self.tp
            blocks = w.chunk(ranks, dim=-1) if lin.kind is Parallel.ROW else (w,)
            deq = [int8.fake_quantize_int8_wo(b, dtype=dtype) if b.dim() == 2 else
                   int8.fake_quantize_int8_wo(b.reshape(-1, b.shape[-1]), dtype=dtype).reshape(b.shape)
                   for b in blocks]
            return {"weight": deq[0] if len(deq) == 1 else torch.cat(deq, dim=-1)}
        if algo == "int4_wo":
            if not lin.experts:
                return int4.quantize_int4_wo(w, group_size=g, dtype=dtype)
            # Groups run along each row, so the experts' rows quantize as one [E·out, in] weight.
            e, o, i = w.shape
            got = int4.quantize_int4_wo(w.reshape(e * o, i), group_size=g, dtype=dtype)
            return {"weight": got["weight"].reshape(e, o // 2, i),
                    "weights_scaling_factor": got["weights_scaling_factor"].reshape(e, o, i // g)}
        st = self._stats(lin)
        assert st is not None
        if algo == "fp8":
            if not lin.experts:
                return fp8.quantize_fp8(w, st.input_amax, dtype=dtype)
            each = [fp8.quantize_fp8(w[x], st.input_amax, dtype=dtype) for x in range(w.shape[0])]
            return {"weight": torch.stack([q["weight"] for q in each]),
                    "weights_scaling_factor": torch.stack([q["weights_scaling_factor"] for q in each]),
                    "activation_scaling_factor": each[0]["activation_scaling_factor"]}
        if algo == "int4_awq":
            return self._awq(lin, w, st)
        raise ConfigError(f"unknown algorithm {algo!r}")  # pragma: no cover

    def search_awq(self, lin: Linear, w: torch.Tensor) -> float:
        """Search (and remember) AWQ's α of ``lin``, without quantizing it."""
        st = self._stats(lin)
        assert st is not None
        found = awq.awq_search(w.to(self.device), st.act_mean, samples=st.samples, group_size=self.group_size,
                               n_grid=self.awq_grid, dtype=self.dtype)
        self.awq_alpha[lin.key] = found.alpha
        return found.alpha

    def _awq(self, lin: Linear, w: torch.Tensor, st: Stats) -> dict[str, torch.Tensor]:
        dtype, g = self.dtype, self.group_size
        alpha = self.awq_alpha.get(lin.key)
        if alpha is None:
            found = awq.awq_search(w, st.act_mean, samples=st.samples, group_size=g,
                                   n_grid=self.awq_grid, dtype=dtype)
            self.awq_alpha[lin.key] = found.alpha
            s, pre = found.scales, found.prequant
        else:
            s, pre = awq.awq_channel_scales(st.act_mean.to(w.device), alpha, dtype)
        q, scale = int4.quantize_groupwise(w.detach().float() * s[None, :], g, dtype)
        return {"weight": int4.pack_int4(q, dim=0), "weights_scaling_factor": scale,
                "prequant_scaling_factor": pre}

    # ------------------------------------------------------------------- KV cache
    def kv_scale(self, name: str) -> torch.Tensor:
        """The FP8 KV-cache scale ``name`` from its K and V modules' output amax."""
        k, v = (self.stats[m].output_amax for m in self.modules[name])
        assert k is not None and v is not None
        return fp8.fp8_kv_cache_scaling_factor(k, v, k_margin=KV_K_MARGIN)


def check_stats(quantizer: Quantizer, linears: list[str], kv: list[str]) -> None:
    """Every quantized linear and KV-cache scale has the calibration it needs, finite."""
    stats, problems = quantizer.stats, []
    if quantizer.algo in CALIBRATED:
        for key in linears:
            for m in quantizer.modules.get(key, ()):
                st = stats.get(m)
                if st is None:
                    problems.append(f"{m} (no statistics: the module never ran)")
                elif not bool(torch.isfinite(st.input_amax)) or not bool(torch.isfinite(st.act_mean).all()):
                    problems.append(f"{m} (non-finite activations)")
    for key in kv:
        for m in quantizer.modules.get(key, ()):
            st = stats.get(m)
            if st is None or st.output_amax is None or not bool(torch.isfinite(st.output_amax)):
                problems.append(f"{m} (no finite output amax for the KV-cache scale)")
    if problems:
        shown = ", ".join(problems[:6]) + (f", … ({len(problems) - 6} more)" if len(problems) > 6 else "")
        raise ConfigError(f"calibration is incomplete, so scale tensors would be missing: {shown}")
