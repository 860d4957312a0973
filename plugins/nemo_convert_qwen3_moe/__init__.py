"""The qwen3_moe family plugin (see docs/families/qwen3_moe.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_qwen3_moe.family import QWEN3_MOE


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [QWEN3_MOE]
