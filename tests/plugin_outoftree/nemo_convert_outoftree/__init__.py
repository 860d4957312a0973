"""Two families a third party declares on nemo-convert's public bases, and nothing else.

``oot-dense`` is a Llama-shaped decoder (HF ``OotDenseForCausalLM``) and ``oot-moe`` a
Mixtral-shaped one (HF ``OotMoeForCausalLM``: softmax top-k routing over every layer). Each
names the transformers class that computes it (``hf=HFSide(...)``: export's logits and
``verify`` load it), its TensorRT-LLM target (``trtllm=``: ``quantize``) and its
Megatron-Bridge provider (``megatron_bridge=``: ``--to megatron-bridge`` and reading that
directory back). ``claims=never``: a NeMo-written config is never taken for one of them
without ``--family`` or our own record. The test that installs it is
``tests/test_plugin_outoftree.py``.
"""

from __future__ import annotations

from nemo_convert import HFSide, ModelFamily, hookimpl
from nemo_convert.families import (DENSE, EXPERTS_FFN, GPT_CONFIG, GPT_PROVIDER, MOE_HARMLESS, MOE_NEMO_CONSTANTS,
                                   MOE_ROWS, NO_LINEAR_BIAS, SILU, GPTFeatures, MoEBlock, ProviderFamily, gpt_family,
                                   linear_biases, never, num_experts, sliding_window)
from nemo_convert.families.trtllm import LLAMA_FIELDS, LLAMA_MOE_FIELDS, gpt_trtllm

OOT_DENSE = gpt_family(
    "oot-dense", architecture="OotDenseForCausalLM", model_type="oot_dense",
    config=GPT_CONFIG.extend(linear_biases("attention_bias", "mlp_bias")),
    claims=never, hf=HFSide(model_class="LlamaForCausalLM"),
    trtllm=gpt_trtllm("LlamaForCausalLM", LLAMA_FIELDS),
    megatron_bridge=ProviderFamily("oot_bridge.providers.OotDenseProvider", DENSE + NO_LINEAR_BIAS,
                                   defaults=(("normalization", "RMSNorm"),)),
    description="Test plugin: a Llama-shaped decoder (HF OotDenseForCausalLM)")

OOT_MOE = gpt_family(
    "oot-moe", architecture="OotMoeForCausalLM", model_type="oot_moe",
    config=GPT_CONFIG.extend(EXPERTS_FFN, sliding_window(), num_experts("num_local_experts"), *MOE_ROWS, harmless=MOE_HARMLESS,
                             nemo_constants={**MOE_NEMO_CONSTANTS, "moe_router_pre_softmax": False,
                                             "moe_layer_freq": 1}),
    features=GPTFeatures(moe=MoEBlock(block="block_sparse_moe", gate="w1", up="w3", down="w2", fused_block="mlp")),
    claims=never, hf=HFSide(model_class="MixtralForCausalLM"),
    trtllm=gpt_trtllm("MixtralForCausalLM", LLAMA_MOE_FIELDS),
    megatron_bridge=ProviderFamily(GPT_PROVIDER, DENSE + NO_LINEAR_BIAS + (("activation_func", SILU),), moe=True),
    description="Test plugin: a Mixtral-shaped mixture of experts (HF OotMoeForCausalLM)")


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [OOT_DENSE, OOT_MOE]
