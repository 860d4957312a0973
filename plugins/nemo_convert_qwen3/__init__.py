"""The qwen3 family plugin (see docs/families/qwen3.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_qwen3.family import QWEN3


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [QWEN3]
