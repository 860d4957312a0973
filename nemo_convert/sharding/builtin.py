"""Registers the built-in sharding strategies through the same hook third parties use."""

from __future__ import annotations

from nemo_convert import ShardingStrategy, hookimpl
from nemo_convert.sharding.expert import ExpertParallel
from nemo_convert.sharding.pipeline import PipelineParallel
from nemo_convert.sharding.tensor import TensorParallel


@hookimpl
def nemo_convert_sharding_strategies() -> list[ShardingStrategy]:
    return [
        ShardingStrategy("tensor", "tp", TensorParallel(), "Megatron tensor parallelism: column/row/vocab/"
                         "grouped-QKV/gated-fc1 splits"),
        ShardingStrategy("pipeline", "pp", PipelineParallel(), "Megatron pipeline parallelism: contiguous "
                         "layer stages, embedding first, head last"),
        ShardingStrategy("expert", "ep", ExpertParallel(), "Megatron expert parallelism: contiguous experts per "
                         "rank, global experts in dist checkpoints"),
    ]
