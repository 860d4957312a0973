"""The gpt2 family plugin (see docs/families/gpt2.md)."""

from nemo_convert import hookimpl
from nemo_convert_gpt2.family import GPT2


@hookimpl
def nemo_convert_model_families():  # type: ignore[no-untyped-def]
    return [GPT2]
