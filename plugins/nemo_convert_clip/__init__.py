"""The CLIP family: HF ``CLIPModel`` ⇄ NeMo ``MegatronCLIPModel`` (legacy ``model_weights.ckpt``),
and ``verify``'s zero-shot check (``--clip-image IMG --texts …``)."""

from nemo_convert import CommandOption, Verifier, hookimpl
from nemo_convert.verify.clip import check_zero_shot_options, zero_shot_report
from nemo_convert_clip.family import CLIP

ZERO_SHOT = Verifier(
    name="clip",
    options=(
        CommandOption("verify", "--clip-image", "also print CLIP zero-shot probabilities of --texts for this image "
                      "on both sides, computed like NeMo's megatron_clip_infer.py", kind="value", metavar="IMG"),
        CommandOption("verify", "--texts", "candidate captions for --clip-image", kind="values", metavar="TEXT"),
    ),
    run=zero_shot_report,
    check=check_zero_shot_options,
    description="CLIP zero-shot probabilities of captions for an image, on both checkpoints",
)


@hookimpl
def nemo_convert_model_families():  # type: ignore[no-untyped-def]
    return [CLIP]


@hookimpl
def nemo_convert_verifiers():  # type: ignore[no-untyped-def]
    return [ZERO_SHOT]
