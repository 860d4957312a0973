"""The deepseek_v2 family plugin (see docs/families/deepseek_v2.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_deepseek_v2.family import DEEPSEEK_V2


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [DEEPSEEK_V2]
