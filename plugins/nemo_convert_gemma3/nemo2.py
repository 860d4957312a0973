"""The NeMo 2 config classes Gemma 3 reads: ``Gemma3Config`` and its sized subclasses (NeMo
8cfedd7 ``nemo/collections/llm/gpt/model/gemma3.py``), each class's own defaults over those it
inherits (``GPTConfig`` / ``TransformerConfig``: :data:`~nemo_convert.formats.nemo2.nemo2.GPT_CONFIG_DEFAULTS`);
NeMo writes only the arguments a class was called with, so an absent field is this default.
``HFGemma3Importer.config`` (lines 508-534) calls a sized class with no arguments and sets
``params_dtype``, ``init_method_std`` and ``generation_config`` afterwards, which ``IOMixin``
does not record (``nemo/lightning/io/mixin.py`` lines 515-547 capture the call's arguments):
an imported folder's ``model.yaml`` names the sized class alone.

They are read as Megatron-Bridge's ``Gemma3ModelProvider`` (the same fields:
``rotary_base = (local, global)``, ``rope_scaling_factor``, an int ``window_size`` of the
windowed layers, ``interleaved_attn_pattern``, ``softmax_scale``), with what NeMo 2's model
does differently:

* ``Gemma3Config.configure_model`` (lines 160-203) scales the embedding by sqrt(hidden)
  (``Gemma3LanguageModelEmbedding``, lines 290-300) and rotates with ``Gemma3RotaryEmbedding``
  (lines 303-341: the global layers' ``inv_freq`` divided by ``rope_scaling_factor``, the local
  ones on ``rotary_base[0]`` unscaled); its layer spec (lines 94-120) always builds the q/k norms
  (``TENorm``) and the post-norms (``TERowParallelLinearLayerNorm``, ``gemma2.py`` lines
  592-614), whatever ``qk_layernorm`` says: declared ``qk_layernorm: true``.
* ``rope_scaling_factor`` is set by the sized classes only; ``TransformerConfig`` (Megatron-Core
  0.16.1) has no such field, so a bare ``Gemma3Config`` without it is not a model NeMo builds
  (``configure_model`` reads it, line 197): refused by name (:func:`read`).
* A layer is windowed when ``layer_number % sum(interleaved_attn_pattern) != 0`` (1-based,
  ``_is_local_attn_layer``, lines 344-349): only the pattern's period counts, so ``(a, b)`` is
  read as ``(a + b - 1, 1)`` (:func:`read`).
* The windowed layers' core attention takes ``window_size = (W, 0)`` (lines 413-418): W + 1
  keys. NeMo's importer puts HF's ``sliding_window`` there unchanged (``Gemma3Config1B``'s 512
  is gemma-3-1b's); as for Mistral (docs/families/mistral.md) it is read as NeMo meant it, HF
  ``sliding_window = W`` — the window NeMo 2 ran was one key wider.
* ``is_vision_language`` (true in the 4B, 12B and 27B classes, lines 228, 243, 258) makes the
  core attention take its mask from the run (``AttnMaskType.arbitrary``, lines 422-424: "The VL
  model calculates mask manually") instead of building a causal one. The weights and the per-token
  math are the same; the mask is a run-time input, and what a text ``Gemma3Model`` is fed is
  causal: NeMo's fine-tuning data (``GPTSFTDataset``, ``nemo/collections/llm/gpt/data/core.py``
  lines 599-604, 630-633, 656-657) hands ``gpt_data_step`` / ``gpt_forward_step``
  (``gpt/model/base.py`` lines 59-112, 115-143) a lower-triangular mask, and the VLM that sets
  the flag on its language model (``vlm/gemma3vl/model/base.py`` line 141) computes causal
  attention for text tokens, bidirectional only inside an image's block (lines 539-560). NeMo's
  own exporter writes these classes as a causal ``Gemma3ForCausalLM`` (``HFGemma3Exporter.config``,
  lines 606-633). So a ``Gemma3Model`` folder is read as that causal model whatever the flag says
  (:func:`read`). (A run fed no mask at all, the pre-training and mock data modules' default with
  Transformer Engine, ``data/pre_training.py`` lines 182, 242, ``data/mock.py`` lines 67, 81, gives
  the arbitrary-mask attention no mask to apply, so it likely ran unmasked — Transformer Engine's
  handling of that was read, not run here; such a run did not train the causal model its exporter
  writes, which the folder cannot show.) NeMo 2's VLM folders (``Gemma3VLModel`` with
  ``Gemma3VLConfig`` / ``Gemma3VLConfig4B``, ``12B``, ``27B``) hold a vision tower we do not build:
  refused by name (:data:`NEMO2_CONFIGS`).
* ``softmax_scale`` is ``TransformerConfig``'s None (``1/sqrt(kv_channels)``) except in the
  27B class (line 264: ``168**-0.5``), read as ``query_pre_attn_scalar`` 168.

NeMo 2 stores the weights under Megatron-Core's names, the ones our ``.nemo`` holds
(``HFGemma3Importer.convert_state``, lines 460-499: ``self_attention.q_layernorm`` /
``k_layernorm``, ``linear_qkv.layer_norm_weight``, ``linear_proj.post_layernorm``,
``mlp.linear_fc1.layer_norm_weight``, ``mlp.linear_fc2.post_layernorm``,
``decoder.final_layernorm``, q/k/v merged into ``linear_qkv`` per query group and gate/up into
``linear_fc1``), under ``module.``.
"""

