"""The plan of a TensorRT-LLM checkpoint, checked before anything is written.

:func:`build_plan` takes the target's planned tasks (:mod:`.target`: NeMo logical tensors
→ global TensorRT-LLM tensors, planned by the one planner), *adds the quantization tasks*
(one per quantized linear, after the task that makes its weight; one FP8 KV-cache scale task
per attention) and lays out

* one :class:`Item` per target task (its tasks and every global tensor it writes: name,
  shape, dtype, how ranks split it), grouped by pipeline stage in write order;
* one :class:`RankFile` per rank (``rank = pp_rank · tp + tp_rank``) with the exact header of
  ``rank{i}.safetensors``: every name, shape and dtype, in write order.

Every rank shape is computed by running the very slicing function the writer uses
(:func:`rank_slice`: the registered tensor- and expert-parallel strategies) on ``meta``
tensors, so headers and data cannot disagree. Every unsupported combination (TP vs heads,
ffn, vocabulary; EP vs TP and experts; int4 group size; dtypes; PP vs layers) raises here,
in one line, before any output exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_convert.errors import ConfigError, MappingError, ShapeError, UnsupportedError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import Parallel, Task
from nemo_convert.qnemo.quantizer import CALIBRATED, Linear, Quantizer
from nemo_convert.qnemo.target import HEADS, OutSpec, TargetPlan, TrtTask, qkv_geometry
from nemo_convert.quant import trtllm_names as tn
from nemo_convert.quant.algorithms import ALGORITHMS
from nemo_convert.tensors.base import TensorInfo

#: ``--algo`` values: no quantization, then the algorithms of :mod:`nemo_convert.quant`.
ALGOS: tuple[str, ...] = ("none",) + ALGORITHMS
#: Group sizes of TensorRT-LLM's group-wise int4 kernels.
INT4_GROUP_SIZES = (64, 128)
#: TensorRT-LLM's quantized kernels take 16-bit activations.
QUANT_DTYPES = (torch.float16, torch.bfloat16)
DTYPE_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_NAMED = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

__all__ = ["ALGOS", "CALIBRATED", "DTYPE_NAME", "INT4_GROUP_SIZES", "Item", "Output", "QuantPlan", "RankFile",
           "build_plan", "rank_slice"]


@dataclass(frozen=True)
class Output:
    """One global (unsplit) tensor an item writes, and how ranks split it.

    ``kind`` is ``COLUMN`` (dim 0), ``ROW`` (dim 1), ``VOCAB`` (dim 0, zero-padded to
    ``padded_vocab``) or ``REPLICATED`` — of each expert when ``experts`` (dim 0 then holds
    the layer's experts, split by expert parallelism). ``sections`` are the dim-0 sizes of
    the parts fused in it, split one by one (``[q; k; v]``, ``[up; gate]``).
    """

    name: str                       # the global name (global layer index)
    template: str                   # ``{i}`` = the layer within the pipeline stage
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: Parallel
    sections: tuple[int, ...] | None = None
    padded_vocab: int | None = None
    experts: bool = False

    def rank_name(self, local_layer: int | None) -> str:
        return self.template.replace("{i}", str(local_layer)) if local_layer is not None else self.template


@dataclass
class Item:
    """One unit of writing: a target task and the quantization tasks added after it (or one
    KV-cache scale task), and the global tensors they write, in order."""

    key: str                         # unique: the first TensorRT-LLM name, global layer
    tasks: list[Task]
    outputs: list[Output]
    layer: int | None                # global layer index
    local_layer: int | None          # index within the pipeline stage
    stage: int
    linears: list[Linear] = field(default_factory=list)   # what its quantization tasks quantize


@dataclass
class RankFile:
    rank: int
    tp_rank: int
    pp_rank: int
    infos: list[TensorInfo] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"rank{self.rank}.safetensors"

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.infos)


@dataclass
class QuantPlan:
    """Everything ``quantize`` will write, known before reading any tensor byte."""

    algo: str
    tp: int
    pp: int
    dtype: torch.dtype
    group_size: int
    kv_cache_fp8: bool
    model_config: dict[str, Any]     # the family's TensorRT-LLM model fields
    stages: list[list[Item]]         # items of each pipeline stage, in write order
    ranks: list[RankFile]
    quantizer: Quantizer
    dropped: list[str] = field(default_factory=list)
    ep: int = 1
    experts: int = 0                 # experts per MoE layer (0: a dense model)
    exclude_modules: tuple[str, ...] = tn.DEFAULT_EXCLUDE_MODULES
    kv_of: dict[str, str] = field(default_factory=dict)   # KV-cache scale → the NeMo QKV it measures
    strategies: Any = None

    @property
    def needs_calibration(self) -> bool:
        return self.algo in CALIBRATED or self.kv_cache_fp8

    def items(self) -> list[Item]:
        return [it for items in self.stages for it in items]

    def linears(self) -> list[Linear]:
        return [lin for it in self.items() for lin in it.linears]

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.ranks)

    @property
    def total_tensors(self) -> int:
        return sum(len(r.infos) for r in self.ranks)


def _split_one(t: torch.Tensor, out: Output, n: int, rank: int, tensor: Any) -> torch.Tensor:
    if out.kind is Parallel.REPLICATED or (n == 1 and out.kind is not Parallel.VOCAB):
        return t
    if out.kind is Parallel.VOCAB:
        return tensor.split(t, Parallel.VOCAB, n, rank, name=out.name, padded_vocab=out.padded_vocab)
    if out.sections is not None and len(out.sections) > 1 and out.kind is Parallel.COLUMN:
        parts = torch.split(t, list(out.sections), dim=0)
        return ops.concat([tensor.split(p, Parallel.COLUMN, n, rank, name=out.name) for p in parts], 0)
    return tensor.split(t, out.kind, n, rank, name=out.name)


def rank_slice(t: torch.Tensor, out: Output, plan: QuantPlan, tp_rank: int) -> torch.Tensor:
    """The part of global tensor ``t`` that TP rank ``tp_rank`` holds: the registered tensor-
    parallel strategy's split (fused column tensors part by part); for a layer's experts,
    the registered expert-parallel strategy's experts of the rank's MoE EP rank
    (``tp_rank % ep``), each split for its MoE TP rank (``tp_rank // ep``) over ``tp / ep``
    ranks (``tensorrt_llm/mapping.py``: ``moe_tp_rank``, ``moe_ep_rank``, ``ep_experts``)."""
    tensor = plan.strategies.tensor
    if not out.experts:
        return _split_one(t, out, plan.tp, tp_rank, tensor)
    ep, moe_tp = plan.ep, plan.tp // plan.ep
    mine = plan.strategies.expert.local_experts(t.shape[0], ep, tp_rank % ep) if ep > 1 else range(t.shape[0])
    return torch.stack([_split_one(t[e], out, moe_tp, tp_rank // ep, tensor) for e in mine])


# ----------------------------------------------------------------------------- checks
def _check_linear(algo: str, key: str, kind: Parallel, out_f: int, in_f: int, rows: Sequence[int], tp: int,
                  group: int) -> None:
    """One-line errors for int4 shapes the linear cannot take at this TP."""
    if algo not in ("int4_wo", "int4_awq"):
        return
    if in_f % group:
        raise UnsupportedError(f"--algo {algo}: {key} has {in_f} input features, not a multiple of the "
                               f"group size {group}; use --group-size 64/128 that divides it, or int8_wo/fp8")
    if kind is Parallel.ROW and (in_f // tp) % group:
        raise UnsupportedError(f"--algo {algo} with TP {tp}: {key} is row-parallel and each rank gets "
                               f"{in_f}/{tp} = {in_f // tp} input features, not a multiple of the group size "
                               f"{group}; use a smaller TP or group size, or int8_wo/fp8")
    if kind is Parallel.COLUMN:
        for r in rows:
            if (r // tp) % 2:
                raise UnsupportedError(f"--algo {algo} with TP {tp}: {key} gives each rank {r // tp} output "
                                       "rows of one part; int4 packs output rows in pairs, so it must be even")
    elif out_f % 2:
        raise UnsupportedError(f"--algo {algo}: {key} has an odd number of output features ({out_f}); "
                               "int4 packs output rows in pairs")


def _check_heads(key: str, rows: Sequence[int], model_config: dict[str, Any], tp: int) -> None:
    """Each TensorRT-LLM rank holds whole heads of ``[q; k; v]``."""
    for unit, r in zip(HEADS, rows):
        n = model_config.get(unit)
        if not isinstance(n, int) or n <= 0:
            raise ConfigError(f"{key}: the TensorRT-LLM config lacks {unit!r}")
        if r % n:
            raise ShapeError(f"{key} has {r} rows of {unit}, not a multiple of {unit}={n}")
        if n % tp:
            raise UnsupportedError(f"TP {tp} does not divide {unit}={n}: each TensorRT-LLM rank must hold whole "
                                   f"heads of {key} (duplicating KV heads for TP > num_key_value_heads is not "
                                   "supported); use a TP that divides it")


def _check_split(key: str, kind: Parallel, shape: Sequence[int], rows: Sequence[int], n: int, what: str) -> None:
    """``n`` ranks must divide a column tensor's rows (each fused part's) and a row tensor's columns."""
    if n == 1:
        return
    if kind is Parallel.COLUMN:
        for r in rows:
            if r % n:
                raise UnsupportedError(f"{what} {n} does not divide the {r} output rows of {key}, so it cannot be "
                                       "split column-parallel; use one that divides it")
    elif kind is Parallel.ROW and (len(shape) < 2 or shape[1] % n):
        raise UnsupportedError(f"{what} {n} does not divide the {shape[1] if len(shape) > 1 else '?'} input "
                               f"features of {key}, so it cannot be split row-parallel; use one that divides it")


# ----------------------------------------------------------------------------- plan
def _rows(spec: OutSpec, shape: Sequence[int], model_config: dict[str, Any], key: str) -> tuple[int, ...]:
    """The dim-0 sizes of the parts fused in one tensor (of each expert)."""
    if not shape:
        return ()
    if spec.sections == "qkv":
        geo = qkv_geometry(model_config)
        if geo is None:
            raise ConfigError(f"{key}: the TensorRT-LLM config lacks the heads of [q; k; v]")
        rows = (geo["heads"] * geo["head_dim"], geo["groups"] * geo["head_dim"], geo["groups"] * geo["head_dim"])
        if sum(rows) != shape[0]:
            raise ShapeError(f"{key} has {shape[0]} rows, but the heads imply {' + '.join(map(str, rows))}")
        return rows
    if spec.sections == "halves":
        return (shape[0] // 2, shape[0] // 2)
    return (shape[0],)


def _linear_outputs(algo: str, template: str, key: str, spec: OutSpec, shape: tuple[int, ...],
                    rows: tuple[int, ...], dtype: torch.dtype, group: int, experts: int) -> list[Output]:
    """The global outputs of one quantized linear of ``shape`` (``[out, in]``, or
    ``[E, out, in]`` for a layer's experts)."""
    lead = shape[:1] if experts else ()
    out_f, in_f = shape[-2], shape[-1]
    par = "column" if spec.kind is Parallel.COLUMN else "row"
    prefix, tprefix = key, template.removesuffix(".weight")

    def out(suffix: str, local: tuple[int, ...], dt: torch.dtype, split: int | None, per_expert: bool = True) -> Output:
        kind = {0: Parallel.COLUMN, 1: Parallel.ROW, None: Parallel.REPLICATED}[split]
        secs = tuple(r * local[0] // out_f for r in rows) if split == 0 and len(rows) > 1 else None
        full = (*lead, *local) if per_expert else local
        return Output(f"{prefix}.{suffix}", f"{tprefix}.{suffix}", full, dt, kind, secs,
                      experts=bool(experts) and per_expert)

    col_row = (0, 1)[par == "row"]
    if algo in ("none", "int8_wo"):
        # W8A16 is written as the float weight on the int8 grid (docs/quantization.md):
        # TensorRT-LLM quantizes it itself with the same per-channel amax/127 rule.
        return [out("weight", (out_f, in_f), dtype, col_row)]
    if algo in ("int4_wo", "int4_awq"):
        shapes = {"weight": ((out_f // 2, in_f), torch.int8),
                  "weights_scaling_factor": ((out_f, in_f // group), dtype),
                  "prequant_scaling_factor": ((in_f,), dtype)}
    elif algo == "fp8":
        shapes = {"weight": ((out_f, in_f), torch.float8_e4m3fn),
                  "weights_scaling_factor": ((1,), torch.float32),
                  "activation_scaling_factor": ((1,), torch.float32)}
    else:  # pragma: no cover - guarded by the caller
        raise UnsupportedError(f"unknown algorithm {algo!r}")
    # One activation scale for all of a layer's experts (TensorRT-LLM's MoE layer: (1,)).
    return [out(s, shapes[s][0], shapes[s][1], tn.tp_split_dim(algo, s, par),  # type: ignore[arg-type]
                per_expert=not (experts and s == "activation_scaling_factor"))
            for s in tn.LINEAR_TENSORS[algo]]


def _quantize_task(weight: str, outputs: list[Output], lin: Linear, quantizer: Quantizer) -> Task:
    """The quantization task added after the task making ``weight``."""
    def quantize(ts: Sequence[Any]) -> Any:
        return quantizer.linear(lin, ts[0])

    return Task((weight,), tuple(o.name for o in outputs), quantize, (Parallel.REPLICATED,) * len(outputs),
                label="quantize")


def build_plan(target: TargetPlan, *, algo: str, tp: int, pp: int, dtype: torch.dtype, group_size: int,
               kv_cache_fp8: bool, strategies: Any, ep: int = 1, kv_parts: dict[str, int] | None = None,
               quantizer: Quantizer | None = None) -> QuantPlan:
    """Add the quantization tasks to the target's, check everything and lay out every rank
    file (see the module docstring). ``kv_parts``: for each NeMo tensor a KV-cache scale is
    measured from, how many HF parts it is made of (its origin: q, k, v)."""
    model_config = target.model_config
    if algo not in ALGOS:
        raise UnsupportedError(f"unknown --algo {algo!r}; expected one of {', '.join(ALGOS)}")
    if tp < 1 or pp < 1:
        raise UnsupportedError(f"TP and PP must be ≥ 1, got TP {tp}, PP {pp}")
    quantizing = algo != "none"
    if (quantizing or kv_cache_fp8) and dtype not in QUANT_DTYPES:
        what = f"--algo {algo}" if quantizing else "--kv-cache fp8"
        raise UnsupportedError(f"{what} needs a float16 or bfloat16 checkpoint (TensorRT-LLM's quantized kernels "
                               f"take 16-bit activations), but the dtype is {DTYPE_NAME.get(dtype, dtype)}; "
                               "pass --dtype bf16 or fp16")
    if algo in ("int4_wo", "int4_awq") and group_size not in INT4_GROUP_SIZES:
        raise UnsupportedError(f"--algo {algo}: group size {group_size} is not one TensorRT-LLM's int4 kernels "
                               f"take ({' or '.join(map(str, INT4_GROUP_SIZES))})")
    table = target.table
    if kv_cache_fp8 and (table.kv_cache is None or table.kv_of is None):
        raise UnsupportedError("this model family declares no KV cache scale, so --kv-cache fp8 is unavailable")
    _check_ep(ep, tp, target.experts, strategies)
    layers = model_config.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError("the TensorRT-LLM config lacks 'num_hidden_layers'")
    stage_ranges = strategies.pipeline.stage_layers(layers, pp)
    stage_of = {i: s for s, rng in enumerate(stage_ranges) for i in rng}
    quantizer = quantizer or Quantizer(algo, dtype, group_size, tp, ep)
    stages: list[list[Item]] = [[] for _ in range(pp)]
    kv_of: dict[str, str] = {}

    pending: Item | None = None   # the KV-cache scale of the layer being laid out: after its last tensor
    for t in target.tasks:
        stage = (pp - 1 if t.stage == "last" else 0) if t.layer is None else stage_of[t.layer]
        local = None if t.layer is None else t.layer - stage_ranges[stage][0]
        if pending is not None and pending.layer != t.layer:
            stages[pending.stage].append(pending)
            pending = None
        item = Item(t.outputs[0], [t], [], t.layer, local, stage)
        row = table.names[t.row]
        for name, info, spec, template in zip(t.outputs, t.infos, t.specs, row.trtllm):
            _add_output(item, name, template, info, spec, target, quantizer, algo=algo, tp=tp, ep=ep,
                        dtype=dtype, group=group_size)
        stages[stage].append(item)
        if kv_cache_fp8 and t.layer is not None and table.kv_cache is not None and \
                table.kv_of is not None and t.inputs[0] == table.kv_of.replace("{i}", str(t.layer)):
            pending = _kv_item(t, table.kv_cache, local, stage, quantizer, kv_parts or {}, kv_of)
    if pending is not None:
        stages[pending.stage].append(pending)

    plan = QuantPlan(algo, tp, pp, dtype, group_size, kv_cache_fp8, model_config, stages, [], quantizer,
                     target.dropped, ep, target.experts, tn.DEFAULT_EXCLUDE_MODULES + target.exclude_modules,
                     kv_of, strategies)
    plan.ranks = _lay_out_ranks(plan)
    return plan


def _check_ep(ep: int, tp: int, experts: int, strategies: Any) -> None:
    if ep == 1:
        return
    if strategies.expert is None:
        raise UnsupportedError(f"expert-parallel size {ep}: no expert-parallel sharding strategy is installed")
    if not experts:
        raise UnsupportedError(f"--ep {ep} for a model without experts (num_moe_experts unset)")
    if ep < 1 or tp % ep:
        raise UnsupportedError(f"--ep {ep} must divide --tp {tp}: TensorRT-LLM splits each TP group into "
                               f"moe_ep_size × moe_tp_size ranks (tp_size = moe_tp_size · moe_ep_size)")
    strategies.expert.check(experts, ep)


def _add_output(item: Item, name: str, template: str, info: TensorInfo, spec: OutSpec, target: TargetPlan,
                quantizer: Quantizer, *, algo: str, tp: int, ep: int, dtype: torch.dtype, group: int) -> None:
    shape = tuple(info.shape)
    experts = shape[0] if spec.experts else 0
    each = shape[1:] if experts else shape
    ranks = tp // ep if experts else tp
    what = "MoE TP (TP / EP)" if experts and ep > 1 else "TP"
    rows = _rows(spec, each, target.model_config, name)
    if spec.sections == "qkv":
        _check_heads(name, rows, target.model_config, tp)
    _check_split(name, spec.kind, each, rows, ranks, what)
    if spec.quantize and algo != "none":
        if spec.kind not in (Parallel.COLUMN, Parallel.ROW):
            raise ConfigError(f"{name}: a quantized linear must be column- or row-parallel")
        if len(each) != 2:
            raise ShapeError(f"{name}: a quantized linear weight must be 2-D, got {list(each)}")
        if experts and algo == "int4_awq":
            raise UnsupportedError(f"--algo int4_awq: {name} holds a layer's experts, and TensorRT-LLM's MoE layer "
                                   "takes one prequant_scaling_factor for all of them (modeling_utils.py "
                                   "preprocess_perlayer_weights keeps expert 0's), so per-expert AWQ scales cannot be "
                                   "written; use int4_wo, int8_wo or fp8")
        key = name.removesuffix(".weight")
        _check_linear(algo, key, spec.kind, each[0], each[1], rows, ranks, group)
        outs = _linear_outputs(algo, template, key, spec, shape, rows, dtype, group, experts)
        lin = Linear(key, spec.kind, rows, experts, spec.refs)
        item.tasks.append(_quantize_task(name, outs, lin, quantizer))
        item.linears.append(lin)
        item.outputs.extend(outs)
        return
    src_dtype = info.dtype
    out_dtype = _NAMED[spec.dtype] if spec.dtype else (dtype if src_dtype.is_floating_point else src_dtype)
    if spec.kind is Parallel.ROW and len(rows) > 1:
        raise ConfigError(f"{name}: a row-parallel tensor cannot fuse several parts")
    # TensorRT-LLM pads the vocabulary to a multiple of TP (lm_head: vocab_size_padded;
    # parallel embedding: ceil(vocab / tp) rows per rank) with zero rows.
    padded = -(-shape[0] // tp) * tp if spec.kind is Parallel.VOCAB else None
    secs = rows if spec.kind is Parallel.COLUMN and len(rows) > 1 else None
    item.outputs.append(Output(name, template, shape, out_dtype, spec.kind, secs, padded, bool(experts)))


def _kv_item(t: TrtTask, template: str, local: int | None, stage: int, quantizer: Quantizer,
             kv_parts: dict[str, int], kv_of: dict[str, str]) -> Item:
    """The FP8 KV-cache scale task of ``t``'s attention (its K and V parts' output amax)."""
    qkv = t.inputs[0]
    if kv_parts.get(qkv, 3) != 3:
        raise UnsupportedError(f"--kv-cache fp8: {qkv} is not made of separate q, k and v projections, so the K and V "
                               "output ranges cannot be calibrated")
    name = template.replace("{i}", str(t.layer))
    kv_of[name] = qkv
    out = Output(name, template, (1,), torch.float32, Parallel.REPLICATED)
    def kv_scale(ts: Sequence[Any], n: str = name) -> Any:
        return (quantizer.kv_scale(n),)

    task = Task((), (name,), kv_scale, (Parallel.REPLICATED,), label="kv_cache_scale")
    return Item(name, [task], [out], t.layer, local, stage)


def _lay_out_ranks(plan: QuantPlan) -> list[RankFile]:
    ranks: list[RankFile] = []
    for s in range(plan.pp):
        for r in range(plan.tp):
            rf = RankFile(s * plan.tp + r, r, s)
            seen: set[str] = set()
            for it in plan.stages[s]:
                for out in it.outputs:
                    meta = torch.empty(out.shape, dtype=out.dtype, device="meta")
                    local = rank_slice(meta, out, plan, r)
                    name = out.rank_name(it.local_layer)
                    if name in seen:
                        raise MappingError(f"the TensorRT-LLM mapping writes {name} twice")
                    seen.add(name)
                    rf.infos.append(TensorInfo(name, tuple(local.shape), out.dtype))
            ranks.append(rf)
    return ranks
