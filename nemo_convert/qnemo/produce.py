"""Producing one item's global tensors: run its tasks over the NeMo logical tensors.

An item's first task reads NeMo tensors (an HF folder seen through the family's ``to_nemo``
plan, or a ``.nemo``'s own) and makes TensorRT-LLM tensors; the quantization tasks added
after it each take one of those and return the algorithm's tensors (:mod:`.quantizer`). A
tensor written as it is is cast to its planned dtype. Memory: one item (one target task's
tensors and their quantized forms) at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_convert.errors import NemoConvertError
from nemo_convert.qnemo.plan import Item, QuantPlan
from nemo_convert.qnemo.quantizer import Linear
from nemo_convert.tensors.base import TensorSource


@dataclass
class Producer:
    """Makes the global tensors of plan items from ``source`` (NeMo logical names)."""

    plan: QuantPlan
    source: TensorSource

    def _run(self, item: Item, stop: int | None = None) -> dict[str, torch.Tensor]:
        values: dict[str, torch.Tensor] = {}
        for task in item.tasks[:stop]:
            ins = [values.pop(k) if k in values else self.source.load(k) for k in task.inputs]
            values.update(zip(task.outputs, task.fn(ins)))
        return values

    def __call__(self, item: Item) -> dict[str, torch.Tensor]:
        """``{global output name: global tensor on the CPU}`` for ``item``."""
        values = self._run(item)
        out: dict[str, torch.Tensor] = {}
        for o in item.outputs:
            t = values.get(o.name)
            if t is None:
                raise NemoConvertError(f"internal error: {item.key}: {o.name} was planned but not produced")
            out[o.name] = t.to(o.dtype) if t.dtype.is_floating_point and t.dtype != o.dtype else t
        return out

    def search_awq(self, item: Item, lin: Linear) -> float:
        """Search (and remember) AWQ's α of ``lin`` (one of ``item``'s linears), without quantizing it."""
        values = self._run(item, stop=1)
        return self.plan.quantizer.search_awq(lin, values[lin.key + ".weight"])
