"""The NeMo 2 config classes Phi-3 reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/phi3mini.py``),
each with its field defaults; NeMo writes only the arguments a class was called with."""

from __future__ import annotations

from typing import Any

_PHI3 = "nemo.collections.llm.gpt.model.phi3mini."

#: ``Phi3Config`` (lines 34-45): RMSNorm, gated SiLU, RoPE, no linear biases, untied, context 4096.
PHI3_CONFIG: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "gated_linear_unit": True,
    "position_embedding_type": "rope", "add_bias_linear": False, "seq_length": 4096,
    "share_embeddings_and_output_weights": False}

#: ``Phi3ConfigMini`` (lines 48-57).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _PHI3 + "Phi3Config": PHI3_CONFIG,
    _PHI3 + "Phi3ConfigMini": {**PHI3_CONFIG, "num_layers": 32, "hidden_size": 3072, "ffn_hidden_size": 8192,
                               "num_attention_heads": 32, "num_query_groups": 32, "rotary_base": 10000.0,
                               "vocab_size": 32064},
}
