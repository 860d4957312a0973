"""The gpt2 family plugin (see docs/families/gpt2.md)."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_gpt2.family import GPT2


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [GPT2]
