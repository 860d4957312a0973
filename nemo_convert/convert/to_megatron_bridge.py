"""Writing a Megatron-Bridge checkpoint directory from a plan (``--to megatron-bridge``).

The directory (``/work/shared/reference/megatron-dirs.md``)::

    OUT/latest_checkpointed_iteration.txt     "0" (no newline)
    OUT/latest_train_state.pt                 = iter_0000000/train_state.pt
    OUT/iter_0000000/__0_0.distcp .metadata   torch_dist: keys without ``model.``, layers stacked,
                                              ``_extra_state`` objects ``[None]``
    OUT/iter_0000000/common.pt metadata.json  the megatron-core 0.16 layout (0.19 reads it too)
    OUT/iter_0000000/run_config.yaml          ``model:`` = the family's provider (megatron_config.py)
    OUT/iter_0000000/train_state.pt tokenizer/ nemo_convert.json

The dist layout is TP-independent (global tensors); the target TP × PP is recorded in
``run_config.yaml``. The whole directory is staged beside its target and renamed into
place: it is absent, the old one or the new complete one.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from nemo_convert import __version__
from nemo_convert.convert.common import SECTION
from nemo_convert.convert.nemo_write import Parallelism, Strategies, check_geometry, vocab_sizes
from nemo_convert.engine import NoProgress, Progress, RunStats, run_plan
from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.dist_checkpoint.distckpt_write import write_dist_metadata
from nemo_convert.formats.megatron.megatron_config import nemo_to_provider
from nemo_convert.formats.megatron.providers import ProviderTable
from nemo_convert.formats.megatron.megatron_dir import (
    LATEST_TRAIN_STATE,
    OURS,
    RUN_CONFIG,
    TOKENIZER_DIR,
    TRACKER,
    TRAIN_STATE,
    common_state,
    iter_dir_name,
    train_state_bytes,
)
from nemo_convert.formats.nemo.nemo import dump_yaml
from nemo_convert.formats.dist_checkpoint.sections import sectioned
from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.formats.io.staging import staged_output
from nemo_convert.mapping.planner import Plan
from nemo_convert.mapping.rules import Kind
from nemo_convert.spec import dtype_name_of_precision, provenance_of, recorded_vocab, spec_of
from nemo_convert.tensors.base import TensorSource

TARGET = "megatron-bridge"
#: the built-in output targets (:mod:`nemo_convert.convert.targets`); ``Registry.targets()`` lists
#: every installed one
TARGETS = ("nemo", TARGET, "hf")
TOKENIZER_CONFIG = "megatron.bridge.training.tokenizers.config.TokenizerConfig"
EMBEDDING = "embedding.word_embeddings.weight"


def params_dtype_of(cfg: dict[str, Any], plan: Plan) -> torch.dtype:
    """The model's parameter dtype: the embedding's (after any ``--dtype`` cast)."""
    for info in plan.outputs():
        if info.name == EMBEDDING:
            return info.dtype
    return getattr(torch, dtype_name_of_precision(cfg.get("precision")))


def tokenizer_section(files: dict[str, bytes], out: str, notes: list[str]) -> dict[str, Any] | None:
    """The ``tokenizer:`` section of ``run_config.yaml`` for the files written to ``tokenizer/``."""
    where = os.path.join(os.path.abspath(out), iter_dir_name(0), TOKENIZER_DIR)
    if "tokenizer.json" in files or "tokenizer_config.json" in files:
        return {"_target_": TOKENIZER_CONFIG, "tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": where}
    if "tokenizer.model" in files:
        notes.append("the source has only a SentencePiece tokenizer.model (no HF tokenizer files): tokenizer/ "
                     "holds it and run_config.yaml names it as a SentencePieceTokenizer")
        return {"_target_": TOKENIZER_CONFIG, "tokenizer_type": "SentencePieceTokenizer",
                "tokenizer_model": os.path.join(where, "tokenizer.model")}
    notes.append("the source has no tokenizer files: tokenizer/ is not written")
    return None


def write_megatron_bridge(out: str, cfg: dict[str, Any], plan: Plan, source: TensorSource, *, family: str,
                          kinds: dict[str, Kind], par: Parallelism = Parallelism(), overwrite: bool = False,
                          progress: Progress | None = None, tokenizer: dict[str, bytes] | None = None,
                          strategies: Strategies, providers: ProviderTable,
                          notes: list[str] | None = None, unstacked: tuple[str, ...] = (),
                          extra_states: tuple[str, ...] = ()) -> RunStats:
    """Stage and write a complete Megatron-Bridge checkpoint directory at ``out``, with
    ``family``'s provider as it declares it (``providers``: the registry's).

    ``unstacked`` / ``extra_states``: the family's ``NemoTarget.dist_unstacked`` /
    ``dist_extra_states`` (a hybrid stack keys every layer by its index and keeps the output
    layer's ``_extra_state``), as its ``.nemo`` dist checkpoint has them.

    Everything that can fail is checked first (the family's provider, the config fields,
    TP × PP against the geometry); the weights are then streamed one task at a time.
    """
    notes = notes if notes is not None else []
    providers.of(family)
    if par.stage_layers is not None:
        raise UnsupportedError("--stage-layers is not recorded in a Megatron-Bridge run_config.yaml; use an even "
                               "pipeline split")
    vocab, _ = vocab_sizes(cfg, plan, kinds, 1)
    if vocab is not None and not recorded_vocab(cfg):
        notes.append(f"the true vocabulary size is not recorded: vocab_size={vocab} is the embedding's rows "
                     "(padding rows, if any, stay)")
    if vocab is None:
        raise UnsupportedError("the model has no vocabulary-parallel tensor; Megatron-Bridge's GPT provider needs one")
    if vocab % par.tp:
        raise UnsupportedError(f"tensor-parallel size {par.tp} does not divide the vocabulary ({vocab}); "
                               "Megatron-Bridge does not pad it (should_pad_vocab: false)")
    check_geometry(cfg, plan, kinds, par, vocab, strategies)
    model = nemo_to_provider(cfg, family, providers=providers, vocab_size=vocab, params_dtype=params_dtype_of(cfg, plan),
                             tp=par.tp, pp=par.pp, ep=par.ep)
    origin, mtp = provenance_of(cfg), spec_of(cfg).mtp_layers
    if origin.mtp_dropped or origin.mtp_absent:
        notes.append(f"the source's {origin.mtp_dropped + origin.mtp_absent} multi-token-prediction layer(s) were "
                     "left out at import: run_config.yaml leaves mtp_num_layers unset")
    elif mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s): mtp.layers.<k>.transformer_layer.* as "
                     "Megatron-Core 0.16.1 names them (Megatron-Bridge's DeepSeek mapping, v0.6.0, reads "
                     "mtp_model_layer: a later Megatron-Core's name)")
    files = dict(tokenizer or {})
    run_config: dict[str, Any] = {"model": model}
    tok = tokenizer_section(files, out, notes)
    if tok is not None:
        run_config["tokenizer"] = tok
    ours = {k: v for k, v in (cfg.get(SECTION) or {}).items() if k != "tokenizer_files"}
    ours.update({"version": __version__, "family": family, "vocab_size": vocab})
    it = iter_dir_name(0)
    progress = progress or NoProgress()
    progress.start("write", plan.total_bytes, 0)
    try:
        with staged_output(out, overwrite=overwrite, is_dir=True, kind="megatron-bridge") as stage:
            sink = DirectorySink(stage)
            writer = DistWeightsWriter(sink, plan.outputs(), prefix="", folder=it, sections=sectioned(kinds),
                                       unstacked=unstacked, extra_states=extra_states)
            try:
                stats = run_plan(plan, source, writer.write, progress=progress, own_progress=False, lazy=True)
                writer.add_extra_states()
            except BaseException as exc:
                writer.abort(exc)
                raise
            records = writer.close(finalize=False)
            write_dist_metadata(sink, it, [records], common=common_state(0))
            sink.add_bytes(f"{it}/{RUN_CONFIG}", dump_yaml(run_config))
            state = train_state_bytes(0)
            sink.add_bytes(f"{it}/{TRAIN_STATE}", state)
            for name, data in sorted(files.items()):
                sink.add_bytes(f"{it}/{TOKENIZER_DIR}/{os.path.basename(name)}", data)
            sink.add_bytes(f"{it}/{OURS}", json.dumps(ours, indent=1, sort_keys=True, default=str).encode())
            sink.add_bytes(LATEST_TRAIN_STATE, state)
            sink.add_bytes(TRACKER, b"0")
    finally:
        progress.finish()
    ep = f" EP={par.ep}" if "expert_model_parallel_size" in model else ""
    notes.append(f"Megatron-Bridge directory: {it}/ with {model['_target_'].rsplit('.', 1)[-1]} "
                 f"(TP={par.tp} PP={par.pp}{ep} recorded in {RUN_CONFIG})")
    return stats
