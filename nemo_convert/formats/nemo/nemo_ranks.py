"""The legacy per-rank ``.nemo`` layout: ``mp_rank_XX/model_weights.ckpt`` (PP = 1) or
``tp_rank_XX_pp_rank_YYY/model_weights.ckpt``, each holding one rank's slices.

Reading presents the *global* logical tensors, each merged from its rank slices on
demand (one tensor in memory at a time). Writing is one :class:`RankWeightsWriter` per rank
file, slicing each tensor it is given for that rank; the conversion runs the stage's part
of its plan once per rank file (``convert/nemo_write.py``), so the archive is streamed rank
file by rank file with no temporary copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO, Callable

from nemo_convert.errors import InputError, ShapeError
from nemo_convert.formats.io.tar_archive import Container
from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter
from nemo_convert.mapping.rules import Kind, Parallel
from nemo_convert.sharding.layout import TIED_EMBEDDING, ParallelLayout
from nemo_convert.sharding.protocol import TensorSharding
from nemo_convert.sharding.tensor import deferred
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.pieces import Lazy, materialize
from nemo_convert.tensors.torch_zip_source import TorchZipSource
from nemo_convert.tensors.views import PrefixView

if TYPE_CHECKING:
    import torch

WEIGHTS = "model_weights.ckpt"


class PerRankSource:
    """Global logical tensors merged from per-rank ``model_weights.ckpt`` files."""

    def __init__(self, container: Container, prefix: str, layout: ParallelLayout,
                 kinds: dict[str, Kind], *, tensor_parallel: TensorSharding, vocab: int | None = None,
                 trust_pickle: bool = False, rank_view: Callable[[TensorSource, str], TensorSource] | None = None,
                 kind_of: Callable[[str], Parallel | None] | None = None) -> None:
        """``tensor_parallel`` merges the rank slices (the registry's strategy);
        ``rank_view(source, where)`` presents each rank file's (``model.``-less) tensors
        under other names (legacy NeMo names: :mod:`.nemo_legacy`); ``kind_of(name)``, when it
        answers, decides a tensor's parallel kind before ``kinds``."""
        self._tp = tensor_parallel
        self._layout = layout
        self._kinds = kinds
        self._kind_of = kind_of
        self._vocab = vocab
        self._ranks: dict[tuple[int, int], TensorSource] = {}
        try:
            for p, t, folder in layout.rank_dirs():
                member = f"{prefix}{folder}/{WEIGHTS}"
                if not container.exists(member):
                    raise InputError(f"{container.path}: {folder}/ has no {WEIGHTS}")
                zs = TorchZipSource(container.region(member), trust_pickle=trust_pickle)
                view: TensorSource = PrefixView(zs, "model.")
                if rank_view is not None:
                    try:
                        view = rank_view(view, f"{container.path}:{folder}")
                    except BaseException:
                        view.close()
                        raise
                self._ranks[(p, t)] = view
        except BaseException:
            self.close()
            raise
        for (p, t), rank in self._ranks.items():
            if t and set(rank.keys()) != set(self._ranks[(p, 0)].keys()):
                odd = sorted(set(rank.keys()) ^ set(self._ranks[(p, 0)].keys()))
                self.close()
                raise InputError(f"{container.path}: {layout.rank_dirs()[p * layout.tp + t][2]}/ and tensor-parallel "
                                 f"rank 0 of its stage hold different tensors (e.g. {odd[0]})")
        self._where: dict[str, tuple[int, str]] = {}
        for p in range(layout.pp):
            for local in self._ranks[(p, 0)].keys():
                name = layout.global_name(local, p)
                if p > 0 and layout.pp > 1 and name == TIED_EMBEDDING and name in self._where:
                    continue  # the last stage's copy of a tied embedding
                if name in self._where:
                    raise InputError(f"{container.path}: {name} appears on more than one pipeline stage")
                self._where[name] = (p, local)
        self._infos: dict[str, TensorInfo] = {}

    def _kind(self, key: str) -> Kind:
        kind = self._kind_of(key) if self._kind_of is not None else None
        return kind or self._kinds.get(key, Parallel.REPLICATED)

    def keys(self) -> list[str]:
        return list(self._where)

    def info(self, key: str) -> TensorInfo:
        import torch
        if key not in self._infos:
            p, local = self._where[key]
            parts = [torch.empty(self._ranks[(p, t)].info(local).shape, device="meta",
                                 dtype=self._ranks[(p, t)].info(local).dtype) for t in range(self._layout.tp)]
            merged = self._merge(key, parts)
            self._infos[key] = TensorInfo(key, tuple(merged.shape), merged.dtype)
        return self._infos[key]

    def _merge(self, key: str, parts: list[torch.Tensor]) -> Lazy:
        kind = self._kind(key)
        if any(p.shape != parts[0].shape for p in parts):
            raise ShapeError(f"{key}: the tensor-parallel slices differ in shape "
                             f"({', '.join(str(list(p.shape)) for p in parts)})")
        vocab = self._vocab if kind is Parallel.VOCAB else None
        if vocab is not None and parts[0].shape[0] * len(parts) < vocab:
            vocab = None
        merge = deferred(self._tp, "merge") or self._tp.merge
        return merge(parts, kind, name=key, vocab=vocab)

    def load(self, key: str) -> torch.Tensor:
        return materialize(self.load_lazy(key))

    def load_lazy(self, key: str) -> Lazy:
        """:meth:`load`, with merges that only stack rows deferred (:mod:`~nemo_convert.tensors.pieces`)."""
        p, local = self._where[key]
        return self._merge(key, [self._ranks[(p, t)].load(local) for t in range(self._layout.tp)])

    def group(self, key: str) -> str:
        p, _ = self._where[key]
        return f"stage{p:03d}"

    def close(self) -> None:
        for r in self._ranks.values():
            r.close()


class RankWeightsWriter:
    """Writes one rank file's ``model_weights.ckpt``: each logical tensor it is given is
    kept only if stage ``pp_rank`` holds it, sliced for TP rank ``tp_rank`` and written
    ``model.``-prefixed under its stage-local name (layers renumbered per stage)."""

    def __init__(self, stream: BinaryIO, layout: ParallelLayout, kinds: dict[str, Kind], *, pp_rank: int,
                 tp_rank: int, padded_vocab: int | None, tensor_parallel: TensorSharding) -> None:
        self._writer = TorchSaveWriter(stream)
        self._layout = layout
        self._kinds = kinds
        self._p, self._t = pp_rank, tp_rank
        self._vocab = padded_vocab
        self._splitter = tensor_parallel
        # deferred where the strategy can (rows picked, not copied: the writer copies them file to file)
        self._split_lazy = deferred(self._splitter, "split")

    def write(self, name: str, tensor: Lazy) -> None:
        layout, p, t = self._layout, self._p, self._t
        if p not in layout.stages_of(name):
            return
        kind = self._kinds.get(name, Parallel.REPLICATED)
        vocab = self._vocab if kind is Parallel.VOCAB else None
        if self._split_lazy is not None:
            piece = self._split_lazy(tensor, kind, layout.tp, t, name=name, padded_vocab=vocab)
        else:
            piece = self._splitter.split(materialize(tensor), kind, layout.tp, t, name=name, padded_vocab=vocab)
        self._writer.add("model." + layout.local_name(name, p), piece)

    def close(self) -> None:
        self._writer.close()
