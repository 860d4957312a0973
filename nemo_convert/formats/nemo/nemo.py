"""NeMo 1 ``.nemo`` checkpoints: open any layout lazily; write config and artifacts.

Reading: a plain tar read in place, a gzipped tar (old NeMo), or the unpacked folder;
weights in the ``dist`` layout (``model_weights/``, Megatron-Core's ``torch_dist`` or
``zarr`` backend) or the ``legacy`` one (``model_weights.ckpt``). Tensors come out under their *logical* names (per layer, no
``model.`` prefix), whatever the layout.
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable

from nemo_convert.errors import InputError
from nemo_convert.formats.dist_checkpoint.sections import join_sections
from nemo_convert.formats.dist_checkpoint.zarr_read import open_dist_checkpoint
from nemo_convert.formats.nemo2.nemo2 import open_nemo2
from nemo_convert.formats.nemo.nemo_checkpoint import (  # noqa: F401  (re-exported)
    CONFIG_MEMBER, KindsFor, NemoCheckpoint, VocabTrimView, dump_yaml, load_yaml)
from nemo_convert.formats.nemo.nemo_legacy import (DROPPED, LEGACY_STACK, LegacyGPTNames, dropped_note,
                                                   has_legacy_names, is_gated, legacy_config, legacy_kind)
from nemo_convert.formats.nemo.nemo_ranks import PerRankSource
from nemo_convert.formats.nemo.nemo_targets import reward_model_config
from nemo_convert.formats.io.sink import MemberSink
from nemo_convert.formats.io.tar_archive import Container, find_member, open_nemo_container
from nemo_convert.mapping.rules import Parallel
from nemo_convert.sharding.layout import (ParallelLayout, detect_ranks, embedding_on_last_stage, parse_rank_dir,
                                          rank_dir, split_layer_name)
from nemo_convert.formats.megatron.providers import ProviderTable
from nemo_convert.sharding.protocol import Strategies
from nemo_convert.spec import recorded_vocab
from nemo_convert.tensors.base import TensorSource
from nemo_convert.tensors.torch_zip_source import TorchZipSource
from nemo_convert.tensors.views import PrefixView  # noqa: F401  (re-exported)


def _rank_folders(container: Container, prefix: str) -> list[str]:
    tops = {n[len(prefix):].split("/", 1)[0] for n in container.names() if n.startswith(prefix) and "/" in n[len(prefix):]}
    return sorted(t for t in tops if parse_rank_dir(t) is not None)


def _rank_names(container: Container, prefix: str, folder: str, trust_pickle: bool) -> list[str]:
    """The tensor names (``model.`` removed) of one rank folder's weights file."""
    zs = TorchZipSource(container.region(f"{prefix}{folder}/model_weights.ckpt"), trust_pickle=trust_pickle)
    try:
        return [k.removeprefix("model.") for k in zs.keys()]
    finally:
        zs.close()


def _stage_sizes(container: Container, prefix: str, tp_pp: tuple[int, int], trust_pickle: bool) -> list[int]:
    """Layers per pipeline stage, counted from each stage's TP-rank-0 file (Megatron-Core
    ``decoder.layers.N`` names, or NeMo's legacy ``language_model.encoder.layers.N``)."""
    tp, pp = tp_pp
    sizes = []
    for p in range(pp):
        names = _rank_names(container, prefix, rank_dir(0, p, pp), trust_pickle)
        idx = {parts[1] for k in names if (parts := split_layer_name(k)) and parts[0] in ("decoder.layers", LEGACY_STACK)}
        sizes.append(len(idx))
    if sum(sizes) == 0:
        raise InputError(f"{container.path}: the per-rank weights hold no decoder layers (neither Megatron-Core "
                         f"decoder.layers.N nor NeMo's legacy {LEGACY_STACK}.N names)")
    return sizes


