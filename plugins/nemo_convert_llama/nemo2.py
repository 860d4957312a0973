"""The NeMo 2 config classes Llama reads: each class's field defaults (NeMo 8cfedd7
``nemo/collections/llm/gpt/model/llama.py``), its own over those it inherits; NeMo writes only
the arguments a class was called with, so an absent field is this default."""

from __future__ import annotations

from typing import Any

_LLAMA = "nemo.collections.llm.gpt.model.llama."

#: ``LlamaConfig`` (lines 57-82): RMSNorm, gated SiLU, RoPE, no linear biases, untied, context 4096.
LLAMA_CONFIG: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "gated_linear_unit": True,
    "position_embedding_type": "rope", "add_bias_linear": False, "seq_length": 4096,
    "share_embeddings_and_output_weights": False, "bias_activation_fusion": True}
#: ``Llama3Config`` (lines 130-156): eight query groups, ``init_method_std`` 0.01.
LLAMA3_CONFIG: dict[str, Any] = {**LLAMA_CONFIG, "num_query_groups": 8, "init_method_std": 0.01,
                                 "layernorm_epsilon": 1e-5, "rotary_percent": 1.0}
#: ``Llama31Config`` (lines 159-171): llama3 RoPE scaling, factor 8 over an 8192 context.
LLAMA31_CONFIG: dict[str, Any] = {**LLAMA3_CONFIG, "scale_factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "old_context_len": 8192, "init_method_std": 0.02}


def _sized(base: dict[str, Any], layers: int, hidden: int, heads: int, ffn: int, **more: Any) -> dict[str, Any]:
    return {**base, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn, **more}


_LLAMA3_SIZED = {"rotary_base": 500_000, "seq_length": 8192}
_LLAMA31_SIZED = {"rotary_base": 500_000, "seq_length": 131072}

#: The Llama classes (lines 85-128 Llama 2, 198-229 Llama 3, 232-283 Llama 3.1, 285-320
#: Llama 3.2).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _LLAMA + "LlamaConfig": LLAMA_CONFIG,
    _LLAMA + "Llama2Config7B": _sized(LLAMA_CONFIG, 32, 4096, 32, 11008, num_query_groups=32),
    _LLAMA + "Llama2Config13B": _sized(LLAMA_CONFIG, 40, 5120, 40, 13824, num_query_groups=40),
    _LLAMA + "Llama2Config70B": _sized(LLAMA_CONFIG, 80, 8192, 64, 28672, num_query_groups=8),
    _LLAMA + "Llama3Config": LLAMA3_CONFIG,
    _LLAMA + "Llama3Config8B": _sized(LLAMA3_CONFIG, 32, 4096, 32, 14336, **_LLAMA3_SIZED),
    _LLAMA + "Llama3Config70B": _sized(LLAMA3_CONFIG, 80, 8192, 64, 28672, **_LLAMA3_SIZED, init_method_std=0.008944),
    _LLAMA + "Llama31Config": LLAMA31_CONFIG,
    _LLAMA + "Llama31Config8B": _sized(LLAMA31_CONFIG, 32, 4096, 32, 14336, **_LLAMA31_SIZED),
    _LLAMA + "Llama31Config70B": _sized(LLAMA31_CONFIG, 80, 8192, 64, 28672, **_LLAMA31_SIZED),
    _LLAMA + "Llama31Config405B": _sized(LLAMA31_CONFIG, 126, 16384, 128, 53248, **_LLAMA31_SIZED),
    _LLAMA + "Llama32Config1B": _sized(LLAMA31_CONFIG, 16, 2048, 32, 8192, **_LLAMA31_SIZED, scale_factor=32.0,
                                       share_embeddings_and_output_weights=True, num_query_groups=8),
    _LLAMA + "Llama32Config3B": _sized(LLAMA31_CONFIG, 28, 3072, 24, 8192, **_LLAMA31_SIZED, scale_factor=32,
                                       share_embeddings_and_output_weights=True, num_query_groups=8),
}
