"""The NeMo 2 config classes Qwen3-MoE reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/qwen3.py``),
each with its field defaults; NeMo writes only the arguments a class was called with."""

from __future__ import annotations

from typing import Any

_QWEN3 = "nemo.collections.llm.gpt.model.qwen3."

#: ``Qwen2Config`` (``qwen2.py`` lines 37-56) under ``Qwen3Config`` (``qwen3.py`` lines 38-49) under
#: ``Qwen3MoEConfig`` (lines 52-65): 128 experts, top-8, softmax after the top-k.
QWEN3_MOE_CONFIG: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "gated_linear_unit": True,
    "add_bias_linear": False, "seq_length": 4096, "init_method_std": 0.02,
    "share_embeddings_and_output_weights": False, "layernorm_epsilon": 1e-6, "rotary_base": 1000000.0,
    "position_embedding_type": "rope",
    "add_qkv_bias": False, "qk_layernorm": True, "kv_channels": 128, "num_query_groups": 8,
    "max_position_embeddings": 40960, "vocab_size": 151936,
    "num_moe_experts": 128, "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 1e-3,
    "moe_router_topk": 8, "moe_router_pre_softmax": False, "moe_grouped_gemm": True,
    "moe_token_dispatcher_type": "alltoall", "moe_permute_fusion": True}

#: ``Qwen3Config30B_A3B`` and ``Qwen3Config235B_A22B`` (lines 143-168).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _QWEN3 + "Qwen3MoEConfig": QWEN3_MOE_CONFIG,
    _QWEN3 + "Qwen3Config30B_A3B": {**QWEN3_MOE_CONFIG, "num_layers": 48, "hidden_size": 2048,
                                    "num_attention_heads": 32, "num_query_groups": 4, "ffn_hidden_size": 6144,
                                    "moe_ffn_hidden_size": 768},
    _QWEN3 + "Qwen3Config235B_A22B": {**QWEN3_MOE_CONFIG, "num_layers": 94, "hidden_size": 4096,
                                      "num_attention_heads": 64, "num_query_groups": 4, "ffn_hidden_size": 12288,
                                      "moe_ffn_hidden_size": 1536},
}
