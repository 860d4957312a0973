"""The gpt_oss family plugin (see docs/families/gpt_oss.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_gpt_oss.family import GPT_OSS


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [GPT_OSS]
