"""The gemma3 family plugin (see docs/families/gemma3.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_gemma3.family import GEMMA3


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [GEMMA3]
