"""Gemma 2 (``Gemma2ForCausalLM``): Gemma's zero-centred norms, scaled and tied embedding
and tanh GeGLU, plus four norms a layer, ``query_pre_attn_scalar``, soft-capped attention
scores and logits, and a sliding window on every other layer.

transformers 5.24 ``models/gemma2/modeling_gemma2.py``: the MLP runs
``ACT2FN[config.hidden_activation]`` (line 78; ``hidden_act`` is never read); the scores
are scaled by ``query_pre_attn_scalar**-0.5`` (line 221) and capped by
``attn_logit_softcapping`` (lines 195-198, 237); a layer normalises its input
(``input_layernorm``), the attention output (``post_attention_layernorm``), the MLP input
(``pre_feedforward_layernorm``) and the MLP output (``post_feedforward_layernorm``) (lines
291-326); the logits are capped by ``final_logit_softcapping`` (lines 520-523);
``configuration_gemma2.py`` lines 93-97: layer i is ``sliding_attention`` when i is even.

Megatron-Core names (Megatron-Bridge ``067f987d``
``src/megatron/bridge/models/gemma/gemma2_bridge.py`` lines 93-100): the post-norms are
``self_attention.linear_proj.post_layernorm`` and ``mlp.linear_fc2.post_layernorm``; the
provider fields ``query_pre_attn_scalar``, ``attn_logit_softcapping``,
``final_logit_softcapping``, ``window_size = (sliding_window - 1, 0)`` on odd (1-based)
layers (``gemma2_provider.py`` lines 127-129, 497-499): the class's own layer pattern (its
``window_attn_skip_freq`` is not read), which is HF's default ``layer_types``.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.families import (DENSE, DENSE_CLASS_DEFAULTS, FAST_GELU, GPT_CONFIG, NO_LINEAR_BIAS, Check, Derived,
                                   Field, GPTFeatures, ProviderFamily, activation, gpt_family, layer_windows,
                                   linear_biases, query_pre_attn_scalar, softcap)
from nemo_convert.spec import spec_of


def _alternating(hf: dict[str, Any]) -> list[str]:
    """``Gemma2Config.__post_init__``'s default ``layer_types``: sliding on even layers."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(int(hf["num_hidden_layers"]))]


def _hidden_act(hf: dict[str, Any]) -> str | None:
    """``hidden_act`` is never read by ``Gemma2ForCausalLM`` (it runs ``hidden_activation``);
    the published configs repeat the same value. A different one is ambiguous: refused."""
    value, runs = hf.get("hidden_act"), hf.get("hidden_activation", "gelu_pytorch_tanh")
    if value is None or value == runs:
        return None
    return f"hidden_act={value!r} differs from hidden_activation={runs!r} (Gemma2ForCausalLM runs the second)"


def _window_size_key(hf: dict[str, Any]) -> str | None:
    """``sliding_window_size``: a key the first published configs (transformers
    4.42.0.dev0) carry beside ``sliding_window``; no released ``Gemma2Config`` reads it (5.24
    ``configuration_gemma2.py`` lines 67-91 has no such field). Equal to ``sliding_window`` it
    is a duplicate; different, which one a reader runs is ambiguous: refused."""
    value = hf.get("sliding_window_size")
    if value is None or value == hf.get("sliding_window", 4096):
        return None
    return f"sliding_window_size={value!r} differs from sliding_window={hf.get('sliding_window', 4096)!r}"


def _nemo1_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    """NeMo 1's spelling beside ours, so that NeMo 1 restores the ``.nemo`` with its Gemma 2
    layer spec: ``name: megatron_gemma2`` and ``mcore_customization_config`` (NeMo ``8c8bf720``
    ``scripts/checkpoint_converters/convert_gemma2_hf_to_nemo.py``, ``adjust_nemo_config``)."""
    keys = (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0), ("query_pre_attn_scalar", 256))
    return {"name": "megatron_gemma2",
            "mcore_customization_config": {k: hf[k] if k in hf else d for k, d in keys}}


