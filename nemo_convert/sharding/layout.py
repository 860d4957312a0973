"""Where each logical tensor lives in a TP×PP layout, and how rank folders are named.

Logical names are the global, per-layer NeMo names (``decoder.layers.7.…``). A pipeline
stage holds a contiguous run of layers renumbered from 0, the embedding (first stage),
and the final norm, the output layer and the multi-token-prediction block (``mtp.…``, last
stage: Megatron-Core's ``mtp_on_this_rank`` without a custom layout); with tied embeddings or
an MTP block (which embeds the shifted tokens there) and PP > 1 the last stage also holds a
copy of the word embedding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from nemo_convert.errors import InputError, UnsupportedError
from nemo_convert.sharding.protocol import PipelineSharding

TIED_EMBEDDING = "embedding.word_embeddings.weight"
LAYER_RE = re.compile(r"^(?P<stack>(?:.*\.)?layers)\.(?P<i>\d+)\.(?P<rest>.+)$")
_RANK_DIR = re.compile(r"^(?:mp_rank_(?P<mp>\d{2,})|tp_rank_(?P<tp>\d{2,})_pp_rank_(?P<pp>\d{3,}))$")


def embedding_on_last_stage(cfg: dict[str, Any]) -> bool:
    """Whether the last pipeline stage holds a copy of the word embedding (``tied`` of
    :class:`ParallelLayout`): for tied output weights, and for an MTP block, which
    Megatron-Core's ``GPTModel`` gives an embedding wherever it is (``pre_process or
    mtp_process``, ``models/gpt/gpt_model.py`` line 149, 0.16.1)."""
    return bool(cfg.get("share_embeddings_and_output_weights") or cfg.get("mtp_num_layers"))


def split_layer_name(name: str) -> tuple[str, int, str] | None:
    """``("decoder.layers", 3, "mlp.linear_fc1.weight")`` for a per-layer name, else None."""
    m = LAYER_RE.match(name)
    if not m:
        return None
    return m["stack"], int(m["i"]), m["rest"]


def rank_dir(tp_rank: int, pp_rank: int, pp: int) -> str:
    """NeMo's folder of one rank: ``mp_rank_XX`` (PP = 1) or ``tp_rank_XX_pp_rank_YYY``."""
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:03d}"


def parse_rank_dir(name: str) -> tuple[int, int] | None:
    """``(tp_rank, pp_rank)`` of a rank folder name, or None."""
    m = _RANK_DIR.match(name)
    if not m:
        return None
    if m["mp"] is not None:
        return int(m["mp"]), 0
    return int(m["tp"]), int(m["pp"])


def detect_ranks(names: Sequence[str]) -> tuple[int, int]:
    """TP and PP sizes from a set of rank folder names; checks the grid is complete."""
    ranks = {r for r in (parse_rank_dir(n) for n in names) if r is not None}
    if not ranks:
        raise InputError("no per-rank folders (mp_rank_XX or tp_rank_XX_pp_rank_YYY)")
    tp = max(t for t, _ in ranks) + 1
    pp = max(p for _, p in ranks) + 1
    missing = sorted({(t, p) for t in range(tp) for p in range(pp)} - ranks)
    if missing:
        raise InputError("per-rank folders are incomplete; missing "
                         + ", ".join(rank_dir(t, p, pp) for t, p in missing))
    return tp, pp


@dataclass(frozen=True)
class ParallelLayout:
    """A TP×PP layout of a model with ``num_layers`` layers."""

    tp: int
    pp: int
    stages: tuple[range, ...]
    tied: bool = False

    @classmethod
    def make(cls, num_layers: int, tp: int = 1, pp: int = 1, *, pipeline: PipelineSharding,
             stage_sizes: Sequence[int] | None = None, tied: bool = False) -> "ParallelLayout":
        """The layout of ``num_layers`` layers at TP × PP, its stages from ``pipeline`` (the
        registry's pipeline strategy) and ``stage_sizes`` (explicit layers per stage)."""
        if tp < 1:
            raise UnsupportedError(f"tensor-parallel size must be ≥ 1, got {tp}")
        stages = pipeline.stage_layers(num_layers, pp, stage_sizes)
        return cls(tp, pp, tuple(stages), tied)

    def stage_of_layer(self, layer: int) -> int:
        for s, r in enumerate(self.stages):
            if layer in r:
                return s
        raise InputError(f"layer {layer} is outside the model's {self.stages[-1].stop} layers")

    def stages_of(self, name: str) -> list[int]:
        """The stages that hold logical tensor ``name``."""
        parts = split_layer_name(name)
        if parts is not None and parts[0] == "decoder.layers":
            return [self.stage_of_layer(parts[1])]
        last = self.pp - 1
        if name.startswith(("decoder.", "output_layer", "mtp.")):
            return [last]
        if self.tied and name == TIED_EMBEDDING and last > 0:
            return [0, last]
        return [0]

    def local_name(self, name: str, stage: int) -> str:
        """The name of ``name`` inside stage ``stage`` (layer index renumbered from 0)."""
        parts = split_layer_name(name)
        if parts is not None and parts[0] == "decoder.layers":
            stack, i, rest = parts
            return f"{stack}.{i - self.stages[stage].start}.{rest}"
        return name

    def global_name(self, local: str, stage: int) -> str:
        parts = split_layer_name(local)
        if parts is not None and parts[0] == "decoder.layers":
            stack, i, rest = parts
            return f"{stack}.{i + self.stages[stage].start}.{rest}"
        return local

    def rank_dirs(self) -> list[tuple[int, int, str]]:
        """``(pp_rank, tp_rank, folder)`` for every rank, stage-major."""
        return [(p, t, rank_dir(t, p, self.pp)) for p in range(self.pp) for t in range(self.tp)]
