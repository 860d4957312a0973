"""The mistral family plugin (see docs/families/mistral.md)."""

from nemo_convert import hookimpl
from nemo_convert_mistral.family import MISTRAL


@hookimpl
def nemo_convert_model_families():  # type: ignore[no-untyped-def]
    return [MISTRAL]
