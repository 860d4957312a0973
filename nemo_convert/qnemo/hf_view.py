"""A ``.nemo`` seen under Hugging Face tensor names, lazily, through the family's plan.

``plan_conversion(family.mapping(cfg), cfg, source, "to_hf")`` knows every HF tensor's
shape and dtype and how to make it (e.g. ``split_qkv`` of the grouped NeMo QKV). This view
runs a task only when one of its outputs is loaded and keeps the outputs of the last task
(q, k and v come from one task), so at most one task's tensors are alive.
"""

from __future__ import annotations

import torch

from nemo_convert.dtypes import cast_for_output
from nemo_convert.errors import InputError
from nemo_convert.mapping.planner import Plan, Task
from nemo_convert.tensors.base import TensorInfo, TensorSource


class PlanSource:
    """Implements :class:`~nemo_convert.tensors.base.TensorSource` over a ``to_hf`` plan."""

    def __init__(self, plan: Plan, source: TensorSource) -> None:
        self._source = source
        self._where: dict[str, tuple[Task, int]] = {}
        self._infos: dict[str, TensorInfo] = {}
        for task in plan.tasks:
            if task.check_equal:
                continue
            for j, info in enumerate(task.infos):
                self._where[info.name] = (task, j)
                self._infos[info.name] = info
        self._task: Task | None = None
        self._outs: list[torch.Tensor] = []

    def keys(self) -> list[str]:
        return list(self._infos)

    def info(self, key: str) -> TensorInfo:
        return self._infos[key]

    def group(self, key: str) -> str:
        return ""

    def load(self, key: str) -> torch.Tensor:
        if key not in self._where:
            raise InputError(f"no tensor {key!r}")
        task, j = self._where[key]
        if self._task is not task:
            self._task, self._outs = None, []
            outs = task.fn([self._source.load(k) for k in task.inputs])
            self._outs = [cast_for_output(o, i.dtype) for o, i in zip(outs, task.infos)]
            self._task = task
        return self._outs[j]

    def close(self) -> None:
        self._task, self._outs = None, []
        self._source.close()
