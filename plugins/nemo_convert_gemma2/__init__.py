"""The gemma2 family plugin (see docs/families/gemma2.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_gemma2.family import GEMMA2


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [GEMMA2]
