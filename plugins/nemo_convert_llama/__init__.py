"""The Llama family (Llama 2, 3, 3.1, 3.2): HF ``LlamaForCausalLM`` ⇄ NeMo mcore GPT."""

from nemo_convert import ModelFamily, hookimpl
from nemo_convert_llama.family import LLAMA


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [LLAMA]
