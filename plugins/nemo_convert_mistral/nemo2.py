"""The NeMo 2 config classes Mistral reads (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/mistral.py``),
each with its field defaults; NeMo writes only the arguments a class was called with
(``HFMistralImporter.config``, lines 181-219, calls ``MistralConfig7B``)."""

from __future__ import annotations

from typing import Any

_MISTRAL = "nemo.collections.llm.gpt.model.mistral."

#: ``MistralConfig7B`` (lines 38-64): RMSNorm, gated SiLU, RoPE, no biases, untied, 32 layers of
#: 4096 with 8 query groups, a 4096 window (``[4096, 0]``), context 32768, bf16 parameters.
MISTRAL_7B: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": "torch.nn.functional.silu", "position_embedding_type": "rope",
    "add_bias_linear": False, "gated_linear_unit": True, "num_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_query_groups": 8, "ffn_hidden_size": 14336, "seq_length": 32768,
    "share_embeddings_and_output_weights": False, "init_method_std": 0.02, "layernorm_epsilon": 1e-5,
    "window_size": [4096, 0], "params_dtype": "torch.bfloat16"}
_NEMO = {"kv_channels": 128, "seq_length": 4096, "window_size": None, "rotary_percent": 1.0,
         "rotary_base": 1000000.0}

#: ``MistralNeMoConfig12B`` and ``MistralNeMoConfig123B`` (lines 67-102).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _MISTRAL + "MistralConfig7B": MISTRAL_7B,
    _MISTRAL + "MistralNeMoConfig12B": {**MISTRAL_7B, **_NEMO, "num_layers": 40, "hidden_size": 5120},
    _MISTRAL + "MistralNeMoConfig123B": {**MISTRAL_7B, **_NEMO, "num_layers": 88, "hidden_size": 12288,
                                         "ffn_hidden_size": 28672, "num_attention_heads": 96},
}
