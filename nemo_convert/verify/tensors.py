"""Tensors under their HF names, streamed, and the per-tensor comparison.

An :class:`HFView` presents a checkpoint's tensors under HF names: an HF folder as is; a
``.nemo`` through its family's ``to_hf`` plan, one task at a time. Loading a name runs
only the task that produces it; the task's other outputs (``k`` and ``v`` when ``q`` was
asked for) are kept until they are asked for, so at any moment only the outputs of
about one task per side are alive, never the whole model.
"""

from __future__ import annotations

import math

import torch

from nemo_convert.dtypes import cast_for_output
from nemo_convert.mapping.planner import Plan, Task
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.verify.report import TensorDiff

#: Elements compared per chunk (bounds the float64 working memory to a few tens of MB).
CHUNK = 1 << 21


class HFView:
    """A lazy, read-only view of a checkpoint under HF tensor names."""

    def __init__(self, source: TensorSource, plan: Plan | None = None) -> None:
        self._source = source
        self._plan = plan
        self._producer: dict[str, Task] = {}
        self._infos: dict[str, TensorInfo] = {}
        self._cache: dict[str, torch.Tensor] = {}
        self.peak_cached = 0  # most task outputs held at once (for tests and the memory claim)
        if plan is None:
            self._infos = {k: source.info(k) for k in source.keys()}  # noqa: SIM118 (a TensorSource)
        else:
            for task in plan.tasks:
                for info in task.infos:
                    self._infos[info.name] = info
                    self._producer[info.name] = task

    def names(self) -> list[str]:
        return list(self._infos)

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def info(self, name: str) -> TensorInfo:
        return self._infos[name]

    def load(self, name: str) -> torch.Tensor:
        if self._plan is None:
            return self._source.load(name)
        if name in self._cache:
            return self._cache.pop(name)
        task = self._producer[name]
        inputs = [self._source.load(k) for k in task.inputs]
        outputs = task.fn(inputs)
        wanted: torch.Tensor | None = None
        for info, out in zip(task.infos, outputs):
            out = cast_for_output(out, info.dtype)
            if info.name == name:
                wanted = out
            else:
                self._cache[info.name] = out
        self.peak_cached = max(self.peak_cached, len(self._cache) + 1)
        del inputs, outputs
        assert wanted is not None
        return wanted

    def release(self) -> None:
        """Forget task outputs nobody asked for."""
        self._cache.clear()


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(index % dim if dim else 0)
        index = index // dim if dim else 0
    return list(reversed(out))


def compare_tensors(name: str, a: torch.Tensor, b: torch.Tensor, *, atol: float = 0.0,
                    rtol: float = 0.0, allow_dtype_change: bool = False) -> TensorDiff:
    """Compare ``a`` with ``b`` (the reference of ``rtol``) like ``torch.allclose(a, b,
    atol, rtol, equal_nan=True)``, in float64 chunks.

    Different dtypes make the status ``dtype`` (the differences are still computed) —
    unless ``allow_dtype_change`` and both are floating: then both are compared by value
    (float64 holds every bf16, fp16 and fp32 value exactly), the status is ``close`` or
    ``different`` like for one dtype, and ``note`` names the change."""
    diff = TensorDiff(name, "equal", list(a.shape), list(b.shape), _short(a.dtype), _short(b.dtype))
    if tuple(a.shape) != tuple(b.shape):
        diff.status = "shape"
        return diff
    diff.numel = a.numel()
    if _bits_equal(a, b):
        diff.max_abs, diff.max_rel, diff.mismatched = 0.0, 0.0, 0
        return diff
    fa, fb = a.reshape(-1), b.reshape(-1)
    max_abs = max_rel = 0.0
    worst = 0
    bad = 0
    for start in range(0, fa.numel(), CHUNK):
        x = fa[start:start + CHUNK].to(torch.float64)
        y = fb[start:start + CHUNK].to(torch.float64)
        both_nan = torch.isnan(x) & torch.isnan(y)
        same = (x == y) | both_nan  # equal infinities included
        d = torch.where(same, torch.zeros_like(x), (x - y).abs())
        d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)  # one NaN, or inf - inf
        ay = y.abs()
        rel = torch.where(d == 0, torch.zeros_like(d),
                          torch.where(ay > 0, d / torch.where(ay > 0, ay, torch.ones_like(ay)),
                                      torch.full_like(d, math.inf)))
        rel = torch.where(torch.isnan(rel), torch.full_like(rel, math.inf), rel)
        tol = atol + rtol * torch.where(torch.isfinite(ay), ay, torch.zeros_like(ay))
        bad += int((d > tol).sum())
        i = int(torch.argmax(d))
        if float(d[i]) > max_abs:
            max_abs, worst = float(d[i]), start + i
        max_rel = max(max_rel, float(rel.max()))
    diff.max_abs, diff.max_rel, diff.mismatched = max_abs, max_rel, bad
    if fa.numel():
        diff.worst_index = _unravel(worst, tuple(a.shape))
        diff.value_a, diff.value_b = float(fa[worst].to(torch.float64)), float(fb[worst].to(torch.float64))
    by_value = allow_dtype_change and a.dtype.is_floating_point and b.dtype.is_floating_point
    if a.dtype != b.dtype and not by_value:
        diff.status = "dtype"
    else:
        diff.status = "different" if bad else "close"
        if a.dtype != b.dtype:
            diff.note = f"dtype changed ({_short(a.dtype)} → {_short(b.dtype)}); compared by value"
    return diff
