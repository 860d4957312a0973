"""A checkpoint seen under the other side's tensor names, lazily, through a plan.

``quantize`` reads an HF folder as NeMo logical tensors through the family's ``to_nemo``
plan (``plan_conversion(family.mapping(cfg), cfg, source, "to_nemo")``), which knows every
NeMo tensor's shape and dtype and how to make it (e.g. ``fuse_qkv`` of q, k and v); the
``hf`` output target reads an :class:`~nemo_convert.plugins.records.OutputJob`'s plan the
same way (:func:`plan_view`). This view runs a task only when one of its outputs is loaded
and keeps the outputs of the last task (a layer's fused experts come from one task), so at
most one task's tensors are alive.
"""

from __future__ import annotations

import torch

from nemo_convert.dtypes import cast_for_output
from nemo_convert.errors import InputError
from nemo_convert.mapping.planner import IdentityPlan, Plan, Task
from nemo_convert.mapping.rules.protocol import same
from nemo_convert.tensors.base import TensorInfo, TensorSource


class PlanSource:
    """Implements :class:`~nemo_convert.tensors.base.TensorSource` over a plan's outputs."""

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


def is_identity(plan: Plan, source: TensorSource) -> bool:
    """Whether ``plan`` copies every tensor of ``source`` unchanged under its own name
    (:func:`~nemo_convert.mapping.planner.identity_plan`: a reshard, a training checkpoint,
    an export): then the plan's outputs *are* ``source``'s tensors."""
    if len(plan.tasks) != len(source.keys()):
        return False
    for task in plan.tasks:
        if task.fn is not same or task.check_equal or task.inputs != task.outputs or len(task.infos) != 1:
            return False
        if task.infos[0] != source.info(task.inputs[0]):
            return False
    return True


def plan_view(plan: Plan, source: TensorSource) -> TensorSource:
    """``plan``'s outputs as a source: ``source`` itself when the plan is its identity
    (:func:`is_identity`; its lazy reads, slices included, stay as they are), else a
    :class:`PlanSource`. An :class:`~nemo_convert.mapping.planner.IdentityPlan` whose
    tasks were never read is known to be one without making them."""
    if isinstance(plan, IdentityPlan) and plan.copies(source):
        return source
    return source if is_identity(plan, source) else PlanSource(plan, source)
