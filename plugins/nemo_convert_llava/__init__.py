"""The LLaVA family: HF ``LlavaForConditionalGeneration`` ⇄ NeMo NeVA (``MegatronNevaModel``),
composed from the Llama and CLIP families."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_llava.family import LLAVA


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [LLAVA]
