"""The gemma family plugin (see docs/families/gemma.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_gemma.family import GEMMA


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [GEMMA]
