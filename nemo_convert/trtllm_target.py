"""Registers the ``trtllm`` output target — a ``.qnemo``, a TensorRT-LLM checkpoint, as
``nemo-convert quantize`` writes it — through the same hook third parties use
(``nemo_convert_targets``; entry point ``trtllm`` in ``pyproject.toml``).

The registry loads this module for every command, ``--help`` included, so it stays light:
the record's ``write`` loads its writer (:mod:`nemo_convert.qnemo.target_writer`, which
calibrates and quantizes) when a conversion calls it. The target takes quantization
settings (option ``"quantization"``): a conversion without them (``import``, ``reshard``)
is refused it before the source is opened
(:func:`~nemo_convert.convert.output.choose_target`).
"""

from __future__ import annotations

from typing import Any

from nemo_convert.plugins.hookspecs import hookimpl
from nemo_convert.plugins.records import OutputJob, OutputTarget


def write_trtllm_target(job: OutputJob) -> Any:
    """``--to trtllm``: :func:`nemo_convert.qnemo.target_writer.write_trtllm_target`."""
    from nemo_convert.qnemo import target_writer  # start-up time: loaded when a conversion writes

    return target_writer.write_trtllm_target(job)


TRTLLM = OutputTarget("trtllm", "qnemo", write_trtllm_target, frozenset({"packed", "workers", "quantization"}),
                      description="a .qnemo (TensorRT-LLM checkpoint: config.json, rank{i}.safetensors, tokenizer) "
                                  "as quantize writes it")


@hookimpl
def nemo_convert_targets() -> list[OutputTarget]:
    return [TRTLLM]
