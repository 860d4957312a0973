"""Qwen2-MoE: Qwen2's attention (q/k/v biases) with routed experts plus a shared expert.

The shared expert (``mlp.shared_expert``) ⇄ ``mlp.shared_experts`` and its sigmoid gate
``mlp.shared_expert_gate`` ``[1, H]`` ⇄ ``mlp.shared_experts.gate_weight``
(``moe_shared_expert_gate``): Megatron-Core adds ``sigmoid(x·g)·shared(x)`` to the routed
output, as HF does. Routing and mixed stacks as Qwen3-MoE.
"""

from nemo_convert.families import (Check, Field, GPTFeatures, GPT_CONFIG, MOE_HARMLESS, MOE_NEMO_CONSTANTS, MOE_ROWS,
                                   MoEBlock, NORM_TOPK_PROB, gpt_family, moe_layers, no_per_layer_windows, num_experts)
from nemo_convert.spec import spec_of

QWEN2_MOE_CONFIG = GPT_CONFIG.extend(
    Check(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"), no_per_layer_windows),
    num_experts("num_experts", "num_local_experts"), moe_layers(), NORM_TOPK_PROB,
    Field("moe_intermediate_size", "moe_ffn_hidden_size", to_nemo=int, to_hf=int),
    Field("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", to_nemo=int, to_hf=int),
    Field("qkv_bias", "qkv_bias", True, to_nemo=bool, to_hf=bool, accept=lambda v: v is True),
    *MOE_ROWS, harmless=MOE_HARMLESS,
    nemo_constants={**MOE_NEMO_CONSTANTS, "qkv_bias": True, "moe_shared_expert_gate": True,
                    "nemo_convert.linear_biases": {"qkv": True, "proj": False, "mlp": False}})

#: ``--to megatron-bridge`` is refused: no provider to confirm against.
MEGATRON_BRIDGE = ("Megatron-Bridge has no Qwen2-MoE bridge or provider in any release (v0.6.0: qwen/ bridges "
                   "Qwen2 and Qwen3-MoE only)")

QWEN2_MOE = gpt_family(
    "qwen2_moe", architecture="Qwen2MoeForCausalLM", model_type="qwen2_moe", config=QWEN2_MOE_CONFIG,
    features=GPTFeatures(moe=MoEBlock(shared="shared_expert", shared_gate="shared_expert_gate")),
    claims=lambda cfg: (moe := spec_of(cfg).moe) is not None and moe.shared_gate,  # a gated shared expert
    # NeMo 8cfedd7 has no Qwen2-MoE config class (``qwen2.py``: dense Qwen2Config and its presets, which
    # the qwen2 plugin declares), so no config class is declared here
    nemo2_targets=("nemo.collections.llm.gpt.model.qwen2.Qwen2Model",),
    description="Qwen2-MoE / Qwen1.5-MoE (q/k/v biases, routed experts + sigmoid-gated shared expert)",
    megatron_bridge=MEGATRON_BRIDGE)
