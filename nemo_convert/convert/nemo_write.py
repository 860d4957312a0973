"""Writing a ``.nemo`` from a plan: config, artifacts and weights in any layout and TP×PP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from nemo_convert.convert.common import SECTION, dir_sink
from nemo_convert.engine import Progress, RunStats, run_plan
from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.nemo import CONFIG_MEMBER, dump_yaml
from nemo_convert.formats.nemo_ranks import write_per_rank
from nemo_convert.formats.nemo_weights import make_weights_writer
from nemo_convert.formats.staging import staged_output
from nemo_convert.formats.tar_writer import TarWriter
from nemo_convert.mapping.ops import padded_vocab_size
from nemo_convert.mapping.planner import Plan
from nemo_convert.mapping.rules import Parallel
from nemo_convert.sharding.layout import ParallelLayout
from nemo_convert.sharding.tensor import TensorParallel
from nemo_convert.tensors.base import TensorSource


@dataclass(frozen=True)
class Parallelism:
    """The target TP×PP (and optional explicit pipeline stage sizes)."""

    tp: int = 1
    pp: int = 1
    stage_layers: tuple[int, ...] | None = None


def check_geometry(cfg: dict[str, Any], plan: Plan, kinds: dict[str, Parallel], par: Parallelism,
                   padded_vocab: int | None) -> ParallelLayout:
    """Fail with a clear message, before anything is written, when TP/PP cannot split the model."""
    tp, pp = par.tp, par.pp
    heads, groups = cfg.get("num_attention_heads"), cfg.get("num_query_groups") or cfg.get("num_attention_heads")
    if heads and heads % tp:
        raise UnsupportedError(f"tensor-parallel size {tp} does not divide num_attention_heads={heads}")
    if groups and groups % tp and tp % groups:
        raise UnsupportedError(f"tensor-parallel size {tp} and num_query_groups={groups}: each must divide the other")
    ffn = cfg.get("ffn_hidden_size")
    if ffn and ffn % tp:
        raise UnsupportedError(f"tensor-parallel size {tp} does not divide ffn_hidden_size={ffn}")
    tp_math = TensorParallel()
    for info in plan.outputs():
        kind = kinds.get(info.name, Parallel.REPLICATED)
        tp_math.local_shape(info.shape, kind, tp, padded_vocab=padded_vocab if kind is Parallel.VOCAB else None)
    layers = int(cfg.get("num_layers") or 0)
    return ParallelLayout.make(layers, tp, pp, stage_sizes=par.stage_layers,
                               tied=bool(cfg.get("share_embeddings_and_output_weights")))


def vocab_sizes(cfg: dict[str, Any], plan: Plan, kinds: dict[str, Parallel], tp: int) -> tuple[int | None, int | None]:
    """The unpadded vocabulary (rows of the vocab-parallel tensors) and its padded size at ``tp``."""
    rows = [i.shape[0] for i in plan.outputs() if kinds.get(i.name) is Parallel.VOCAB]
    if not rows:
        return None, None
    vocab = int((cfg.get(SECTION) or {}).get("vocab_size") or min(rows))
    return vocab, padded_vocab_size(vocab, int(cfg.get("make_vocab_size_divisible_by") or 1), tp)


def write_nemo(out: str, cfg: dict[str, Any], plan: Plan, source: TensorSource, *, layout: str,
               kinds: dict[str, Parallel], par: Parallelism = Parallelism(), overwrite: bool = False,
               packed: bool = True, progress: Progress | None = None,
               artifacts: Sequence[tuple[str, bytes]] = ()) -> RunStats:
    """Stage and write a complete ``.nemo`` (config, artifacts, weights) at ``out``.

    ``cfg`` is completed with the parallel sizes and vocabulary sizes; ``artifacts`` are
    ``(member name, bytes)`` pairs already referenced from ``cfg``.
    """
    vocab, padded = vocab_sizes(cfg, plan, kinds, par.tp)
    playout = check_geometry(cfg, plan, kinds, par, padded)
    cfg["tensor_model_parallel_size"] = par.tp
    cfg["pipeline_model_parallel_size"] = par.pp
    ours = cfg.setdefault(SECTION, {})
    if vocab is not None:
        ours["vocab_size"] = vocab
        ours["padded_vocab_size"] = padded
    if par.stage_layers is not None:
        ours["pipeline_stage_layers"] = list(par.stage_layers)
    per_rank = layout == "legacy" and par.tp * par.pp > 1
    with staged_output(out, overwrite=overwrite, is_dir=not packed) as stage:
        with (TarWriter(stage) if packed else dir_sink(stage)) as sink:
            for name, data in artifacts:
                sink.add_bytes(name, data)
            sink.add_bytes(CONFIG_MEMBER, dump_yaml(cfg))
            if per_rank:
                return write_per_rank(sink, plan, source, playout, kinds, padded_vocab=padded, progress=progress)
            writer = make_weights_writer(layout, sink, plan.outputs())
            stats = run_plan(plan, source, writer.write, progress=progress, description="write")
            writer.close()
            return stats
