"""The phi3 family plugin (see docs/families/phi3.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_phi3.family import PHI3


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [PHI3]
