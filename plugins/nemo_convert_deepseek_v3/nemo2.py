"""The NeMo 2 config classes DeepSeek-V3 reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/deepseek.py``),
each with its field defaults; NeMo writes only the arguments a class was called with
(``HFDeepSeekImporter.config``, lines 405-453, passes no RoPE field)."""

from __future__ import annotations

from typing import Any

from nemo_convert.families import MLA_PROVIDER

_DEEPSEEK = "nemo.collections.llm.gpt.model.deepseek."
_FN = "torch.nn.functional."

#: ``DeepSeekConfig`` (lines 58-130): a Megatron-Core ``MLATransformerConfig`` subclass, read as
#: Megatron-Bridge's ``MLAModelProvider`` it equals field for field (``multi_latent_attention``,
#: megatron-core 0.16.1 ``transformer_config.py`` line 2013) — YaRN (MLATransformerConfig's
#: ``rope_type: yarn``, original context 4096, betas 32 / 1) at ``rotary_scaling_factor`` 40 with
#: ``mscale`` and ``mscale_all_dim`` 1: DeepSeek-V3's.
DEEPSEEK_CONFIG: dict[str, Any] = {
    "_target_": MLA_PROVIDER, "multi_latent_attention": True,
    "normalization": "RMSNorm", "activation_func": {"_target_": _FN + "silu", "_call_": False},
    "gated_linear_unit": True, "position_embedding_type": "rope", "add_bias_linear": False,
    "share_embeddings_and_output_weights": False, "num_attention_heads": 128, "kv_channels": 128,
    "max_position_embeddings": 4096, "seq_length": 4096, "rotary_base": 10000.0, "make_vocab_size_divisible_by": 3200,
    "qk_layernorm": True, "moe_grouped_gemm": True, "moe_router_pre_softmax": True,
    "moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "seq_aux_loss", "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
    "rotary_scaling_factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "init_method_std": 0.006,
    "layernorm_epsilon": 1e-6, "bf16": True, "params_dtype": {"_target_": "torch.bfloat16", "_call_": False},
}

#: ``DeepSeekV3Config`` (lines 181-205). DeepSeek-V2's classes (lines 136-178) route with softmax
#: scores, which no family here runs: not declared, so refused by name.
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _DEEPSEEK + "DeepSeekConfig": DEEPSEEK_CONFIG,
    _DEEPSEEK + "DeepSeekV3Config": {
        **DEEPSEEK_CONFIG, "num_layers": 61, "hidden_size": 7168, "ffn_hidden_size": 18432, "num_moe_experts": 256,
        "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048, "moe_layer_freq": [0] * 3 + [1] * 58,
        "moe_router_topk": 8, "moe_router_num_groups": 8, "moe_router_group_topk": 4,
        "moe_router_topk_scaling_factor": 2.5, "moe_aux_loss_coeff": 1e-4, "make_vocab_size_divisible_by": 1280,
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
}
