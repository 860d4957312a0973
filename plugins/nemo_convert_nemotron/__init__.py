"""The nemotron family plugin (see docs/families/nemotron.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_nemotron.family import NEMOTRON


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [NEMOTRON]
