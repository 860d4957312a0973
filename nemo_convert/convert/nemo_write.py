"""Writing a ``.nemo`` from a plan: config, artifacts and weights in any layout and TP×PP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from nemo_convert.compute import CPU, Compute
from nemo_convert.convert.common import SECTION, dir_sink
from nemo_convert.convert.nemo_defaults import complete_nemo_config
from nemo_convert.families.nemo_runtime import RuntimeDefaults
from nemo_convert.engine import NoProgress, Progress, RunStats, merge_stats, run_plan
from nemo_convert.errors import InputError, UnsupportedError
from nemo_convert.formats.dist_checkpoint.sections import sectioned
from nemo_convert.formats.nemo.nemo import CONFIG_MEMBER, dump_yaml
from nemo_convert.formats.nemo.nemo_ranks import WEIGHTS, RankWeightsWriter
from nemo_convert.formats.nemo.nemo_weights import (DistLayout, DistWeightsWriter, LegacyWeightsWriter, dist_layout,
                                                     finish_dist)
from nemo_convert.formats.io.sink import DirectorySink, MemberSink
from nemo_convert.formats.io.staging import staged_output
from nemo_convert.formats.io.tar_writer import TarWriter
from nemo_convert.mapping.ops import padded_vocab_size
from nemo_convert.mapping.planner import Plan
from nemo_convert.mapping.rules import Kind, Parallel
from nemo_convert.sharding.layout import ParallelLayout, embedding_on_last_stage, rank_dir
from nemo_convert.sharding.protocol import Strategies, TensorSharding
from nemo_convert.spec import query_groups, recorded_vocab
from nemo_convert.tensors.base import TensorSource
from nemo_convert.tokenizers.sentencepiece_patch import sentencepiece_vocab_size
from nemo_convert.workers import SINGLE, Workers, split_balanced, write_together



def write_rank_file(sink: MemberSink, plan: Plan, source: TensorSource, layout: ParallelLayout,
                    kinds: dict[str, Kind], *, pp_rank: int, tp_rank: int, padded_vocab: int | None,
                    tensor_parallel: TensorSharding, progress: Progress | None = None,
                    lazy: bool = False) -> RunStats:
    """Run the part of ``plan`` that stage ``pp_rank`` needs and write TP rank ``tp_rank``'s
    slices (split by ``tensor_parallel``, the registry's strategy) into its folder's
    ``model_weights.ckpt``."""
    p, t = pp_rank, tp_rank
    tasks = [task for task in plan.tasks if task.outputs and any(p in layout.stages_of(o) for o in task.outputs)]
    with sink.open_member(f"{rank_dir(t, p, layout.pp)}/{WEIGHTS}") as stream:
        writer = RankWeightsWriter(stream, layout, kinds, pp_rank=p, tp_rank=t, padded_vocab=padded_vocab,
                                   tensor_parallel=tensor_parallel)
        stats = run_plan(Plan(plan.direction, tasks, plan.dropped, plan.check_finite), source, writer.write,
                         progress=progress, own_progress=False, lazy=lazy)
        writer.close()
    return stats

@dataclass(frozen=True)
class Parallelism:
    """The target TP×PP×EP (and optional explicit pipeline stage sizes)."""

    tp: int = 1
    pp: int = 1
    stage_layers: tuple[int, ...] | None = None
    ep: int = 1


def check_geometry(cfg: dict[str, Any], plan: Plan, kinds: dict[str, Kind], par: Parallelism,
                   padded_vocab: int | None, strategies: Strategies, layout: str = "dist") -> ParallelLayout:
    """Fail with a clear message, before anything is written, when TP/PP/EP cannot split the model."""
    tp, pp = par.tp, par.pp
    if strategies.expert is not None:
        strategies.expert.check(cfg.get("num_moe_experts"), par.ep, layout=layout)
    elif par.ep != 1:
        raise UnsupportedError(f"expert-parallel size {par.ep}: no expert-parallel sharding strategy is installed")
    if tp < 1 or pp < 1:
        raise UnsupportedError(f"tensor- and pipeline-parallel sizes must be at least 1 (got TP={tp}, PP={pp})")
    heads, groups = cfg.get("num_attention_heads"), query_groups(cfg)
    if heads and heads % tp:
        raise UnsupportedError(f"tensor-parallel size {tp} does not divide num_attention_heads={heads}")
    if groups and groups % tp and tp % groups:
        raise UnsupportedError(f"tensor-parallel size {tp} and num_query_groups={groups}: each must divide the other")
    ffn = cfg.get("ffn_hidden_size")
    if ffn and ffn % tp:
        raise UnsupportedError(f"tensor-parallel size {tp} does not divide ffn_hidden_size={ffn}")
    checked: set[tuple[tuple[int, ...], Kind]] = set()
    for info in plan.outputs():
        kind = kinds.get(info.name, Parallel.REPLICATED)
        if (info.shape, kind) in checked:  # the split sees only the shape and kind: every expert once
            continue
        checked.add((info.shape, kind))
        strategies.tensor.local_shape(info.shape, kind, tp,
                                      padded_vocab=padded_vocab if kind is Parallel.VOCAB else None)
    layers = int(cfg.get("num_layers") or 0)
    return ParallelLayout.make(layers, tp, pp, stage_sizes=par.stage_layers,
                               tied=embedding_on_last_stage(cfg),
                               pipeline=strategies.pipeline)


def vocab_sizes(cfg: dict[str, Any], plan: Plan, kinds: dict[str, Kind], tp: int) -> tuple[int | None, int | None]:
    """The unpadded vocabulary (rows of the vocab-parallel tensors) and its padded size at ``tp``."""
    rows = [i.shape[0] for i in plan.outputs() if kinds.get(i.name) is Parallel.VOCAB]
    if not rows:
        return None, None
    vocab = recorded_vocab(cfg) or min(rows)
    return vocab, padded_vocab_size(vocab, int(cfg.get("make_vocab_size_divisible_by") or 1), tp)


def override_vocab_size(cfg: dict[str, Any], artifacts: Sequence[tuple[str, bytes]], vocab: int,
                        padded: int) -> None:
    """Write ``override_vocab_size`` where NeMo would size the embedding wrongly.

    NeMo sizes the embedding from its tokenizer, ``tokenizer.vocab_size`` (a SentencePiece
    model's piece count) padded to ``make_vocab_size_divisible_by`` × TP, unless the config
    sets ``override_vocab_size``, which it uses as the size itself (NVIDIA/NeMo 379b8767,
    ``megatron_base_model.py`` L623-645 ``_build_vocab`` / ``_vocab_size_with_padding``;
    ``megatron_gpt_model.py`` L501, L522). When the SentencePiece tokenizer's piece count
    is not the model's ``vocab``, the override is the rows we store (``padded``: ``vocab``
    at TP 1); when they agree NeMo's own sizing gives those rows and the key is removed.
    Without a SentencePiece model among ``artifacts`` the config is left as it is."""
    tok = cfg.get("tokenizer")
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, str) or str(tok.get("library", "")).lower() != "sentencepiece":  # type: ignore[union-attr]
        return
    data = dict(artifacts).get(model[len("nemo:"):] if model.startswith("nemo:") else model)
    if data is None:
        return
    try:
        pieces = sentencepiece_vocab_size(data)
    except InputError:
        return
    if pieces != vocab:
        cfg["override_vocab_size"] = padded
    else:
        cfg.pop("override_vocab_size", None)


@dataclass
class WeightPart:
    """One output file of the weights (a dist data file, a rank's ``model_weights.ckpt``, …):
    the unit of work a process owns."""

    member: str
    write: Callable[[MemberSink, Progress | None], tuple[RunStats, Any]]
    nbytes: int


#: Target size of one dist-checkpoint data file. Always at least two files (as Megatron
#: writes), so that several processes share even a small model.
DIST_PART_BYTES = 1 << 30


def weight_parts(layout: str, plan: Plan, source: TensorSource, kinds: dict[str, Kind],
                 playout: ParallelLayout, padded: int | None, strategies: Strategies,
                 unstacked: tuple[str, ...] = (), compute: Compute = CPU,
                 extra_states: tuple[str, ...] = ()) -> list[WeightPart]:
    """The output parts of the weights, defined by the plan alone (never by the number of
    processes), in archive order. ``plan`` is placed on ``compute``'s device already; the
    per-rank writer's splits are placed here."""
    infos = plan.outputs()
    lazy = not compute.active  # our writers take deferred pieces; device runs hand back tensors
    if layout == "dist":
        sizes = [t.out_bytes for t in plan.tasks]
        groups = split_balanced(sizes, max(2, -(-sum(sizes) // DIST_PART_BYTES)))
        shared: list[DistLayout] = []  # computed once, by the first part written

        sections = sectioned(kinds)

        def dist_writer(sink: MemberSink, data_file: str) -> DistWeightsWriter:
            if not shared and not sections:  # a sectioned layout is the writer's own (split infos)
                shared.append(dist_layout(infos, tuple(unstacked)))
            return DistWeightsWriter(sink, infos, data_file=data_file, unstacked=unstacked, sections=sections,
                                     extra_states=extra_states, layout=shared[0] if shared else None)
        parts = []
        for k, idx in enumerate(groups):
            sub = Plan(plan.direction, [plan.tasks[i] for i in idx], plan.dropped, plan.check_finite)

            def write(sink: MemberSink, progress: Progress | None, sub: Plan = sub, k: int = k) -> tuple[RunStats, Any]:
                w = dist_writer(sink, f"__{k}_0.distcp")
                try:
                    stats = run_plan(sub, source, w.write, progress=progress, own_progress=False, lazy=lazy)
                except BaseException as exc:
                    w.abort(exc)
                    raise
                return stats, w.close(finalize=False)
            parts.append(WeightPart(f"model_weights/__{k}_0.distcp", write, sub.total_bytes))

        def extras(sink: MemberSink, progress: Progress | None) -> tuple[RunStats, Any]:
            w = dist_writer(sink, f"__{len(groups)}_0.distcp")
            w.add_extra_states()
            return RunStats(), w.close(finalize=False)
        parts.append(WeightPart(f"model_weights/__{len(groups)}_0.distcp", extras, 0))
        return parts
    if playout.tp * playout.pp > 1:
        splitter = compute.tensor_parallel(strategies.tensor)
        parts = []
        for p, t, folder in playout.rank_dirs():
            def write_rank(sink: MemberSink, progress: Progress | None, p: int = p, t: int = t) -> tuple[RunStats, Any]:
                return write_rank_file(sink, plan, source, playout, kinds, pp_rank=p, tp_rank=t,
                                       padded_vocab=padded, progress=progress,
                                       tensor_parallel=splitter, lazy=lazy), None
            nbytes = sum(t.out_bytes for t in plan.tasks if any(p in playout.stages_of(o) for o in t.outputs))
            parts.append(WeightPart(f"{folder}/{WEIGHTS}", write_rank, nbytes))
        return parts

    def write_single(sink: MemberSink, progress: Progress | None) -> tuple[RunStats, Any]:
        w = LegacyWeightsWriter(sink, infos)
        stats = run_plan(plan, source, w.write, progress=progress, own_progress=False, lazy=lazy)
        w.close()
        return stats, None
    return [WeightPart(WEIGHTS, write_single, plan.total_bytes)]


def write_nemo(out: str, cfg: dict[str, Any], plan: Plan, source: TensorSource, *, layout: str,
               kinds: dict[str, Kind], par: Parallelism = Parallelism(), overwrite: bool = False,
               packed: bool = True, progress: Progress | None = None,
               artifacts: Sequence[tuple[str, bytes]] = (), workers: Workers = SINGLE,
               unstacked: tuple[str, ...] = (), strategies: Strategies, compute: Compute = CPU,
               extra_states: tuple[str, ...] = (),
               runtime_defaults: Mapping[str, RuntimeDefaults] | None = None) -> RunStats:
    """Stage and write a complete ``.nemo`` (config, artifacts, weights) at ``out``.

    ``cfg`` is completed with the parallel sizes and vocabulary sizes, and with the keys
    NeMo's target class reads at construction that it lacks
    (:func:`nemo_convert.convert.nemo_defaults.complete_nemo_config`, with the family's own
    ``runtime_defaults`` for its class: :func:`~nemo_convert.convert.nemo_defaults.declared_by`); ``artifacts`` are
    ``(member name, bytes)`` pairs already referenced from ``cfg``. With several
    ``workers`` each process writes the weight parts it owns and process 0 the rest;
    the result is byte-identical to a one-process run. ``strategies`` are the registry's
    sharding strategies (``Registry.strategies()``). The transforms that build new
    tensors run on ``compute``'s device (:mod:`nemo_convert.compute`); the output dtypes
    of ``plan`` must be final.
    """
    vocab, padded = vocab_sizes(cfg, plan, kinds, par.tp)
    playout = check_geometry(cfg, plan, kinds, par, padded, strategies, layout)
    cfg["tensor_model_parallel_size"] = par.tp
    cfg["pipeline_model_parallel_size"] = par.pp
    if cfg.get("num_moe_experts"):
        cfg["expert_model_parallel_size"] = par.ep
    ours = cfg.setdefault(SECTION, {})
    if vocab is not None and padded is not None:
        ours["vocab_size"] = vocab
        ours["padded_vocab_size"] = padded
        override_vocab_size(cfg, artifacts, vocab, padded)
    if par.stage_layers is not None:
        ours["pipeline_stage_layers"] = list(par.stage_layers)
    complete_nemo_config(cfg, runtime_defaults or {})
    cfg[SECTION] = cfg.pop(SECTION)  # our section stays last, after NeMo's keys
    parts = weight_parts(layout, compute.place(plan, source), source, kinds, playout, padded, strategies,
                         unstacked, compute, extra_states)
    progress = progress or NoProgress()
    mine = [p for i, p in enumerate(parts) if workers.owns(i)]
    progress.start("write", sum(p.nbytes for p in mine), 0)
    try:
        if workers.world == 1:
            return _write_alone(out, cfg, parts, layout, overwrite, packed, progress, artifacts)
        return _write_together(out, cfg, parts, layout, overwrite, packed, progress, artifacts, workers)
    finally:
        progress.finish()
        compute.release()


def _write_alone(out: str, cfg: dict[str, Any], parts: list[WeightPart], layout: str, overwrite: bool,
                 packed: bool, progress: Progress, artifacts: Sequence[tuple[str, bytes]]) -> RunStats:
    with staged_output(out, overwrite=overwrite, is_dir=not packed, kind="nemo") as stage:
        with (TarWriter(stage) if packed else dir_sink(stage)) as sink:
            for name, data in artifacts:
                sink.add_bytes(name, data)
            sink.add_bytes(CONFIG_MEMBER, dump_yaml(cfg))
            results = [part.write(sink, progress) for part in parts]
            if layout == "dist":
                finish_dist(sink, [rec for _, rec in results])
    return merge_stats([st for st, _ in results], sequential=True)


def _write_together(out: str, cfg: dict[str, Any], parts: list[WeightPart], layout: str, overwrite: bool,
                    packed: bool, progress: Progress, artifacts: Sequence[tuple[str, bytes]],
                    workers: Workers) -> RunStats:
    """Every process writes its parts as files in a shared staging folder; process 0 then
    adds the artifacts and config, the parts (streamed into the tar in archive order for a
    packed ``.nemo``) and the dist metadata (:func:`nemo_convert.workers.write_together`)."""

    def write_mine(sink: DirectorySink) -> dict[int, tuple[RunStats, Any]]:
        return {i: part.write(sink, progress) for i, part in enumerate(parts) if workers.owns(i)}

    def head(final: MemberSink) -> None:
        for name, data in artifacts:
            final.add_bytes(name, data)
        final.add_bytes(CONFIG_MEMBER, dump_yaml(cfg))

    def tail(final: MemberSink, results: list[dict[int, tuple[RunStats, Any]]]) -> None:
        if layout == "dist":
            merged = {i: r for d in results for i, r in d.items()}
            finish_dist(final, [merged[i][1] for i in range(len(parts))])

    results = write_together(out, [p.member for p in parts], write_mine, workers=workers, overwrite=overwrite,
                             packed=packed, kind="nemo", head=head, tail=tail)
    merged = {i: r for d in results for i, r in d.items()}
    return merge_stats([merged[i][0] for i in range(len(parts))], sequential=False)
