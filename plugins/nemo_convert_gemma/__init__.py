"""The gemma family plugin (see docs/families/gemma.md)."""

from nemo_convert import hookimpl
from nemo_convert_gemma.family import GEMMA


@hookimpl
def nemo_convert_model_families():  # type: ignore[no-untyped-def]
    return [GEMMA]
