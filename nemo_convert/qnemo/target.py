"""The TensorRT-LLM target of ``quantize``, planned by the one planner.

A family's TensorRT-LLM table (:class:`~nemo_convert.families.trtllm.TrtllmTable`) is a
*projection* of its NeMo logical tensors: NeMo name → TensorRT-LLM name(s), with ``{i}``
and ``{e}`` as in the family's rules. :func:`plan_target` turns each row into a rule
(:class:`Projected`) and plans them with :func:`~nemo_convert.mapping.planner.plan_conversion`
out of NeMo (direction ``to_hf``: from the NeMo side to the other side, here TensorRT-LLM's)
over the NeMo logical tensors — an HF folder seen through the family's ``to_nemo`` plan, or a
``.nemo``'s own tensors. So the planner expands the templates, proves that every NeMo tensor
is written (or declared droppable by the family) and runs every task on ``meta`` tensors to
know each TensorRT-LLM tensor's global shape. Nothing here names a rule type: how a NeMo
tensor comes apart is its tensor-parallel kind (a grouped QKV → ``[q; k; v]``; a gated fc1 →
gate, up), a fact of Megatron's layout; which HF modules fed it (for calibration and the
KV-cache scale) is the family rule's :meth:`~nemo_convert.mapping.rules.Rule.origins`.

Each task carries what the writer needs beyond the planner's fields (:class:`TrtTask`): the
table row and layer (the write order), and per output how TensorRT-LLM ranks split it
(:class:`OutSpec`: the TP kind, dim-0 sections split one by one, an expert dim) and whether
quantization takes it. ``{i}`` in the planned names is the global layer; the rank files
number layers within the pipeline stage (:mod:`nemo_convert.qnemo.plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families.trtllm import TrtllmName, TrtllmTable
from nemo_convert.mapping import ops
from nemo_convert.mapping.planner import Plan, plan_conversion
from nemo_convert.mapping.rules import Condition, Mapping, Parallel, cfg_get
from nemo_convert.mapping.rules.protocol import Direction, PlanContext, Rule, Task
from nemo_convert.tensors.base import TensorSource
from nemo_convert.tensors.pieces import materialize

if TYPE_CHECKING:
    import torch

#: A NeMo tensor's tensor-parallel kind → how TensorRT-LLM ranks split what it becomes:
#: fused and gated tensors are column-parallel there, split part by part.
TRT_SPLIT: dict[Parallel, Parallel] = {
    Parallel.REPLICATED: Parallel.REPLICATED, Parallel.COLUMN: Parallel.COLUMN, Parallel.ROW: Parallel.ROW,
    Parallel.VOCAB: Parallel.VOCAB, Parallel.QKV: Parallel.COLUMN, Parallel.GATED_FC1: Parallel.COLUMN}
#: The TensorRT-LLM config fields that count the query and key/value heads of ``[q; k; v]``.
HEADS = ("num_attention_heads", "num_key_value_heads", "num_key_value_heads")
#: Calibration reference of a quantized linear: a NeMo tensor and which of its parts (None: all).
Ref = tuple[str, "int | None"]


@dataclass(frozen=True)
class OutSpec:
    """One TensorRT-LLM output of a task: how ranks split it and what happens to it.

    :param kind: ``COLUMN`` (dim 0), ``ROW`` (dim 1), ``VOCAB`` (dim 0, zero-padded to a
        multiple of TP) or ``REPLICATED`` — of each expert when ``experts``.
    :param sections: ``"qkv"``: the rows are ``[q; k; v]`` (sizes from the heads), split one
        by one so rank r holds ``[q_r; k_r; v_r]``; ``"halves"``: two equal parts
        (``[up; gate]``), likewise; None: one part.
    :param experts: dim 0 holds a layer's experts: expert parallelism takes the rank's
        experts, tensor parallelism splits each.
    :param quantize: a linear weight the algorithm quantizes.
    :param dtype: a dtype kept whatever the checkpoint's (the MoE router's float32).
    :param refs: the NeMo tensors (and part) whose HF modules' statistics calibrate it.
    :param keep: a linear TensorRT-LLM must not quantize (listed in ``exclude_modules``).
    """

    kind: Parallel
    sections: str | None = None
    experts: bool = False
    quantize: bool = False
    dtype: str | None = None
    refs: tuple[Ref, ...] = ()
    keep: bool = False


@dataclass
class TrtTask(Task):
    """A planner task that makes TensorRT-LLM tensors, with its place in the rank files."""

    row: int = 0                        # the table row: the write order within a layer
    layer: int | None = None            # the global layer; None outside the decoder layers
    stage: str | None = None            # "first" / "last" for tensors outside the layers
    specs: tuple[OutSpec, ...] = ()     # one per output


def _parts_of(t: torch.Tensor, kind: Parallel, geometry: dict[str, int] | None) -> list[torch.Tensor]:
    """A NeMo tensor's parts along dim 0 by its tensor-parallel kind (views)."""
    if kind is Parallel.GATED_FC1:
        return [materialize(p) for p in ops.split_gated(t)]
    if kind is Parallel.QKV and geometry is not None:
        return [materialize(p) for p in ops.split_qkv_lazy(t, **geometry)]
    return [t]


