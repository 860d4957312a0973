"""Registers the built-in output targets — ``nemo`` (a ``.nemo``), ``megatron-bridge``
(a Megatron-Bridge checkpoint directory) and ``hf`` (a Hugging Face folder) — through the same hook third parties use
(``nemo_convert_targets``; entry point ``targets`` in ``pyproject.toml``).

The registry loads this module for every command, ``--help`` included, so it stays light:
each record's ``write`` loads its writer (:mod:`.target_writers`, which computes on
tensors) when a conversion calls it.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.plugins.hookspecs import hookimpl
from nemo_convert.plugins.records import OutputJob, OutputTarget


def write_nemo_target(job: OutputJob) -> Any:
    """``--to nemo``: :func:`.target_writers.write_nemo_target`."""
    from nemo_convert.convert import target_writers  # start-up time: loaded when a conversion writes

    return target_writers.write_nemo_target(job)


def write_megatron_bridge_target(job: OutputJob) -> Any:
    """``--to megatron-bridge``: :func:`.target_writers.write_megatron_bridge_target`."""
    from nemo_convert.convert import target_writers  # start-up time: loaded when a conversion writes

    return target_writers.write_megatron_bridge_target(job)


def write_hf_target(job: OutputJob) -> Any:
    """``--to hf``: :func:`.nemo_to_hf.write_hf_target`."""
    from nemo_convert.convert import target_writers  # start-up time: loaded when a conversion writes

    return target_writers.write_hf_target(job)


NEMO = OutputTarget("nemo", "nemo", write_nemo_target, frozenset({"layout", "packed", "workers"}),
                    description="a .nemo archive or its unpacked folder (NeMo 1 model_config.yaml, dist or "
                                "legacy weights)")
MEGATRON_BRIDGE = OutputTarget("megatron-bridge", "megatron-bridge", write_megatron_bridge_target,
                               description="a Megatron-Bridge checkpoint directory (torch_dist weights, "
                                           "run_config.yaml with the family's provider)")
HF = OutputTarget("hf", "hf", write_hf_target, frozenset({"workers"}),
                  description="a Hugging Face folder (safetensors shards, config.json, tokenizer files) that "
                              "transformers loads")


@hookimpl
def nemo_convert_targets() -> list[OutputTarget]:
    return [NEMO, MEGATRON_BRIDGE, HF]
