"""The mixtral family plugin (see docs/families/mixtral.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_mixtral.family import MIXTRAL


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [MIXTRAL]