GEMMA2_CONFIG = GPT_CONFIG.extend(
    activation("gelu_pytorch_tanh", "geglu", key="hidden_activation"),
    Check(("hidden_act",), _hidden_act),
    linear_biases("attention_bias", None),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", True, to_nemo=bool, to_hf=bool),
    Field("rms_norm_eps", "layernorm_epsilon", 1e-6, to_nemo=float, to_hf=float),
    Field("max_position_embeddings", "max_position_embeddings", 8192, to_nemo=int, to_hf=int,
          nemo_default=lambda c: c.get("encoder_seq_length")),
    Field("max_position_embeddings", "encoder_seq_length", 8192, to_nemo=int, to_hf=None),
    query_pre_attn_scalar(256),
    softcap("attn_logit_softcapping", 50.0, lambda spec: spec.attention.logit_softcap),
    softcap("final_logit_softcapping", 30.0, lambda spec: spec.final_logit_softcap),
    layer_windows(_alternating),
    Check(("sliding_window_size",), _window_size_key),
    Derived((), _nemo1_to_nemo, lambda cfg: {}),
    Check(("use_bidirectional_attention",), lambda hf: "use_bidirectional_attention=True"
          if hf.get("use_bidirectional_attention") else None),
    # transformers' generation cache choice (a sliding + full "hybrid" cache): not the model's math
    harmless=("cache_implementation",),
    nemo_constants={"layernorm_zero_centered_gamma": True, "openai_gelu": True, "apply_embedding_scaling": True,
                    "nemo_convert.post_norms": True},
)


def _odd_layers(layers: int) -> tuple[bool, ...]:
    """The layers ``Gemma2DotProductAttention`` windows: ``layer_number % 2 == 1``
    (Megatron-Bridge ``067f987d`` ``gemma/gemma2_provider.py`` lines 125-129) on Megatron-Core's
    1-based global layer number (megatron-core 0.16.1 ``transformer/transformer_block.py``
    line 369 ``build_layer(layer_spec, i + 1)``, ``transformer_layer.py`` line 280 adds the
    pipeline offset, ``attention.py`` line 320 passes it on): the 0-based even layers, HF's
    default ``layer_types`` (:func:`_alternating`)."""
    return tuple(i % 2 == 0 for i in range(layers))


#: ``--to megatron-bridge``: Megatron-Bridge ``067f987d`` ``gemma/gemma2_bridge.py`` lines 47-66
#: builds a ``Gemma2ModelProvider`` with HF's ``query_pre_attn_scalar``, both soft-caps,
#: ``window_size = (sliding_window - 1, 0)``, RMSNorm, tanh GeGLU (``fast_gelu``), no linear
#: biases, tied embeddings and zero-centred norms; ``gemma2_provider.py`` lines 466-499 are the
#: class's defaults, its ``provide()`` scales the embedding by sqrt(hidden) (lines 514-518) and
#: caps the logits (lines 520-524, 410-417); its layer spec (lines 438-463) has the post-norms
#: (``linear_proj.post_layernorm``, ``linear_fc2.post_layernorm``: ``models/common/te_layers.py``
#: lines 26-57 adds ``post_layernorm`` to Transformer Engine's row-parallel linear, whose
#: checkpoint keys it keeps: the names our dist keys have) and windows the odd 1-based layers itself (:func:`_odd_layers`): a model windowing
#: other layers is refused by name.
GEMMA2_PROVIDER = "megatron.bridge.models.gemma.gemma2_provider.Gemma2ModelProvider"
MEGATRON_BRIDGE = ProviderFamily(
    GEMMA2_PROVIDER, DENSE + NO_LINEAR_BIAS + (("activation_func", FAST_GELU), ("layernorm_zero_centered_gamma", True),
                                               ("share_embeddings_and_output_weights", True)),
    nemo=(("apply_embedding_scaling", True),),
    defaults=tuple({**DENSE_CLASS_DEFAULTS, "activation_func": FAST_GELU, "seq_length": 8192, "kv_channels": 256,
                    "share_embeddings_and_output_weights": True, "layernorm_zero_centered_gamma": True,
                    "layernorm_epsilon": 1e-6, "rotary_base": 10000.0, "window_size": [4095, 0],
                    "vocab_size": 256000, "query_pre_attn_scalar": 224, "attn_logit_softcapping": 50.0,
                    "final_logit_softcapping": 30.0}.items()),
    softcaps=True, post_norms=True, window_layers=_odd_layers)


def _claims(cfg: dict[str, Any]) -> bool:
    spec = spec_of(cfg)
    return spec.block.post_norms and not spec.attention.qk_norm


GEMMA2 = gpt_family(
    "gemma2", architecture="Gemma2ForCausalLM", model_type="gemma2", config=GEMMA2_CONFIG,
    features=GPTFeatures(zero_centred_norms=True, post_norms=True), claims=_claims,
    megatron_bridge=MEGATRON_BRIDGE,
    description="Gemma 2 (four norms a layer, soft-capped scores and logits, query_pre_attn_scalar, windows)",
)
