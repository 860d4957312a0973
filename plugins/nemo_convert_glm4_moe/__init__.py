"""The glm4_moe family plugin (see docs/families/glm4_moe.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_glm4_moe.family import GLM4_MOE


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [GLM4_MOE]
