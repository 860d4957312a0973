"""Mixtral: Mistral's attention with a mixture-of-experts MLP on every layer.

``block_sparse_moe.gate`` ⇄ ``mlp.router``; expert e's ``w1`` (gate), ``w3`` (up) and
``w2`` (down) ⇄ ``linear_fc1`` = ``[w1; w3]`` and ``linear_fc2`` of expert e. HF takes
softmax, top-k, then renormalises = Megatron's top-k then softmax
(``moe_router_pre_softmax: false``). ``intermediate_size`` is the experts' ffn.
"""

from nemo_convert.families import (EXPERTS_FFN, GPTFeatures, GPT_CONFIG, MOE_HARMLESS, MOE_NEMO_CONSTANTS, MOE_ROWS,
                                   MoEBlock, gpt_family, num_experts, sliding_window)
from nemo_convert.families.trtllm import LLAMA_MOE_FIELDS, gpt_trtllm
from nemo_convert.spec import spec_of
from nemo_convert_mixtral.nemo2 import NEMO2_CONFIGS

#: ``--to megatron-bridge`` is refused: no provider to confirm against.
MEGATRON_BRIDGE = ("Megatron-Bridge has no Mixtral bridge or provider in any release (v0.1.0 to v0.6.0: no "
                   "MixtralForCausalLM in src/megatron/bridge/models/)")

MIXTRAL = gpt_family(
    "mixtral", architecture="MixtralForCausalLM", model_type="mixtral",
    config=GPT_CONFIG.extend(
        EXPERTS_FFN, sliding_window(), num_experts("num_local_experts"),
        *MOE_ROWS, harmless=MOE_HARMLESS,
        nemo_constants={**MOE_NEMO_CONSTANTS, "moe_router_pre_softmax": False, "moe_layer_freq": 1}),
    features=GPTFeatures(moe=MoEBlock(block="block_sparse_moe", gate="w1", up="w3", down="w2", fused_block="mlp")),
    claims=lambda cfg: spec_of(cfg).moe is not None,  # routed experts
    nemo2_targets=("nemo.collections.llm.gpt.model.mixtral.MixtralModel",), nemo2_configs=NEMO2_CONFIGS,
    trtllm=gpt_trtllm("MixtralForCausalLM", LLAMA_MOE_FIELDS),  # MODEL_MAP: → LLaMAForCausalLM with `moe`
    description="Mixtral 8x7B / 8x22B (GQA, top-k softmax-routed experts, sliding window)",
    megatron_bridge=MEGATRON_BRIDGE)
