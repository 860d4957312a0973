"""The NeMo 2 config classes Gemma reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/gemma.py``),
each with its field defaults; NeMo writes only the arguments a class was called with."""

from __future__ import annotations

from typing import Any

_GEMMA = "nemo.collections.llm.gpt.model.gemma."

#: ``GemmaConfig`` (lines 42-61): RMSNorm with zero-centred gamma, gated ``openai_gelu`` (the
#: tanh GeLU), RoPE, no linear biases, tied, ``kv_channels`` 256 (not hidden / heads), context
#: 8192. ``GemmaModel.configure_model`` (lines 111-124) scales the embedding by sqrt(hidden)
#: (``EmbeddingScalingMixin``): read as Megatron-Bridge's ``GemmaModelProvider``, which does too.
GEMMA_CONFIG: dict[str, Any] = {
    "_target_": "megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider",
    "normalization": "RMSNorm", "activation_func": "nemo.collections.llm.fn.activation.openai_gelu",
    "gated_linear_unit": True, "position_embedding_type": "rope", "add_bias_linear": False, "seq_length": 8192,
    "kv_channels": 256, "share_embeddings_and_output_weights": True, "layernorm_zero_centered_gamma": True}

#: ``GemmaConfig2B`` and ``GemmaConfig7B`` (lines 64-83).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _GEMMA + "GemmaConfig": GEMMA_CONFIG,
    _GEMMA + "GemmaConfig2B": {**GEMMA_CONFIG, "num_layers": 18, "hidden_size": 2048, "num_attention_heads": 8,
                               "num_query_groups": 1, "ffn_hidden_size": 16384},
    _GEMMA + "GemmaConfig7B": {**GEMMA_CONFIG, "num_layers": 28, "hidden_size": 3072, "num_attention_heads": 16,
                               "num_query_groups": 16, "ffn_hidden_size": 24576},
}
