"""The mixtral family plugin (see docs/families/mixtral.md)."""

from nemo_convert import hookimpl
from nemo_convert_mixtral.family import MIXTRAL


@hookimpl
def nemo_convert_model_families():  # type: ignore[no-untyped-def]
    return [MIXTRAL]
