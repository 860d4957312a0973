"""The CLIP family: HF ``CLIPModel`` ⇄ NeMo ``MegatronCLIPModel`` (legacy ``model_weights.ckpt``)."""

from nemo_convert import hookimpl
from nemo_convert_clip.family import CLIP


@hookimpl
def nemo_convert_model_families():  # type: ignore[no-untyped-def]
    return [CLIP]
