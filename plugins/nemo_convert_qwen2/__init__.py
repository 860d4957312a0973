"""The qwen2 family plugin (see docs/families/qwen2.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_qwen2.family import QWEN2


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [QWEN2]