def _in_order(parts: list[torch.Tensor], order: tuple[int, ...] | None) -> torch.Tensor:
    import torch
    chosen = parts if order is None else [parts[j] for j in order]
    return chosen[0] if len(chosen) == 1 else torch.cat(chosen, dim=0)


@dataclass(frozen=True)
class Projected(Rule):
    """One row of a TensorRT-LLM table as a rule: NeMo tensor(s) → TensorRT-LLM tensor(s).

    Planned out of NeMo only (``to_hf``; its ``hf`` side is TensorRT-LLM's). A row whose NeMo
    tensor the family does not make for this config (``kinds`` has every one it makes) writes
    nothing, and every task is optional; a ``shares`` row consumes nothing (it writes a copy
    of a tensor another row writes).
    """

    hf_fields: ClassVar[tuple[str, ...]] = ("target",)
    nemo_fields: ClassVar[tuple[str, ...]] = ("nemo",)

    nemo: str
    target: tuple[str, ...]
    row: TrtllmName
    index: int
    kinds: dict[str, Parallel] = field(compare=False, hash=False, repr=False)
    geometry: dict[str, int] | None = field(default=None, compare=False, hash=False)
    when: Condition = None

    def _spec(self, kind: Parallel, n_out: int, j: int, nemo_names: Sequence[str]) -> OutSpec:
        split = TRT_SPLIT.get(kind)
        if split is None:
            raise UnsupportedError(f"{self.nemo}: parallel kind {kind.value!r} has no TensorRT-LLM split")
        if n_out > 1 and kind is not Parallel.GATED_FC1:
            raise UnsupportedError(f"{self.nemo}: a {kind.value} tensor has no {n_out} parts for "
                                   f"{', '.join(self.target)}")
        sections = None
        if n_out == 1 and kind is Parallel.QKV:
            sections = "qkv"
        elif n_out == 1 and kind is Parallel.GATED_FC1:
            sections = "halves"
        refs = tuple((n, j if n_out > 1 else None) for n in nemo_names)
        return OutSpec(split, sections, self.row.experts, self.row.quantize, self.row.dtype, refs, self.row.keep)

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        if direction != "to_hf":
            return []  # a target is written out of NeMo; nothing is imported from it
        row, stage = self.row, self.row.stage
        expanded = ctx.expand(self.nemo)
        targets = [ctx.names(t) for t in self.target]
        out: list[Task] = []
        if row.experts:
            per_layer: dict[int | None, list[str]] = {}
            for i, n in expanded:
                per_layer.setdefault(i, []).append(n)
            layer_names = {i: n for i, n in ctx.expand(self.target[0])}
            for i, names in per_layer.items():
                if names[0] not in self.kinds:
                    continue  # the family makes no such tensor for this config (a dense layer)
                kind = self.kinds[names[0]]
                fn = self._stack_fn(kind)
                out.append(TrtTask(tuple(names), (layer_names[i],), fn, (Parallel.REPLICATED,),
                                   label="experts", optional=True, consumes=() if row.shares else None,
                                   row=self.index, layer=i, stage=stage,
                                   specs=(self._spec(kind, 1, 0, names),)))
            return out
        for k, (i, n) in enumerate(expanded):
            if n not in self.kinds:
                continue  # the family makes no such tensor for this config (a bias, a MoE layer's MLP)
            kind = self.kinds[n]
            outs = tuple(t[k] for t in targets)
            fn = self._fn(kind, len(outs))
            out.append(TrtTask((n,), outs, fn, (Parallel.REPLICATED,) * len(outs), label="project",
                               optional=True, consumes=() if row.shares else None, row=self.index, layer=i,
                               stage=stage, specs=tuple(self._spec(kind, len(outs), j, (n,))
                                                        for j in range(len(outs)))))
        return out

    def _fn(self, kind: Parallel, n_out: int) -> Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]:
        order, geo = self.row.order, self.geometry

        def fn(ts: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
            parts = _parts_of(ts[0], kind, geo)
            if n_out > 1:
                if len(parts) != n_out:
                    raise ConfigError(f"{self.nemo}: {len(parts)} parts for {n_out} TensorRT-LLM names")
                return tuple(parts)
            return (_in_order(parts, order) if order is not None or kind is Parallel.QKV else ts[0],)

        return fn

    def _stack_fn(self, kind: Parallel) -> Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]:
        order = self.row.order

        def fn(ts: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
            import torch
            experts = [_in_order(_parts_of(t, kind, None), order) if order is not None else t for t in ts]
            return (torch.stack(experts, dim=0),)

        return fn


@dataclass
class TargetPlan:
    """The planned TensorRT-LLM tensors of one model, in write order, before quantization."""

    table: TrtllmTable
    model_config: dict[str, Any]      # the TensorRT-LLM model fields (the config projection)
    tasks: list[TrtTask]
    dropped: list[str]
    layers: int                       # decoder layers (``{i}`` ranges over them)
    experts: int                      # experts per MoE layer (0: dense)
    exclude_modules: tuple[str, ...]  # linears TensorRT-LLM must leave unquantized (``keep`` rows)


def qkv_geometry(model_config: dict[str, Any]) -> dict[str, int] | None:
    """Heads, KV heads and head size from the TensorRT-LLM model fields, for ``[q; k; v]``."""
    try:
        return {"heads": int(model_config["num_attention_heads"]),
                "groups": int(model_config.get("num_key_value_heads") or model_config["num_attention_heads"]),
                "head_dim": int(model_config["head_size"])}
    except (KeyError, TypeError, ValueError):
        return None


def _count(cfg: dict[str, Any], path: str) -> int:
    return int(cfg_get(cfg, path, 0) or 0)


def plan_target(table: TrtllmTable, cfg: dict[str, Any], model_config: dict[str, Any], source: TensorSource,
                kinds: dict[str, Parallel], drop_nemo: Sequence[str] = ()) -> TargetPlan:
    """Plan ``table`` over ``source`` (NeMo logical tensors) for the NeMo config ``cfg``.

    ``kinds`` are the NeMo tensors' tensor-parallel kinds (the family rules' ``nemo_kinds``),
    ``drop_nemo`` the family's droppable NeMo tensors. Raises the planner's one-line errors
    (a NeMo tensor no row writes, a shape the ops refuse).
    """
    geometry = qkv_geometry(model_config)
    rules: list[Rule] = [Projected(row.nemo, row.trtllm, row, k, kinds, geometry, when=row.when)
                         for k, row in enumerate(table.names)]
    mapping = Mapping(tuple(rules), layers=table.layers, experts=table.experts, drop_nemo=tuple(drop_nemo))
    plan: Plan = plan_conversion(mapping, cfg, source, "to_hf")
    tasks: list[TrtTask] = list(plan.tasks)  # type: ignore[arg-type]  # every rule here makes TrtTasks
    # The write order: the first stage's tensors, the layers (rows in table order), the last's.
    tasks.sort(key=lambda t: ((2 if t.stage == "last" else 0) if t.layer is None else 1, t.layer or 0, t.row))
    keep = []
    for t in tasks:
        for name, spec in zip(t.outputs, t.specs):
            if spec.keep:
                module = name.removesuffix(".weight")
                if t.layer is not None:
                    module = module.replace(f".{t.layer}.", ".*.", 1)
                if module not in keep:
                    keep.append(module)
    return TargetPlan(table, model_config, tasks, plan.dropped, _count(cfg, table.layers),
                      _count(cfg, table.experts), tuple(keep))
