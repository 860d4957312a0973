"""Mistral (7B v0.1–v0.3, NeMo 12B): Llama's block with a sliding attention window.

``sliding_window=W`` is written as Megatron's ``window_size=[W-1, 0]``: HF lets a query
see W keys (itself and W-1 before), and Megatron's window counts the keys *before*.
NeMo's own importer writes ``[W, 0]`` (one key too many); see docs/families/mistral.md.
"""

from nemo_convert.families import GPT_CONFIG, gpt_family, sliding_window
from nemo_convert.families.trtllm import LLAMA_FIELDS, gpt_trtllm
from nemo_convert.spec import spec_of

MISTRAL = gpt_family(
    "mistral", architecture="MistralForCausalLM", model_type="mistral",
    config=GPT_CONFIG.extend(sliding_window()),
    claims=lambda cfg: spec_of(cfg).attention.window is not None,  # a sliding window (NeMo's importer writes it)
    nemo2_targets=("nemo.collections.llm.gpt.model.mistral.MistralModel",),
    trtllm=gpt_trtllm("LlamaForCausalLM", LLAMA_FIELDS),  # MODEL_MAP: MistralForCausalLM → LLaMAForCausalLM
    description="Mistral 7B / NeMo 12B (GQA, sliding window as window_size=[W-1, 0])",
)
