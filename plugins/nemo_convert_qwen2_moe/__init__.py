"""The qwen2_moe family plugin (see docs/families/qwen2_moe.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_qwen2_moe.family import QWEN2_MOE


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [QWEN2_MOE]
