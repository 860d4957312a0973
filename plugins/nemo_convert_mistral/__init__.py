"""The mistral family plugin (see docs/families/mistral.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_mistral.family import MISTRAL


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [MISTRAL]
