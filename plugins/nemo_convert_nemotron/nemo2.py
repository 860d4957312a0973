"""The NeMo 2 config classes Nemotron reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/nemotron.py``),
each with its field defaults; NeMo writes only the arguments a class was called with."""

from __future__ import annotations

from typing import Any

_NEMOTRON = "nemo.collections.llm.gpt.model.nemotron."

#: ``NemotronConfig`` (lines 37-68): LayerNorm with zero-centred gamma (LayerNorm1P), squared
#: ReLU not gated (``nemo.collections.llm.fn.activation.squared_relu``, line 22), RoPE over half
#: the head, no linear biases, untied, and Nemotron-3 4B's sizes.
NEMOTRON_CONFIG: dict[str, Any] = {
    "normalization": "LayerNorm", "activation_func": "nemo.collections.llm.fn.activation.squared_relu",
    "position_embedding_type": "rope", "share_embeddings_and_output_weights": False, "add_bias_linear": False,
    "rotary_percent": 0.5, "layernorm_zero_centered_gamma": True, "num_layers": 32, "seq_length": 4096,
    "hidden_size": 3072, "ffn_hidden_size": 9216, "num_attention_heads": 24, "num_query_groups": 8,
    "kv_channels": 128, "init_method_std": 0.0134}


def _sized(layers: int, hidden: int, ffn: int, heads: int, groups: int | None, kv: int | None,
           std: float) -> dict[str, Any]:
    return {**NEMOTRON_CONFIG, "num_layers": layers, "seq_length": 4096, "hidden_size": hidden,
            "ffn_hidden_size": ffn, "num_attention_heads": heads, "num_query_groups": groups, "kv_channels": kv,
            "init_method_std": std}


#: The Nemotron-3 and Nemotron-4 classes (lines 71-148).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _NEMOTRON + "NemotronConfig": NEMOTRON_CONFIG,
    _NEMOTRON + "Nemotron3Config4B": _sized(32, 3072, 9216, 24, 8, 128, 0.0134),
    _NEMOTRON + "Nemotron3Config8B": _sized(32, 4096, 16384, 32, None, None, 0.010),
    _NEMOTRON + "Nemotron3Config22B": _sized(40, 6144, 24576, 48, None, None, 0.008),
    _NEMOTRON + "Nemotron4Config15B": _sized(32, 6144, 24576, 48, 8, None, 0.0134),
    _NEMOTRON + "Nemotron4Config340B": _sized(96, 18432, 73728, 96, 8, None, 0.0063),
}
