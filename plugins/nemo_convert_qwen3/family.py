"""Qwen3 (dense): Llama's block with per-head RMSNorms on queries and keys.

``self_attn.q_norm`` / ``k_norm`` ⇄ ``self_attention.q_layernorm`` / ``k_layernorm``
(Megatron's ``qk_layernorm``); ``head_dim`` is its own field (not hidden / heads).
"""

from nemo_convert.families import GPT_CONFIG, Check, GPTFeatures, gpt_family, linear_biases, no_per_layer_windows
from nemo_convert.families.trtllm import gpt_trtllm, qwen_fields
from nemo_convert.spec import spec_of

QWEN3 = gpt_family(
    "qwen3", architecture="Qwen3ForCausalLM", model_type="qwen3",
    config=GPT_CONFIG.extend(
        linear_biases("attention_bias", None),
        Check(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"), no_per_layer_windows),
        nemo_constants={"qk_layernorm": True}),
    features=GPTFeatures(qk_norm=True),
    claims=lambda cfg: spec_of(cfg).attention.qk_norm,
    nemo2_targets=("nemo.collections.llm.gpt.model.qwen3.Qwen3Model",),
    trtllm=gpt_trtllm("Qwen3ForCausalLM", qwen_fields("qwen3")),  # TensorRT-LLM's QWenForCausalLM
    description="Qwen3 dense (GQA, q/k RMSNorm, head_dim of its own)",
)
