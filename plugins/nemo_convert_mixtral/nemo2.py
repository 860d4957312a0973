"""The NeMo 2 config classes Mixtral reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/mixtral.py``),
each with its field defaults; NeMo writes only the arguments a class was called with."""

from __future__ import annotations

from typing import Any

_MIXTRAL = "nemo.collections.llm.gpt.model.mixtral."

#: ``MixtralConfig`` (lines 35-78): RMSNorm, gated SiLU, RoPE base 1e6, no biases, untied, 8
#: experts top-2 routed with softmax after the top-k, Mixtral 8x7B's sizes, bf16.
MIXTRAL_CONFIG: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "position_embedding_type": "rope",
    "add_bias_linear": False, "gated_linear_unit": True, "num_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_query_groups": 8, "ffn_hidden_size": 14336, "max_position_embeddings": 4096,
    "seq_length": 4096, "share_embeddings_and_output_weights": False, "num_moe_experts": 8,
    "moe_aux_loss_coeff": 0.01, "moe_router_topk": 2, "moe_router_pre_softmax": False,
    "moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "aux_loss", "init_method_std": 0.02,
    "layernorm_epsilon": 1e-5, "rotary_percent": 1.0, "rotary_base": 1000000.0, "bf16": True,
    "params_dtype": "torch.bfloat16", "bias_activation_fusion": True}

#: ``MixtralConfig8x3B``, ``8x7B``, ``8x22B`` (lines 81-122).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _MIXTRAL + "MixtralConfig": MIXTRAL_CONFIG,
    _MIXTRAL + "MixtralConfig8x3B": {**MIXTRAL_CONFIG, "num_layers": 32, "hidden_size": 2560,
                                     "num_attention_heads": 32, "ffn_hidden_size": 8960},
    _MIXTRAL + "MixtralConfig8x7B": {**MIXTRAL_CONFIG, "num_layers": 32, "hidden_size": 4096,
                                     "ffn_hidden_size": 14336},
    _MIXTRAL + "MixtralConfig8x22B": {**MIXTRAL_CONFIG, "num_layers": 56, "hidden_size": 6144,
                                      "num_attention_heads": 48, "ffn_hidden_size": 16384},
}
