"""Megatron-Bridge's own Llama provider classes, read (never written).

Released Megatron-Bridge up to v0.3.1 had one provider dataclass per Llama model in
``src/megatron/bridge/models/llama/llama_provider.py``; commit 217de1a2e (2026-03-16, first
released in v0.4.0) removed them, since when ``LlamaBridge`` builds the generic
``GPTModelProvider``. A ``run_config.yaml`` those releases wrote names one of these classes as
its ``_target_``, and a field it leaves out means that class's default. Each class's defaults
below are its own over those it inherits, with the line numbers of that file at
``217de1a2e~1`` (dc805f5c); only the fields the provider table reads are listed (the fusion
switches other than ``bias_activation_fusion`` are not math).

RoPE scaling comes in two spellings of the same llama3 math. At ``217de1a2e~1`` (and in
v0.3.1), ``Llama31ModelProvider`` sets Megatron-Core's ``rope_scaling: True`` with
``rope_scaling_factor: 8.0`` (lines 136-137), the 3.2 classes factor 32 (lines 239, 259) —
the defaults below. v0.1.0a0 to v0.3.0 spelled it as NeMo 2 does, ``scale_factor`` 8 /
``low_freq_factor`` 1 / ``high_freq_factor`` 4 / ``old_context_len`` 8192 applied in the
class's ``provide()`` (v0.3.0 lines 135-171; 32 for the 3.2 classes, lines 271, 291;
changed by 30489d616); those releases' ``GPTModelProvider`` had no ``rope_scaling`` field,
so their full sections carry ``scale_factor`` and the like, which the provider table reads
over these defaults. No release wrote ``megatron.hub`` targets: the package was renamed to
``megatron.bridge`` (958fb9b7d) before v0.1.0a0.

Llama 4 (``Llama4ModelProvider`` line 323 and its ``Experts16`` / ``Experts128`` classes,
lines 363, 375: mixture of experts, chunked attention, ``nope_layer_interval``, L2 q/k norms)
is a model this family does not compute: it is not declared, and the module rule
(``ProviderFamily.modules``) refuses it by name rather than reading it as a plain GPT.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.families import DENSE_CLASS_DEFAULTS

#: The module of the per-model classes (and of the Llama package: any other class there is refused).
MODULE = "megatron.bridge.models.llama.llama_provider."
PACKAGE = "megatron.bridge.models.llama."


def _sized(base: dict[str, Any], layers: int, hidden: int, heads: int, ffn: int, **more: Any) -> dict[str, Any]:
    return {**base, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn, **more}


#: ``LlamaModelProvider`` (lines 26-50): RMSNorm, gated SiLU, RoPE, no linear biases, untied,
#: context 4096, no dropout, fused bias-activation.
LLAMA: dict[str, Any] = {**DENSE_CLASS_DEFAULTS, "seq_length": 4096, "attention_dropout": 0.0, "hidden_dropout": 0.0,
                         "bias_activation_fusion": True}
#: ``Llama2ModelProvider7B`` / ``13B`` / ``70B`` (lines 54-95).
LLAMA2_7B = _sized(LLAMA, 32, 4096, 32, 11008, num_query_groups=32)
LLAMA2_13B = _sized(LLAMA, 40, 5120, 40, 13824, num_query_groups=40)
LLAMA2_70B = _sized(LLAMA, 80, 8192, 64, 28672, num_query_groups=8)
#: ``Llama3ModelProvider`` (lines 99-124): eight query groups, ``init_method_std`` 0.01.
LLAMA3: dict[str, Any] = {**LLAMA, "num_query_groups": 8, "init_method_std": 0.01, "layernorm_epsilon": 1e-5,
                          "rotary_percent": 1.0}
#: ``Llama31ModelProvider`` (lines 128-138): llama3 RoPE scaling at factor 8.
LLAMA31: dict[str, Any] = {**LLAMA3, "rope_scaling": True, "rope_scaling_factor": 8.0, "init_method_std": 0.02}
_LONG = {"rotary_base": 500_000, "seq_length": 131072}

#: Every class read, by its ``_target_``.
CLASSES: dict[str, dict[str, Any]] = {
    MODULE + "LlamaModelProvider": LLAMA,
    MODULE + "Llama2ModelProvider7B": LLAMA2_7B,
    MODULE + "Llama2ModelProvider13B": LLAMA2_13B,
    MODULE + "Llama2ModelProvider70B": LLAMA2_70B,
    MODULE + "Llama3ModelProvider": LLAMA3,
    MODULE + "Llama31ModelProvider": LLAMA31,
    # lines 142-174
    MODULE + "Llama3ModelProvider8B": _sized(LLAMA3, 32, 4096, 32, 14336, rotary_base=500_000, seq_length=8192),
    MODULE + "Llama3ModelProvider70B": _sized(LLAMA3, 80, 8192, 64, 28672, rotary_base=500_000, seq_length=8192,
                                              init_method_std=0.008944, make_vocab_size_divisible_by=128),
    # lines 178-228
    MODULE + "Llama31ModelProvider8B": _sized(LLAMA31, 32, 4096, 32, 14336, **_LONG),
    MODULE + "Llama31ModelProvider70B": _sized(LLAMA31, 80, 8192, 64, 28672, **_LONG,
                                               make_vocab_size_divisible_by=128),
    MODULE + "Llama31ModelProvider405B": _sized(LLAMA31, 126, 16384, 128, 53248, **_LONG,
                                                make_vocab_size_divisible_by=128),
    # lines 232-268: factor 32, tied embeddings
    MODULE + "Llama32ModelProvider1B": _sized(LLAMA31, 16, 2048, 32, 8192, **_LONG, rope_scaling_factor=32.0,
                                              share_embeddings_and_output_weights=True, num_query_groups=8,
                                              make_vocab_size_divisible_by=128),
    MODULE + "Llama32ModelProvider3B": _sized(LLAMA31, 28, 3072, 24, 8192, **_LONG, rope_scaling_factor=32.0,
                                              share_embeddings_and_output_weights=True, num_query_groups=8,
                                              make_vocab_size_divisible_by=128),
    # lines 272-319: Llama 2's sizes with base 1e6 and context 16384 (70B: Llama 2's as it is)
    MODULE + "CodeLlamaModelProvider7B": {**LLAMA2_7B, "rotary_base": 1_000_000, "seq_length": 16384},
    MODULE + "CodeLlamaModelProvider13B": {**LLAMA2_13B, "rotary_base": 1_000_000, "seq_length": 16384},
    MODULE + "CodeLlamaModelProvider34B": _sized(LLAMA, 48, 8192, 64, 22016, num_query_groups=8,
                                                 rotary_base=1_000_000, seq_length=16384),
    MODULE + "CodeLlamaModelProvider70B": LLAMA2_70B,
}

#: :attr:`ProviderFamily.reads`: each class with its defaults.
READS: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = tuple(
    (target, tuple(defaults.items())) for target, defaults in CLASSES.items())