def open_nemo(path: str, *, strategies: Strategies, providers: ProviderTable, trust_pickle: bool = False,
              kinds_for: KindsFor | None = None) -> NemoCheckpoint:
    """Open a ``.nemo`` (tar, gzipped tar, or folder) without extracting it.

    Tensors come out under global logical names whatever the layout (dist, legacy, or
    legacy per-rank — merged on demand), with vocabulary padding removed when the true
    vocabulary size is known. ``kinds_for(cfg)`` gives each tensor's parallel kind (from
    the model family); it is needed to merge per-rank files and to trim padding.
    ``strategies`` are the registry's sharding strategies (``Registry.strategies()``):
    per-rank slices are merged by its tensor-parallel strategy (a conversion places it on
    its ``--device``), its pipeline strategy lays out the stages. ``providers`` (the
    registry's Megatron-Bridge providers) read a NeMo 2 folder's config.
    """
    if os.path.isdir(path) and os.path.isdir(os.path.join(path, "weights")) \
            and os.path.isdir(os.path.join(path, "context")):
        return open_nemo2(path, providers=providers, kinds_for=kinds_for)
    container = open_nemo_container(path)
    try:
        cfg_name = find_member(container, CONFIG_MEMBER)
        prefix = cfg_name[: -len(CONFIG_MEMBER)]
        config = load_yaml(container.read_bytes(cfg_name), f"{path}:{cfg_name}")
        config, notes = reward_model_config(config)
        extra: list[str] = []
        backend = None
        vocab_names: set[str] = set()
        if container.exists(prefix + "model_weights/metadata.json"):
            kinds = kinds_for(config) if kinds_for is not None else {}
            root = prefix + "model_weights/"
            dist = open_dist_checkpoint(lambda n: container.region(root + n),
                                        lambda: [n[len(root):] for n in container.names() if n.startswith(root)],
                                        name=f"{path}:model_weights")
            source: TensorSource = join_sections(PrefixView(dist, "model."), kinds)
            layout = "dist"
            extra = list(getattr(dist, "extra_state_keys", []))
            backend = dist.BACKEND
        elif container.exists(prefix + "model_weights.ckpt"):
            zs = TorchZipSource(container.region(prefix + "model_weights.ckpt"), trust_pickle=trust_pickle)
            source, layout = PrefixView(zs, "model."), "legacy"
            if has_legacy_names(source.keys()):  # NeMo's pre-Megatron-Core GPT (mcore_gpt: false)
                own = config
                config, legacy_notes = legacy_config(config, path)
                notes += legacy_notes
                try:
                    legacy = LegacyGPTNames(source, own, where=f"{path}:model_weights.ckpt")
                except BaseException:
                    source.close()
                    raise
                notes += [dropped_note(n) for n in legacy.dropped]
                source = legacy
                vocab_names = {k for k in source.keys() if legacy_kind(k, False) is Parallel.VOCAB}
            kinds = kinds_for(config) if kinds_for is not None else {}
        elif folders := _rank_folders(container, prefix):
            tp, pp = detect_ranks(folders)
            sizes = _stage_sizes(container, prefix, (tp, pp), trust_pickle)
            rank_view: Callable[[TensorSource, str], TensorSource] | None = None
            kind_of: Callable[[str], Parallel | None] | None = None
            tied = embedding_on_last_stage(config)
            first = _rank_names(container, prefix, rank_dir(0, 0, pp), trust_pickle)
            if has_legacy_names(first):
                own = config
                config, legacy_notes = legacy_config(config, path)
                notes += legacy_notes + [dropped_note(n) for n in DROPPED if n in first]
                gated = is_gated(own)
                tied = own.get("share_embeddings_and_output_weights", True)  # megatron_gpt_model.py line 506
                rank_view = lambda s, where: LegacyGPTNames(s, own, where=where, tp=tp)  # noqa: E731
                kind_of = lambda name: legacy_kind(name, gated)  # noqa: E731
            kinds = kinds_for(config) if kinds_for is not None else {}
            if tp > 1 and not kinds and kind_of is None:
                raise InputError(f"{path}: per-rank weights at TP={tp} can only be merged through the model "
                                 "family's mapping, and no installed family handles this config (pass --family)")
            playout = ParallelLayout.make(sum(sizes), tp, pp, stage_sizes=sizes, tied=bool(tied),
                                          pipeline=strategies.pipeline)
            vocab = recorded_vocab(config)
            source = PerRankSource(container, prefix, playout, kinds, vocab=vocab, trust_pickle=trust_pickle,
                                   tensor_parallel=strategies.tensor, rank_view=rank_view, kind_of=kind_of)
            if kind_of is not None:
                notes.append(f"merged TP={tp} PP={pp} rank files by NeMo's legacy split rules "
                             "(megatron_change_num_partitions.py)")
                vocab_names = {k for k in source.keys() if kind_of(k) is Parallel.VOCAB}
            layout = "legacy"
        else:
            raise InputError(f"{path}: has {CONFIG_MEMBER} but no weights (model_weights/, model_weights.ckpt "
                             "or per-rank folders)")
        vocab = recorded_vocab(config)
        if vocab:
            vocab_names |= {k for k, v in kinds.items() if v is Parallel.VOCAB}
            source = VocabTrimView(source, vocab_names, int(vocab))
        return NemoCheckpoint(path, container, prefix, config, layout, source, extra, backend, notes)
    except BaseException:
        container.close()
        raise


def artifact_name(data: bytes, basename: str) -> str:
    """NeMo's artifact naming ``<32 hex>_<basename>``; our hex is the content's MD5, so
    the same input always gives the same archive."""
    return f"{hashlib.md5(data).hexdigest()}_{basename}"


def add_artifact_bytes(sink: MemberSink, data: bytes, basename: str) -> str:
    """Store ``data`` in the archive root as an artifact; returns its ``nemo:`` reference."""
    name = artifact_name(data, basename)
    sink.add_bytes(name, data)
    return "nemo:" + name