from __future__ import annotations

import math
from typing import Any

from nemo_convert.errors import UnsupportedError

_GEMMA3 = "nemo.collections.llm.gpt.model.gemma3."
GEMMA3_PROVIDER = "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider"


def read(values: dict[str, Any]) -> dict[str, Any]:
    """NeMo 2's spelling of the windows and the RoPE factor as the provider's (module docstring)."""
    out = dict(values)
    if out.get("rope_scaling_factor") is None:
        raise UnsupportedError("NeMo 2's Gemma3Config without rope_scaling_factor: only its sized classes set it and "
                               "Gemma3Config.configure_model reads it (gemma3.py line 197), so this is not a model "
                               "NeMo 2 builds")
    pattern = out.get("interleaved_attn_pattern")
    if not (isinstance(pattern, (list, tuple)) and len(pattern) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pattern) and sum(pattern) > 0):
        raise UnsupportedError(f"interleaved_attn_pattern={pattern!r} is not the (local, global) layer counts NeMo 2's "
                               "Gemma 3 reads")
    out["interleaved_attn_pattern"] = [sum(pattern) - 1, 1]  # only the period counts (_is_local_attn_layer)
    out["is_vision_language"] = False  # a text Gemma3Model's run-time mask is causal (module docstring)
    return out


#: ``Gemma3Config`` (lines 123-157) with what it leaves to ``GPTConfig`` / ``TransformerConfig``
#: that reading it needs spelled out (``softmax_scale`` None, the q/k norms of its layer spec).
GEMMA3_CONFIG: dict[str, Any] = {
    "_target_": GEMMA3_PROVIDER, "_read_": read,
    "seq_length": 131_072, "vocab_size": 262_208, "position_embedding_type": "rope", "rotary_base": [10_000, 1_000_000],
    "share_embeddings_and_output_weights": True, "normalization": "RMSNorm", "layernorm_zero_centered_gamma": True,
    "layernorm_epsilon": 1e-6, "window_size": 512, "interleaved_attn_pattern": [5, 1], "gated_linear_unit": True,
    "add_bias_linear": False, "activation_func": "nemo.collections.llm.fn.activation.openai_gelu",
    "is_vision_language": False, "qk_layernorm": True, "softmax_scale": None, "rope_scaling_factor": None}


def _sized(layers: int, hidden: int, heads: int, groups: int, head: int, ffn: int, window: int, factor: float,
           **more: Any) -> dict[str, Any]:
    return {**GEMMA3_CONFIG, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_query_groups": groups, "kv_channels": head, "ffn_hidden_size": ffn, "window_size": window,
            "rope_scaling_factor": factor, **more}


#: The sized classes: 1B (lines 206-221), 4B (224-236), 12B (239-251), 27B (254-267).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _GEMMA3 + "Gemma3Config": GEMMA3_CONFIG,
    _GEMMA3 + "Gemma3Config1B": _sized(26, 1152, 4, 1, 256, 6912, 512, 1.0, seq_length=32768, bf16=True,
                                       vocab_size=262_144),
    _GEMMA3 + "Gemma3Config4B": _sized(34, 2560, 8, 4, 256, 10240, 1024, 8.0, is_vision_language=True),
    _GEMMA3 + "Gemma3Config12B": _sized(48, 3840, 16, 8, 256, 15360, 1024, 8.0, is_vision_language=True),
    _GEMMA3 + "Gemma3Config27B": _sized(62, 5376, 32, 16, 128, 21504, 1024, 8.0, is_vision_language=True,
                                        softmax_scale=1.0 / math.sqrt(168)),
}

_VLM = "nemo.collections.vlm.gemma3vl.model."
#: NeMo 2's Gemma 3 VLM (``Gemma3VLModel``, ``vlm/gemma3vl/model/base.py`` lines 109-160, 563;
#: the sized classes in ``gemma3vl.py`` lines 39-69; ``Gemma3VLImporter.config``, lines 160-190,
#: writes ``Gemma3VLConfig`` with the three sub-configs): its vision tower and projector are not
#: built here, and there is no text-only reading of a NeMo 2 VLM folder.
_NOT_A_TEXT_MODEL = ("a NeMo 2 Gemma 3 vision-language model (a SigLIP vision tower and a projector beside the "
                     "language model, under Gemma3VLModel): not converted (only Gemma3Model's text folders are)")
NEMO2_CONFIGS.update({_VLM + "base.Gemma3VLConfig": _NOT_A_TEXT_MODEL,
                      **{f"{_VLM}gemma3vl.Gemma3VLConfig{size}": _NOT_A_TEXT_MODEL for size in ("4B", "12B", "27B")}})
