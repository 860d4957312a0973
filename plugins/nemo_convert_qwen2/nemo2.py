"""The NeMo 2 config classes Qwen2 reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/qwen2.py``),
each with its field defaults; NeMo writes only the arguments a class was called with."""

from __future__ import annotations

from typing import Any

_QWEN2 = "nemo.collections.llm.gpt.model.qwen2."

#: ``Qwen2Config`` (lines 37-56): RMSNorm (eps 1e-6), gated SiLU, QKV biases only, RoPE base 1e6,
#: untied, context 4096.
QWEN2_CONFIG: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "gated_linear_unit": True,
    "add_bias_linear": False, "add_qkv_bias": True, "seq_length": 4096, "init_method_std": 0.02,
    "vocab_size": 151936, "share_embeddings_and_output_weights": False, "layernorm_epsilon": 1e-6,
    "rotary_base": 1000000.0, "position_embedding_type": "rope"}


def _sized(layers: int, hidden: int, heads: int, groups: int, ffn: int, **more: Any) -> dict[str, Any]:
    return {**QWEN2_CONFIG, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_query_groups": groups, "ffn_hidden_size": ffn, **more}


_LONG = {"seq_length": 131072}
_Q7 = _sized(28, 3584, 28, 4, 18944, vocab_size=152064)
_Q72 = _sized(80, 8192, 64, 8, 29568, vocab_size=152064, layernorm_epsilon=1e-5)

#: The sized Qwen2 / Qwen2.5 classes (lines 59-194).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _QWEN2 + "Qwen2Config": QWEN2_CONFIG,
    _QWEN2 + "Qwen2Config500M": _sized(24, 896, 14, 2, 4864),
    _QWEN2 + "Qwen25Config500M": _sized(24, 896, 14, 2, 4864, seq_length=32768),
    _QWEN2 + "Qwen2Config1P5B": _sized(28, 1536, 12, 2, 8960),
    _QWEN2 + "Qwen25Config1P5B": _sized(28, 1536, 12, 2, 8960, **_LONG),
    _QWEN2 + "Qwen25Config3B": _sized(36, 2048, 16, 2, 11008, share_embeddings_and_output_weights=True),
    _QWEN2 + "Qwen2Config7B": _Q7,
    _QWEN2 + "Qwen25Config7B": {**_Q7, **_LONG},
    _QWEN2 + "Qwen25Config14B": _sized(48, 5120, 40, 8, 13824, vocab_size=152064, layernorm_epsilon=1e-5, **_LONG),
    _QWEN2 + "Qwen25Config32B": _sized(64, 5120, 40, 8, 27648, vocab_size=152064, layernorm_epsilon=1e-5, **_LONG),
    _QWEN2 + "Qwen2Config72B": _Q72,
    _QWEN2 + "Qwen25Config72B": {**_Q72, **_LONG},
}
