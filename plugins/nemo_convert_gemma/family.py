"""Gemma (1): GeGLU with tanh-GeLU, zero-centred RMSNorms, tied and scaled embeddings.

HF computes every norm as ``rmsnorm(x)·(1 + w)`` and stores ``w``: we store ``w`` as it is
with ``layernorm_zero_centered_gamma: true`` (NeMo 2 / Megatron-Bridge). NeMo 1's
converter stored ``1 + w`` without the flag; such a ``.nemo`` is read back by
subtracting 1. The embedding is scaled by sqrt(hidden) in the model
(``apply_embedding_scaling``), never in the weights.

The activation is the tanh GeLU whichever way the config spells it: the published Gemma
configs say ``hidden_act: "gelu"``, and transformers runs it as ``gelu_pytorch_tanh``
(transformers 5.24 ``models/gemma/configuration_gemma.py`` lines 88-94,
``GemmaConfig.__post_init__``: "a legacy value of the official releases but it is meant to
target the tanh approximation", with a warning). NeMo runs ``activation: geglu`` with
``openai_gelu: true``, which takes precedence (NeMo ``8cfedd72``
``nemo/collections/nlp/parts/utils_funcs.py`` lines 197-200) and is the tanh formula
(``nemo/collections/nlp/modules/common/megatron/utils.py`` lines 169-175). Export keeps
the source's spelling; a synthesised ``config.json`` says ``gelu_pytorch_tanh``.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import (Check, DENSE, DENSE_CLASS_DEFAULTS, Derived, FAST_GELU, Field, GPTFeatures,
                                   GPT_CONFIG, NO_LINEAR_BIAS, ProviderFamily, gpt_family, linear_biases)
from nemo_convert.spec import spec_of
from nemo_convert_gemma.nemo2 import NEMO2_CONFIGS

#: ``hidden_act`` values transformers' ``GemmaConfig`` runs as the tanh GeLU.
TANH_GELU_SPELLINGS = ("gelu_pytorch_tanh", "gelu")


def _act_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    value = hf.get("hidden_act")
    if value is not None and value not in TANH_GELU_SPELLINGS:
        raise UnsupportedError(f"hidden_act={value!r} is not supported by family gemma (GemmaForCausalLM runs "
                               "gelu_pytorch_tanh; 'gelu' is read as it)")
    return {"activation": "geglu"}


def _act_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"hidden_act": "gelu_pytorch_tanh"}


def _hidden_activation(hf: dict[str, Any]) -> str | None:
    """transformers 4.39-4.47 ran ``hidden_activation`` (tanh GeLU when null); 5.x reads
    ``hidden_act`` only. Only the tanh GeLU means the same model in both."""
    value = hf.get("hidden_activation")
    if value in (None, "gelu_pytorch_tanh"):
        return None
    return f"hidden_activation={value!r} (transformers 4.4x would run it, 5.x runs hidden_act instead)"


GEMMA_CONFIG = GPT_CONFIG.extend(
    Derived(("hidden_act",), _act_to_nemo, _act_to_hf),
    linear_biases("attention_bias", None),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", True, to_nemo=bool, to_hf=bool),
    Check(("hidden_activation",), _hidden_activation),
    Check(("use_bidirectional_attention",), lambda hf: "use_bidirectional_attention=True"
          if hf.get("use_bidirectional_attention") else None),
    nemo_constants={"layernorm_zero_centered_gamma": True, "openai_gelu": True, "apply_embedding_scaling": True},
)

#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``gemma/gemma_bridge.py`` lines 31-78 builds a
#: ``GemmaModelProvider`` (``gemma/gemma_provider.py`` lines 27-54: its defaults) whose ``provide()``
#: scales the embedding by sqrt(hidden) (lines 56-80): read back as ``apply_embedding_scaling``.
GEMMA_PROVIDER = "megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider"
MEGATRON_BRIDGE = ProviderFamily(
    GEMMA_PROVIDER, DENSE + NO_LINEAR_BIAS + (("activation_func", FAST_GELU), ("layernorm_zero_centered_gamma", True),
                                              ("share_embeddings_and_output_weights", True)),
    nemo=(("apply_embedding_scaling", True),),
    defaults=tuple({**DENSE_CLASS_DEFAULTS, "activation_func": FAST_GELU, "seq_length": 8192, "kv_channels": 256,
                    "share_embeddings_and_output_weights": True, "layernorm_zero_centered_gamma": True,
                    "layernorm_epsilon": 1e-6, "bf16": True, "params_dtype": "torch.bfloat16"}.items()),
    modules=("megatron.bridge.models.gemma.",))

GEMMA = gpt_family(
    "gemma", architecture="GemmaForCausalLM", model_type="gemma", config=GEMMA_CONFIG,
    features=GPTFeatures(zero_centred_norms=True),
    claims=lambda cfg: spec_of(cfg).embedding.scaled or spec_of(cfg).norm.zero_centred,
    nemo2_targets=("nemo.collections.llm.gpt.model.gemma.GemmaModel",), nemo2_configs=NEMO2_CONFIGS,
    description="Gemma 2B/7B (GeGLU, zero-centred RMSNorm, tied embeddings scaled by sqrt(hidden))",
    megatron_bridge=MEGATRON_BRIDGE)
