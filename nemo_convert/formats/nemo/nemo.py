"""NeMo 1 ``.nemo`` checkpoints: open any layout lazily; write config and artifacts.

Reading: a plain tar read in place, a gzipped tar (old NeMo), or the unpacked folder;
weights in the ``dist`` layout (``model_weights/``) or the ``legacy`` one
(``model_weights.ckpt``). Tensors come out under their *logical* names (per layer, no
``model.`` prefix), whatever the layout.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from nemo_convert.errors import InputError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.nemo2.nemo2 import open_nemo2
from nemo_convert.formats.nemo.nemo_checkpoint import (  # noqa: F401  (re-exported)
    CONFIG_MEMBER, KindsFor, NemoCheckpoint, VocabTrimView, dump_yaml, load_yaml)
from nemo_convert.formats.nemo.nemo_ranks import PerRankSource
from nemo_convert.formats.io.sink import MemberSink
from nemo_convert.formats.io.tar_archive import Container, find_member, open_nemo_container
from nemo_convert.mapping.rules import Parallel
from nemo_convert.sharding.layout import (ParallelLayout, detect_ranks, embedding_on_last_stage, parse_rank_dir,
                                          rank_dir, split_layer_name)
from nemo_convert.tensors.base import TensorSource
from nemo_convert.tensors.torch_zip_source import TorchZipSource
from nemo_convert.tensors.views import PrefixView  # noqa: F401  (re-exported)


def _rank_folders(container: Container, prefix: str) -> list[str]:
    tops = {n[len(prefix):].split("/", 1)[0] for n in container.names() if n.startswith(prefix) and "/" in n[len(prefix):]}
    return sorted(t for t in tops if parse_rank_dir(t) is not None)


def _stage_sizes(container: Container, prefix: str, tp_pp: tuple[int, int], trust_pickle: bool) -> list[int]:
    """Layers per pipeline stage, counted from each stage's TP-rank-0 file."""
    tp, pp = tp_pp
    sizes = []
    for p in range(pp):
        zs = TorchZipSource(container.region(f"{prefix}{rank_dir(0, p, pp)}/model_weights.ckpt"),
                            trust_pickle=trust_pickle)
        try:
            idx = {parts[1] for k in zs.keys() if (parts := split_layer_name(k.removeprefix("model.")))
                   and parts[0] == "decoder.layers"}
        finally:
            zs.close()
        sizes.append(len(idx))
    return sizes


def open_nemo(path: str, *, trust_pickle: bool = False, kinds_for: KindsFor | None = None,
              tensor_parallel: Any = None) -> NemoCheckpoint:
    """Open a ``.nemo`` (tar, gzipped tar, or folder) without extracting it.

    Tensors come out under global logical names whatever the layout (dist, legacy, or
    legacy per-rank — merged on demand), with vocabulary padding removed when the true
    vocabulary size is known. ``kinds_for(cfg)`` gives each tensor's parallel kind (from
    the model family); it is needed to merge per-rank files and to trim padding.
    ``tensor_parallel`` merges per-rank slices (default: the built-in strategy; a
    conversion passes the registry's, placed on its ``--device``).
    """
    if os.path.isdir(path) and os.path.isdir(os.path.join(path, "weights")) \
            and os.path.isdir(os.path.join(path, "context")):
        return open_nemo2(path, kinds_for=kinds_for)
    container = open_nemo_container(path)
    try:
        cfg_name = find_member(container, CONFIG_MEMBER)
        prefix = cfg_name[: -len(CONFIG_MEMBER)]
        config = load_yaml(container.read_bytes(cfg_name), f"{path}:{cfg_name}")
        kinds = kinds_for(config) if kinds_for is not None else {}
        extra: list[str] = []
        if container.exists(prefix + "model_weights/metadata.json"):
            dist = DistCheckpointSource(lambda n: container.region(prefix + "model_weights/" + n),
                                        name=f"{path}:model_weights")
            source: TensorSource = PrefixView(dist, "model.")
            layout = "dist"
            extra = list(getattr(dist, "extra_state_keys", []))
        elif container.exists(prefix + "model_weights.ckpt"):
            zs = TorchZipSource(container.region(prefix + "model_weights.ckpt"), trust_pickle=trust_pickle)
            source, layout = PrefixView(zs, "model."), "legacy"
        elif folders := _rank_folders(container, prefix):
            tp, pp = detect_ranks(folders)
            if tp > 1 and not kinds:
                raise InputError(f"{path}: per-rank weights at TP={tp} can only be merged through the model "
                                 "family's mapping, and no installed family handles this config (pass --family)")
            sizes = _stage_sizes(container, prefix, (tp, pp), trust_pickle)
            playout = ParallelLayout.make(sum(sizes), tp, pp, stage_sizes=sizes,
                                          tied=embedding_on_last_stage(config))
            vocab = (config.get("nemo_convert") or {}).get("vocab_size")
            source = PerRankSource(container, prefix, playout, kinds, vocab=vocab, trust_pickle=trust_pickle,
                                   tensor_parallel=tensor_parallel)
            layout = "legacy"
        else:
            raise InputError(f"{path}: has {CONFIG_MEMBER} but no weights (model_weights/, model_weights.ckpt "
                             "or per-rank folders)")
        vocab = (config.get("nemo_convert") or {}).get("vocab_size")
        if vocab:
            source = VocabTrimView(source, {k for k, v in kinds.items() if v is Parallel.VOCAB}, int(vocab))
        return NemoCheckpoint(path, container, prefix, config, layout, source, extra)
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
