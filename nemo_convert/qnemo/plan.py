"""The plan of a TensorRT-LLM checkpoint, checked before anything is written.

:func:`build_plan` turns a family's :class:`~nemo_convert.qnemo.spec.TrtllmSpec`, the HF
tensor headers and the options (algorithm, TP, PP, dtype, group size) into

* one :class:`Item` per TensorRT-LLM tensor (or quantized linear, or KV-cache scale) and
  layer: its HF sources and its *global* output tensors (name, shape, dtype, split axis);
* one :class:`RankFile` per rank (``rank = pp_rank · tp + tp_rank``) with the exact
  header of ``rank{i}.safetensors``: every name, shape and dtype, in write order.

Every rank shape is computed by running the very slicing function the writer uses
(:func:`slice_for_rank`) on ``meta`` tensors, so headers and data cannot disagree. All
unsupported combinations (TP vs heads, groups, ffn, vocabulary; int4 group size; dtypes;
unmapped or missing tensors; PP vs layers) raise here, in one line, before any output
exists.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_convert.errors import ConfigError, MappingError, ShapeError, UnsupportedError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import Parallel
from nemo_convert.qnemo.spec import TrtllmSpec, TrtTensor
from nemo_convert.quant import trtllm_names as tn
from nemo_convert.quant.algorithms import ALGORITHMS
from nemo_convert.sharding.pipeline import PipelineParallel
from nemo_convert.sharding.tensor import TensorParallel
from nemo_convert.tensors.base import TensorInfo

#: ``--algo`` values: no quantization, then the algorithms of :mod:`nemo_convert.quant`.
ALGOS: tuple[str, ...] = ("none",) + ALGORITHMS
#: Algorithms that need activation statistics from calibration.
CALIBRATED = ("fp8", "int4_awq")
#: Group sizes of TensorRT-LLM's group-wise int4 kernels.
INT4_GROUP_SIZES = (64, 128)
#: TensorRT-LLM's quantized kernels take 16-bit activations.
QUANT_DTYPES = (torch.float16, torch.bfloat16)
DTYPE_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

_TP = TensorParallel()


@dataclass(frozen=True)
class Output:
    """One global (unsplit) output tensor of an item and how ranks split it.

    ``suffix`` is ``""`` for a plain tensor (the item's own name) or the algorithm's
    tensor suffix (``weight``, ``weights_scaling_factor``, …) under the linear's prefix.
    ``sections`` are the dim-0 sizes of the fused sources in this tensor (split one by one
    for column-parallel fused tensors); ``padded_vocab`` the padded rows of a VOCAB tensor.
    """

    suffix: str
    name: str                       # template, ``{i}`` = layer index within the stage
    shape: tuple[int, ...]
    dtype: torch.dtype
    split_dim: int | None
    sections: tuple[int, ...] | None = None
    padded_vocab: int | None = None

    def rank_name(self, local_layer: int | None) -> str:
        return self.name.replace("{i}", str(local_layer)) if local_layer is not None else self.name


@dataclass
class Item:
    """One unit of work: read ``sources`` (HF names), produce ``outputs``.

    ``kind`` is ``"tensor"`` (copied and cast), ``"linear"`` (quantized) or ``"kv"`` (the
    FP8 KV-cache scale, from calibration only). ``modules`` are the HF modules whose
    calibration statistics the item uses.
    """

    kind: str
    key: str                         # unique: the TensorRT-LLM name with the global layer
    spec: TrtTensor | None
    layer: int | None                # global layer index
    local_layer: int | None          # index within the pipeline stage
    stage: int
    sources: tuple[str, ...]
    outputs: list[Output]
    modules: tuple[str, ...] = ()


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
    dropped: list[str] = field(default_factory=list)

    @property
    def needs_calibration(self) -> bool:
        return self.algo in CALIBRATED or self.kv_cache_fp8

    def calibration_modules(self) -> list[str]:
        """HF module names whose statistics calibration must collect."""
        mods: list[str] = []
        for items in self.stages:
            for it in items:
                if (it.kind == "linear" and self.algo in CALIBRATED) or it.kind == "kv":
                    mods.extend(m for m in it.modules if m not in mods)
        return mods

    def items(self) -> list[Item]:
        return [it for items in self.stages for it in items]

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.ranks)

    @property
    def total_tensors(self) -> int:
        return sum(len(r.infos) for r in self.ranks)


def slice_for_rank(t: torch.Tensor, out: Output, tp: int, tp_rank: int) -> torch.Tensor:
    """The part of global tensor ``t`` that TP rank ``tp_rank`` holds (all slicing is
    :meth:`TensorParallel.split`'s; fused column tensors are split source by source)."""
    if out.split_dim is None:
        return t
    if out.padded_vocab is not None:
        return _TP.split(t, Parallel.VOCAB, tp, tp_rank, name=out.name, padded_vocab=out.padded_vocab)
    kind = Parallel.COLUMN if out.split_dim == 0 else Parallel.ROW
    if out.sections is not None and len(out.sections) > 1:
        parts = torch.split(t, list(out.sections), dim=0)
        return ops.concat([_TP.split(p, kind, tp, tp_rank, name=out.name) for p in parts], 0)
    return _TP.split(t, kind, tp, tp_rank, name=out.name)


# ----------------------------------------------------------------------------- outputs
def _linear_outputs(algo: str, spec: TrtTensor, out_f: int, in_f: int, rows: Sequence[int],
                    dtype: torch.dtype, group: int) -> list[Output]:
    """Global outputs of one quantized linear of shape ``[out_f, in_f]`` (HF orientation)."""
    par = "column" if spec.parallel is Parallel.COLUMN else "row"

    def out(suffix: str, shape: tuple[int, ...], dt: torch.dtype, split: int | None) -> Output:
        secs = None
        if split == 0 and spec.parallel is Parallel.COLUMN and len(rows) > 1:
            secs = tuple(r * shape[0] // out_f for r in rows)
        return Output(suffix, f"{spec.prefix}.{suffix}", shape, dt, split, secs)

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
    return [out(s, shapes[s][0], shapes[s][1], tn.tp_split_dim(algo, s, par))  # type: ignore[arg-type]
            for s in tn.LINEAR_TENSORS[algo]]


def _check_linear(algo: str, spec: TrtTensor, layer: int | None, out_f: int, in_f: int,
                  rows: Sequence[int], tp: int, group: int) -> None:
    """One-line errors for int4 shapes the linear cannot take at this TP."""
    if algo not in ("int4_wo", "int4_awq"):
        return
    what = spec.prefix.replace("{i}", str(layer))
    if in_f % group:
        raise UnsupportedError(f"--algo {algo}: {what} has {in_f} input features, not a multiple of the "
                               f"group size {group}; use --group-size 64/128 that divides it, or int8_wo/fp8")
    if spec.parallel is Parallel.ROW and (in_f // tp) % group:
        raise UnsupportedError(f"--algo {algo} with TP {tp}: {what} is row-parallel and each rank gets "
                               f"{in_f}/{tp} = {in_f // tp} input features, not a multiple of the group size "
                               f"{group}; use a smaller TP or group size, or int8_wo/fp8")
    if spec.parallel is Parallel.COLUMN:
        for r in rows:
            if (r // tp) % 2:
                raise UnsupportedError(f"--algo {algo} with TP {tp}: {what} gives each rank {r // tp} output "
                                       "rows of one part; int4 packs output rows in pairs, so it must be even")
    elif out_f % 2:
        raise UnsupportedError(f"--algo {algo}: {what} has an odd number of output features ({out_f}); "
                               "int4 packs output rows in pairs")


def _check_units(spec: TrtTensor, layer: int | None, rows: Sequence[int], cfg: dict[str, Any],
                 tp: int) -> None:
    if spec.parallel is not Parallel.COLUMN or not spec.units:
        return
    if len(spec.units) != len(rows):
        raise ConfigError(f"{spec.name}: {len(spec.units)} unit keys for {len(rows)} sources")
    for key, r, src in zip(spec.units, rows, spec.hf):
        n = cfg.get(key)
        if not isinstance(n, int) or n <= 0:
            raise ConfigError(f"{spec.name}: the TensorRT-LLM config lacks {key!r}")
        if r % n:
            raise ShapeError(f"{src.replace('{i}', str(layer))} has {r} rows, not a multiple of {key}={n}")
        if n % tp:
            raise UnsupportedError(f"TP {tp} does not divide {key}={n}: each TensorRT-LLM rank must hold whole "
                                   f"heads of {spec.name.replace('{i}', str(layer))} (duplicating KV heads for "
                                   "TP > num_key_value_heads is not supported); use a TP that divides it")


def _check_split(spec: TrtTensor, key: str, names: Sequence[str], shape: Sequence[int], rows: Sequence[int],
                 tp: int) -> None:
    """TP must divide a column tensor's rows (each fused part's) and a row tensor's columns."""
    if tp == 1:
        return
    if spec.parallel is Parallel.COLUMN:
        for n, r in zip(names, rows):
            if r % tp:
                raise UnsupportedError(f"TP {tp} does not divide the {r} output rows of {n}, so {key} cannot be "
                                       "split column-parallel; use a TP that divides it")
    elif spec.parallel is Parallel.ROW and (len(shape) < 2 or shape[1] % tp):
        raise UnsupportedError(f"TP {tp} does not divide the {shape[1] if len(shape) > 1 else '?'} input "
                               f"features of {key}, so it cannot be split row-parallel; use a TP that divides it")


# ----------------------------------------------------------------------------- plan
def _fused_shape(spec: TrtTensor, infos: list[TensorInfo]) -> tuple[tuple[int, ...], list[int]]:
    if len(infos) == 1:
        return infos[0].shape, [infos[0].shape[0]] if infos[0].shape else []
    rest = {i.shape[1:] for i in infos}
    if any(len(i.shape) < 1 for i in infos) or len(rest) != 1:
        raise ShapeError(f"{spec.name}: sources {', '.join(i.name for i in infos)} do not concatenate on dim 0 "
                         f"(shapes {[list(i.shape) for i in infos]})")
    rows = [i.shape[0] for i in infos]
    return (sum(rows), *infos[0].shape[1:]), rows


def _expand_drop(patterns: Sequence[str], layers: int) -> list[str]:
    out: list[str] = []
    for p in patterns:
        if "{i}" in p:
            out.extend(p.replace("{i}", str(i)) for i in range(layers))
        else:
            out.append(p)
    return out


def build_plan(spec: TrtllmSpec, model_config: dict[str, Any], infos: dict[str, TensorInfo], *,
               algo: str, tp: int, pp: int, dtype: torch.dtype, group_size: int,
               kv_cache_fp8: bool, pipeline: PipelineParallel | None = None) -> QuantPlan:
    """Check everything and lay out every rank file (see the module docstring)."""
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
    if kv_cache_fp8 and spec.kv_cache is None:
        raise UnsupportedError("this model family declares no KV cache scale, so --kv-cache fp8 is unavailable")
    layers = model_config.get(spec.layers)
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError(f"the TensorRT-LLM config lacks {spec.layers!r}")
    stage_ranges = (pipeline or PipelineParallel()).stage_layers(layers, pp)

    stages: list[list[Item]] = [[] for _ in range(pp)]
    first = [t for t in spec.tensors if not t.per_layer and t.stage != "last"]
    per_layer = [t for t in spec.tensors if t.per_layer]
    last = [t for t in spec.tensors if not t.per_layer and t.stage == "last"]
    consumed: set[str] = set()
    missing: list[str] = []

    def make(t: TrtTensor, layer: int | None, stage: int) -> None:
        names = tuple(h.replace("{i}", str(layer)) for h in t.hf)
        if not all(n in infos for n in names):
            alt = tuple(h.replace("{i}", str(layer)) for h in t.fallback)
            if alt and all(n in infos for n in alt):
                names = alt
            else:
                missing.extend(f"{t.name.replace('{i}', str(layer))} (needs {n})" for n in names if n not in infos)
                return
        consumed.update(names)
        src = [infos[n] for n in names]
        shape, rows = _fused_shape(t, src)
        local = None if layer is None else layer - stage_ranges[stage][0]
        key = t.name.replace("{i}", str(layer)) if layer is not None else t.name
        _check_units(t, layer, rows, model_config, tp)
        _check_split(t, key, names, shape, rows, tp)
        if t.quantize and quantizing:
            if t.parallel not in (Parallel.COLUMN, Parallel.ROW):
                raise ConfigError(f"{t.name}: a quantized linear must be column- or row-parallel")
            if len(shape) != 2:
                raise ShapeError(f"{key}: a quantized linear weight must be 2-D, got {list(shape)}")
            _check_linear(algo, t, layer, shape[0], shape[1], rows, tp, group_size)
            outs = _linear_outputs(algo, t, shape[0], shape[1], rows, dtype, group_size)
            mods = tuple(n.removesuffix(".weight") for n in names)
            stages[stage].append(Item("linear", key, t, layer, local, stage, names, outs, mods))
        else:
            src_dtype = src[0].dtype
            out_dtype = dtype if src_dtype.is_floating_point else src_dtype
            split = {Parallel.COLUMN: 0, Parallel.ROW: 1, Parallel.VOCAB: 0}.get(t.parallel)
            if t.parallel not in (Parallel.COLUMN, Parallel.ROW, Parallel.VOCAB, Parallel.REPLICATED):
                raise UnsupportedError(f"{t.name}: parallel kind {t.parallel.value!r} is not a TensorRT-LLM split")
            if t.parallel is Parallel.ROW and len(rows) > 1:
                raise ConfigError(f"{t.name}: a row-parallel tensor cannot fuse several sources")
            secs = tuple(rows) if t.parallel is Parallel.COLUMN and len(rows) > 1 else None
            # TensorRT-LLM pads the vocabulary to a multiple of TP (lm_head: vocab_size_padded;
            # parallel embedding: ceil(vocab / tp) rows per rank) with zero rows.
            padded = -(-shape[0] // tp) * tp if t.parallel is Parallel.VOCAB else None
            stages[stage].append(Item("tensor", key, t, layer, local, stage, names,
                                      [Output("", t.name, tuple(shape), out_dtype, split, secs, padded)]))

    for t in first:
        make(t, None, 0)
    for s, rng in enumerate(stage_ranges):
        for i in rng:
            for t in per_layer:
                make(t, i, s)
            if kv_cache_fp8 and spec.kv_cache is not None:
                kv = spec.kv_cache
                mods = (kv.k.replace("{i}", str(i)), kv.v.replace("{i}", str(i)))
                out = Output("", kv.name, (1,), torch.float32, None)
                stages[s].append(Item("kv", kv.name.replace("{i}", str(i)), None, i, i - rng[0], s, (),
                                      [out], mods))
    for t in last:
        make(t, None, pp - 1)

    drops = _expand_drop(spec.drop_hf, layers)
    dropped = [k for k in infos if k not in consumed and any(fnmatch.fnmatchcase(k, d) for d in drops)]
    unconsumed = [k for k in infos if k not in consumed and k not in dropped]
    if missing or unconsumed:
        raise MappingError("the checkpoint does not match the family's TensorRT-LLM mapping",
                           unconsumed=unconsumed, unproduced=missing)
    ranks = _lay_out_ranks(stages, tp, pp)
    return QuantPlan(algo, tp, pp, dtype, group_size, kv_cache_fp8, model_config, stages, ranks, dropped)


def _lay_out_ranks(stages: list[list[Item]], tp: int, pp: int) -> list[RankFile]:
    ranks: list[RankFile] = []
    for s in range(pp):
        for r in range(tp):
            rf = RankFile(s * tp + r, r, s)
            seen: set[str] = set()
            for it in stages[s]:
                for out in it.outputs:
                    meta = torch.empty(out.shape, dtype=out.dtype, device="meta")
                    local = slice_for_rank(meta, out, tp, r)
                    name = out.rank_name(it.local_layer)
                    if name in seen:
                        raise MappingError(f"the TensorRT-LLM mapping writes {name} twice")
                    seen.add(name)
                    rf.infos.append(TensorInfo(name, tuple(local.shape), out.dtype))
            ranks.append(rf)
    return ranks
