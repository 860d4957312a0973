"""Phi-3 (mini/medium, 4k): Llama's block with HF-side fused projections.

``self_attn.qkv_proj`` holds ``[q; k; v]`` one after another and is regrouped per query
group into ``linear_qkv`` (and back on export); ``mlp.gate_up_proj`` is ``[gate; up]``,
already Megatron's ``linear_fc1``. ``sliding_window`` is Mistral's. longrope / su scaling
(the 128k models) is refused.
"""

from nemo_convert.families import GPTFeatures, GPT_CONFIG, gpt_family, never, rope, sliding_window
from nemo_convert_phi3.nemo2 import NEMO2_CONFIGS

#: ``--to megatron-bridge`` is refused: no provider to confirm against.
MEGATRON_BRIDGE = ("Megatron-Bridge has no Phi-3 bridge or provider in any release (v0.6.0: "
                   "src/megatron/bridge/models/ "
                   "has no phi/)")

PHI3 = gpt_family(
    "phi3", architecture="Phi3ForCausalLM", model_type="phi3",
    config=GPT_CONFIG.extend(sliding_window(), rope(partial=True),
                             harmless=("embd_pdrop", "resid_pdrop", "original_max_position_embeddings",
                                       "attention_bias")),  # transformers' Phi-3 has no biases either way
    features=GPTFeatures(packed_qkv=True, packed_gate_up=True),
    claims=never,  # NeMo 1 has no Phi-3; NeMo 2 names it (nemo2_targets)
    nemo2_targets=("nemo.collections.llm.gpt.model.phi3mini.Phi3Model",), nemo2_configs=NEMO2_CONFIGS,
    description="Phi-3 mini/medium 4k (fused qkv_proj and gate_up_proj, sliding window)",
    megatron_bridge=MEGATRON_BRIDGE)
