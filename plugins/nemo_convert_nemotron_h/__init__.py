"""The nemotron_h family plugin (see docs/families/nemotron_h.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_nemotron_h.family import NEMOTRON_H


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [NEMOTRON_H]
