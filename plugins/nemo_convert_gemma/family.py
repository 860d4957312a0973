"""Gemma (1): GeGLU with tanh-GeLU, zero-centred RMSNorms, tied and scaled embeddings.

HF computes every norm as ``rmsnorm(x)·(1 + w)`` and stores ``w``: we store ``w`` as it is
with ``layernorm_zero_centered_gamma: true`` (NeMo 2 / Megatron-Bridge). NeMo 1's
converter stored ``1 + w`` without the flag; such a ``.nemo`` is read back by
subtracting 1. The embedding is scaled by sqrt(hidden) in the model
(``apply_embedding_scaling``), never in the weights.
"""

from nemo_convert.families import GPT_CONFIG, Check, Field, GPTFeatures, activation, gpt_family, linear_biases
from nemo_convert.spec import spec_of

GEMMA_CONFIG = GPT_CONFIG.extend(
    activation("gelu_pytorch_tanh", "geglu"),
    linear_biases("attention_bias", None),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", True, to_nemo=bool, to_hf=bool),
    Check(("hidden_activation",), lambda hf: None if hf.get("hidden_activation") in (None, "gelu_pytorch_tanh")
          else f"hidden_activation={hf['hidden_activation']!r}"),
    Check(("use_bidirectional_attention",), lambda hf: "use_bidirectional_attention=True"
          if hf.get("use_bidirectional_attention") else None),
    nemo_constants={"layernorm_zero_centered_gamma": True, "openai_gelu": True, "apply_embedding_scaling": True},
)

GEMMA = gpt_family(
    "gemma", architecture="GemmaForCausalLM", model_type="gemma", config=GEMMA_CONFIG,
    features=GPTFeatures(zero_centred_norms=True),
    claims=lambda cfg: spec_of(cfg).embedding.scaled or spec_of(cfg).norm.zero_centred,
    nemo2_targets=("nemo.collections.llm.gpt.model.gemma.GemmaModel",),
    description="Gemma 2B/7B (GeGLU, zero-centred RMSNorm, tied embeddings scaled by sqrt(hidden))",
)
