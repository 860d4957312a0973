"""The deepseek_v3 family plugin (see docs/families/deepseek_v3.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_deepseek_v3.family import DEEPSEEK_V3


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [DEEPSEEK_V3]
