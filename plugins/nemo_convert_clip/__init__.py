"""The CLIP family: HF ``CLIPModel`` ⇄ NeMo ``MegatronCLIPModel`` (legacy ``model_weights.ckpt``),
and ``verify``'s zero-shot check (``--clip-image IMG --texts …``, a ``Verifier``).

Every command loads every plugin (``nemo-convert inspect`` and each command's ``--help``
too), so this module imports only declarations; the zero-shot check's code
(:mod:`nemo_convert_clip.zero_shot` and :mod:`nemo_convert_clip.image`: torch,
transformers) is imported when ``verify`` runs it (CONTRIBUTING.md, "Start-up time")."""

from typing import Any

from nemo_convert import CommandOption, ModelFamily, Verifier, hookimpl
from nemo_convert_clip.family import CLIP


def _zero_shot_report(folder_a: str, folder_b: str, options: dict[str, Any]) -> Any:
    from nemo_convert_clip.zero_shot import zero_shot_report  # runs models: loaded when verify runs it

    return zero_shot_report(folder_a, folder_b, options)


def _check_zero_shot_options(options: dict[str, Any]) -> None:
    from nemo_convert_clip.zero_shot import check_zero_shot_options  # see _zero_shot_report

    check_zero_shot_options(options)


ZERO_SHOT = Verifier(
    name="clip",
    options=(
        CommandOption("verify", "--clip-image", "also print CLIP zero-shot probabilities of --texts for this image "
                      "on both sides, computed like NeMo's megatron_clip_infer.py", kind="value", metavar="IMG"),
        CommandOption("verify", "--texts", "candidate captions for --clip-image", kind="values", metavar="TEXT"),
    ),
    run=_zero_shot_report,
    check=_check_zero_shot_options,
    description="CLIP zero-shot probabilities of captions for an image, on both checkpoints",
)


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [CLIP]


@hookimpl
def nemo_convert_verifiers() -> list[Verifier]:
    return [ZERO_SHOT]
