"""The NeMo 2 config classes Qwen3 (dense) reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/qwen3.py``),
each with its field defaults over ``Qwen2Config``'s (``qwen2.py`` lines 37-56); NeMo writes only the
arguments a class was called with."""

from __future__ import annotations

from typing import Any

_QWEN3 = "nemo.collections.llm.gpt.model.qwen3."

#: ``Qwen2Config`` (``qwen2.py`` lines 37-56) under ``Qwen3Config`` (``qwen3.py`` lines 38-49): no QKV
#: bias, QK LayerNorm, head size 128, eight query groups, 40960 positions.
QWEN3_CONFIG: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "gated_linear_unit": True,
    "add_bias_linear": False, "seq_length": 4096, "init_method_std": 0.02,
    "share_embeddings_and_output_weights": False, "layernorm_epsilon": 1e-6, "rotary_base": 1000000.0,
    "position_embedding_type": "rope",
    "add_qkv_bias": False, "qk_layernorm": True, "kv_channels": 128, "num_query_groups": 8,
    "max_position_embeddings": 40960, "vocab_size": 151936}


def _sized(layers: int, hidden: int, heads: int, ffn: int, **more: Any) -> dict[str, Any]:
    return {**QWEN3_CONFIG, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn, **more}


_TIED = {"share_embeddings_and_output_weights": True}

#: The dense sized classes (lines 68-140).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _QWEN3 + "Qwen3Config": QWEN3_CONFIG,
    _QWEN3 + "Qwen3Config600M": _sized(28, 1024, 16, 3072, **_TIED),
    _QWEN3 + "Qwen3Config1P7B": _sized(28, 2048, 16, 6144, **_TIED),
    _QWEN3 + "Qwen3Config4B": _sized(36, 2560, 32, 9728, **_TIED),
    _QWEN3 + "Qwen3Config8B": _sized(36, 4096, 32, 12288),
    _QWEN3 + "Qwen3Config14B": _sized(40, 5120, 40, 17408),
    _QWEN3 + "Qwen3Config32B": _sized(64, 5120, 64, 25600),
}
