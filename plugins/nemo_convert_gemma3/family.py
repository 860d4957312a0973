"""Gemma 3 text (``Gemma3ForCausalLM``): Gemma 2's block (zero-centred norms, four a layer,
scaled and tied embedding, tanh GeGLU, ``query_pre_attn_scalar``) with per-head q/k norms,
five sliding-window layers to one global layer, and two RoPEs: the global layers rotate
with ``rope_theta`` and its scaling, the windowed ones with ``rope_local_base_freq`` alone.

transformers 5.25 ``models/gemma3/configuration_gemma3.py``: defaults (lines 73-98: window
4096, ``query_pre_attn_scalar`` 256, no soft-caps, tied embeddings, global base 1e6, local
1e4); without ``layer_types`` layer ``i`` is ``sliding_attention`` unless ``(i + 1)`` is a
multiple of ``sliding_window_pattern`` (default 6; lines 105-111 — the key
``_sliding_window_pattern`` that 4.55+ writes back is not read); the RoPE of each layer
kind (``convert_rope_params_to_dict``, lines 132-159): ``rope_parameters`` per layer kind
(v5), else v4's ``rope_scaling`` applied to ``full_attention`` only, ``rope_theta`` the
global base and ``rope_local_base_freq`` the local one; ``use_bidirectional_attention``
changes the mask and the window (lines 101-102); ``attn_logit_softcapping`` is kept but
never applied (:func:`_no_score_cap`). ``modeling_gemma3.py``: ``q_norm`` /
``k_norm`` are ``Gemma3RMSNorm(head_dim)`` (lines 119-137, 310-311: ``(1 + w)``), applied
before the RoPE (lines 329-333); the layer's rotary table is its kind's (lines 533-540).

Megatron-Core names (Megatron-Bridge ``067f987d``
``src/megatron/bridge/models/gemma/gemma3_bridge.py`` lines 104-147): Gemma 2's, plus
``self_attention.q_layernorm`` / ``k_layernorm`` (Megatron-Core's ``qk_layernorm``). Its
``Gemma3ModelProvider`` (``gemma3_provider.py`` lines 55-137, 285-362) rotates local
layers with ``rotary_base[0]`` and global ones with ``rotary_base[1]`` divided by
``rope_scaling_factor``, which here are ``rotary_base_local``, ``rotary_base`` and
``seq_len_interpolation_factor`` (:mod:`nemo_convert.spec.nemo`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from nemo_convert import CommandOption, FamilyOptions
from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families import (
    DENSE,
    DENSE_CLASS_DEFAULTS,
    FAST_GELU,
    GPT_CONFIG,
    NO_LINEAR_BIAS,
    Check,
    Derived,
    Field,
    GPTFeatures,
    ProviderFamily,
    activation,
    gpt_family,
    layer_windows,
    linear_biases,
    query_pre_attn_scalar,
    softcap,
)
from nemo_convert.families.config_table import set_path
from nemo_convert.spec import Rope, provenance_of, rope_of, spec_of
from nemo_convert_gemma3.nemo2 import GEMMA3_PROVIDER, NEMO2_CONFIGS

GLOBAL_THETA, LOCAL_THETA, PATTERN = 1_000_000.0, 10_000.0, 6
KINDS = ("full_attention", "sliding_attention")


def _every_nth_global(hf: dict[str, Any]) -> list[str]:
    """``Gemma3TextConfig.__post_init__``'s default ``layer_types`` (module docstring)."""
    n = hf.get("sliding_window_pattern")
    n = PATTERN if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UnsupportedError(f"sliding_window_pattern={n!r} is not a positive layer count")
    return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(int(hf["num_hidden_layers"]))]


def _stale_pattern(hf: dict[str, Any]) -> str | None:
    """``_sliding_window_pattern``: what transformers 4.55+ writes back beside ``layer_types``
    and never reads (module docstring). With ``layer_types`` it is a record of how they were
    made; without them a value other than the pattern transformers applies is ambiguous."""
    value = hf.get("_sliding_window_pattern")
    applied = hf.get("sliding_window_pattern", PATTERN)
    if value is None or hf.get("layer_types") is not None or value == applied:
        return None
    return f"_sliding_window_pattern={value!r} differs from the sliding_window_pattern={applied!r} transformers applies"


def _block(value: Any, kind: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnsupportedError(f"rope_parameters[{kind!r}]={value!r} is not a mapping")
    return dict(value)


def _ropes(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(global, local) RoPE blocks as ``Gemma3TextConfig.convert_rope_params_to_dict`` makes
    them: ``rope_parameters`` per layer kind, ``rope_scaling`` merged into the global one,
    the bases from ``rope_theta`` / ``rope_local_base_freq`` where a block has none."""
    params = hf.get("rope_parameters")
    if params is not None and (not isinstance(params, dict) or not set(params) <= set(KINDS)):
        raise UnsupportedError(f"rope_parameters={params!r} is not one block per layer kind ({', '.join(KINDS)})")
    params = params or {}
    full, local = _block(params.get("full_attention"), "full_attention"), _block(
        params.get("sliding_attention"), "sliding_attention")
    scaling = hf.get("rope_scaling")
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise UnsupportedError(f"rope_scaling={scaling!r} is not a mapping")
        full.update(scaling)
    theta, local_theta = hf.get("rope_theta"), hf.get("rope_local_base_freq")
    full.setdefault("rope_theta", GLOBAL_THETA if theta is None else theta)
    local.setdefault("rope_theta", LOCAL_THETA if local_theta is None else local_theta)
    return full, local


def _kind(block: dict[str, Any]) -> str:
    return str(block.get("rope_type") or block.get("type") or "default")


def _rope_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    full, local = _ropes(hf)
    kind = _kind(full)
    if kind not in ("default", "linear"):
        raise UnsupportedError(f"rope type {kind!r} on the global layers (Megatron-Core's Gemma 3 RoPE is plain or "
                               "linearly scaled: default, linear)")
    if _kind(local) != "default" or set(local) - {"rope_type", "type", "rope_theta"}:
        raise UnsupportedError(f"sliding_attention RoPE {local!r} (the windowed layers rotate with a base alone)")
    extra = set(full) - {"rope_type", "type", "rope_theta", "factor"}
    if extra:
        raise UnsupportedError(f"global RoPE keys {sorted(extra)} ({kind} RoPE takes rope_theta and a factor)")
    factor = full.get("factor") if kind == "linear" else None
    if kind == "linear" and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0):
        raise UnsupportedError(f"linear RoPE factor={factor!r} is not a positive number")
    interpolation = float(factor) if factor is not None and float(factor) != 1.0 else None
    return {"rotary_base": float(full["rope_theta"]), "rotary_base_local": float(local["rope_theta"]),
            "rotary_percentage": 1.0, "seq_len_interpolation_factor": interpolation,
            "scale_positional_embedding": False}


def _rope_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """A synthesised config's spelling, which transformers 4.50+ and 5 both read."""
    r = rope_of(cfg) or Rope()
    if r.scaling is not None or r.fraction != 1.0 or r.interleaved:
        raise UnsupportedError("RoPE scaling other than linear, a partial or an interleaved RoPE: Gemma3ForCausalLM "
                               "rotates whole heads, plainly or linearly scaled")
    return {"rope_theta": r.theta, "rope_local_base_freq": LOCAL_THETA if r.local_theta is None else r.local_theta,
            "rope_scaling": {"rope_type": "linear", "factor": r.interpolation} if r.interpolation else None}


#: The two RoPEs (module docstring) ⇄ ``rotary_base`` (global), ``rotary_base_local``,
#: ``seq_len_interpolation_factor`` (the global layers' linear factor). Export keeps the
#: source's spelling (v4 keys or v5 ``rope_parameters``).
ROPES = Derived(("rope_theta", "rope_scaling", "rope_parameters", "rope_local_base_freq", "partial_rotary_factor"),
                _rope_to_nemo, _rope_to_hf)


def _hidden_act(hf: dict[str, Any]) -> str | None:
    """``hidden_act`` is never read by ``Gemma3ForCausalLM`` (it runs ``hidden_activation``,
    ``modeling_gemma3.py`` line 113); the same value is a duplicate, another is ambiguous."""
    value, runs = hf.get("hidden_act"), hf.get("hidden_activation", "gelu_pytorch_tanh")
    if value is None or value == runs:
        return None
    return f"hidden_act={value!r} differs from hidden_activation={runs!r} (Gemma3ForCausalLM runs the second)"


_LAYER_WINDOWS = layer_windows(_every_nth_global, pattern_key="sliding_window_pattern")

#: ``sliding_window`` (absent: ``Gemma3TextConfig``'s 4096) and the layer kinds ⇄
#: ``window_size`` and ``window_attn_skip_freq`` (:func:`~nemo_convert.families.layer_windows`).
WINDOWS = Derived(_LAYER_WINDOWS.hf_keys,
                  lambda hf: _LAYER_WINDOWS.to_nemo(hf if "sliding_window" in hf else {**hf, "sliding_window": 4096}),
                  _LAYER_WINDOWS.to_hf, restore=True)

def _no_score_cap(hf: dict[str, Any]) -> dict[str, Any]:
    """``attn_logit_softcapping``: ``Gemma3TextConfig`` keeps the field, but transformers 5.25's
    ``Gemma3Attention`` never passes it to the attention function (``modeling_gemma3.py``
    lines 342-352; ``eager_attention_forward`` caps only when given ``softcap``, lines
    253-267): null (every published config) is no cap; a number is a cap the HF model does
    not compute while Megatron-Bridge's Gemma 2-style attention would, refused by name."""
    value = hf.get("attn_logit_softcapping")
    if value is not None:
        raise UnsupportedError(f"attn_logit_softcapping={value!r}: Gemma3ForCausalLM reads it but never applies it "
                               "(transformers 5.25 modeling_gemma3.py lines 342-352)")
    return {"attn_logit_softcapping": None}


GEMMA3_CONFIG = GPT_CONFIG.extend(
    activation("gelu_pytorch_tanh", "geglu", key="hidden_activation"),
    Check(("hidden_act",), _hidden_act),
    linear_biases("attention_bias", None),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", True, to_nemo=bool, to_hf=bool),
    Field("rms_norm_eps", "layernorm_epsilon", 1e-6, to_nemo=float, to_hf=float),
    Field("max_position_embeddings", "max_position_embeddings", 131072, to_nemo=int, to_hf=int,
          nemo_default=lambda c: c.get("encoder_seq_length")),
    Field("max_position_embeddings", "encoder_seq_length", 131072, to_nemo=int, to_hf=None),
    query_pre_attn_scalar(256),
    Derived(("attn_logit_softcapping",), _no_score_cap, lambda cfg: {
        "attn_logit_softcapping": spec_of(cfg).attention.logit_softcap}),
    softcap("final_logit_softcapping", None, lambda spec: spec.final_logit_softcap),
    WINDOWS,
    Check(("_sliding_window_pattern",), _stale_pattern),
    ROPES,
    Check(("use_bidirectional_attention",), lambda hf: "use_bidirectional_attention=True (a bidirectional mask "
          "and a halved window: not a causal decoder)" if hf.get("use_bidirectional_attention") else None),
    # transformers' generation cache choice (a sliding + full "hybrid" cache): not the model's math
    harmless=("cache_implementation",),
    nemo_constants={"layernorm_zero_centered_gamma": True, "openai_gelu": True, "apply_embedding_scaling": True,
                    "nemo_convert.post_norms": True, "qk_layernorm": True},
)
#: ``--to megatron-bridge``: Megatron-Bridge ``067f987d`` ``gemma/gemma3_bridge.py`` lines 53-74
#: builds a ``Gemma3ModelProvider`` from the base bridge's fields with ``window_size =
#: sliding_window`` (an int: ``Gemma3TEDotProductAttention`` makes it ``(W - 1, 0)`` on the local
#: layers and None on the global ones, ``gemma3_provider.py`` lines 241-255), ``rotary_base =
#: (rope_local_base_freq, rope_theta)``, ``softmax_scale = 1 / sqrt(query_pre_attn_scalar)`` and
#: ``rope_scaling_factor`` (the global layers' linear factor: ``Gemma3RotaryEmbedding`` divides
#: their ``inv_freq`` by it, lines 303-316). It leaves ``interleaved_attn_pattern`` at the class's
#: ``(5, 1)``: 1-based layer ``n`` is local when ``(n - 1) % 6 < 5`` (lines 349-357), which is
#: ``_every_nth_global``'s default; we write the model's own pattern (a ``(local, global)`` pair
#: where it repeats, else one layer kind per layer, the list line 354 reads). The class's
#: defaults are lines 58-98; its layer spec (lines 143-170) has the q/k norms and the post-norms
#: (``linear_proj`` / ``linear_fc2`` as ``TERowParallelLinearLayerNorm``: our dist keys'
#: ``post_layernorm``), its ``provide()`` scales the embedding by sqrt(hidden) (lines 118-126,
#: 272-282). It has no soft-caps: a model with ``final_logit_softcapping`` is refused by name, and
#: ``is_vision_language`` is read only when false. Unlike NeMo 2's (nemo2.py: an arbitrary mask a
#: text run feeds causal), at ``067f987d`` the flag makes every layer ``AttnMaskType.no_mask``
#: (line 145; lines 259-260 in the core attention) and drops the local layers' window (lines
#: 244-248): the causal and windowed pattern then exists only as the attention bias that
#: ``Gemma3VLModel`` computes (``gemma_vl/modeling_gemma3_vl.py`` lines 164-201), while a text
#: ``GPTModel`` run passes none (``training/gpt_step.py`` lines 571-576: tokens, positions, mask,
#: labels; Megatron-Core 0.16.1 ``extensions/transformer_engine.py`` lines 1380-1406 hands TE the
#: bias only when given and the mask type by name): bidirectional and unwindowed. Its meaning also
#: changed twice (b2ebece6a; before it, a8e71e773: an arbitrary mask and a two-sided window),
#: which a ``run_config.yaml`` does not record. The VLM class
#: (``gemma_vl/gemma3_vl_provider.py`` ``Gemma3VLModelProvider``, line 33: the flag is fixed
#: true) is refused by name through ``modules``.
MEGATRON_BRIDGE = ProviderFamily(
    GEMMA3_PROVIDER, DENSE + NO_LINEAR_BIAS + (("activation_func", FAST_GELU), ("layernorm_zero_centered_gamma", True),
                                               ("qk_layernorm", True)),
    nemo=(("apply_embedding_scaling", True),),
    defaults=tuple({**DENSE_CLASS_DEFAULTS, "activation_func": FAST_GELU, "seq_length": 131_072,
                    "rotary_base": [10_000, 1_000_000], "share_embeddings_and_output_weights": True,
                    "layernorm_zero_centered_gamma": True, "layernorm_epsilon": 1e-6, "qk_layernorm": True,
                    "window_size": 512, "interleaved_attn_pattern": [5, 1], "rope_scaling_factor": 1.0,
                    "softmax_scale": 1.0 / math.sqrt(256), "bf16": True, "fp16": False,
                    "params_dtype": "torch.bfloat16"}.items()),
    post_norms=True, softmax_scale=True, local_rope=True, interleaved_windows=True,
    neutral=(("is_vision_language", False),), modules=("megatron.bridge.models.gemma_vl.",))


def _claims(cfg: dict[str, Any]) -> bool:
    spec = spec_of(cfg)
    return spec.block.post_norms and spec.attention.qk_norm


TEXT_MODEL = gpt_family(
    "gemma3", architecture="Gemma3ForCausalLM", model_type="gemma3_text", config=GEMMA3_CONFIG,
    features=GPTFeatures(zero_centred_norms=True, post_norms=True, qk_norm=True), claims=_claims,
    megatron_bridge=MEGATRON_BRIDGE,
    nemo2_targets=("nemo.collections.llm.gpt.model.gemma3.Gemma3Model",), nemo2_configs=NEMO2_CONFIGS,
    description="Gemma 3 text (q/k norms, 5:1 local/global layers, a local RoPE base, four norms a layer)",
)


# -- Gemma3ForConditionalGeneration: its language model on request (--text-only) ----------
#
# transformers 5.25 ``models/gemma3/configuration_gemma3.py`` lines 164-212: ``Gemma3Config``
# (``model_type: gemma3``) holds a ``text_config`` (a ``Gemma3TextConfig``, whose defaults fill
# what it leaves out: lines 73-79), a SigLIP ``vision_config``, ``mm_tokens_per_image``,
# ``boi_token_index``, ``eoi_token_index``, ``image_token_index`` (read as ``*_token_id`` too,
# ``attribute_map``), ``initializer_range`` and ``tie_word_embeddings``. ``modeling_gemma3.py``:
# ``Gemma3Model`` holds ``vision_tower``, ``multi_modal_projector`` and ``language_model`` (a
# ``Gemma3TextModel``, lines 747-758); ``Gemma3ForConditionalGeneration`` adds ``lm_head`` tied
# to ``model.language_model.embed_tokens`` (lines 902-911). It saves ``model.language_model.*``,
# ``model.vision_tower.*``, ``model.multi_modal_projector.*``, ``lm_head.weight``; checkpoints
# saved before (transformers 4.50-4.51, google/gemma-3-4b-it and the other published ones) spell
# them ``language_model.model.*``, ``language_model.lm_head.*``, ``vision_tower.*``,
# ``multi_modal_projector.*`` — the renaming 5.25 applies on load (``conversion_mapping.py``:
# ``"gemma3": "llava"`` line 102, ``"llava"``'s renames lines 888-893). With no pixel values the
# conditional model runs its language model on the token embeddings alone (the image features
# are merged only where ``pixel_values`` are given), so its text logits are a
# ``Gemma3ForCausalLM``'s of the same weights (tests/test_gemma3_multimodal.py checks it).

CONDITIONAL = "Gemma3ForConditionalGeneration"
TEXT_ONLY = CommandOption("import", "--text-only", "Gemma 3: import the language model of a "
                          "Gemma3ForConditionalGeneration (4B/12B/27B) as a Gemma3ForCausalLM, leaving the vision "
                          "tower and the projector out (one note); export writes a Gemma3ForCausalLM. "
                          "Same as --option text_only=true")
#: ``Gemma3TextConfig``'s sizes (lines 73-79), written where a ``text_config`` leaves them out
#: (google/gemma-3-4b-it's names only four: the rest are these defaults).
TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}
#: Outer keys that describe the image input only: harmless because --text-only leaves the
#: tower and the projector out (the language model never reads them on text input).
VISION_KEYS = ("vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index",
               "boi_token_id", "eoi_token_id", "image_token_id")
#: Outer keys that are the text model's too (no math: the dtype, the saving version, generation
#: token ids); written into the text model's config where its ``text_config`` lacks them.
SHARED_KEYS = ("torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
               "_name_or_path", "use_cache")
#: Outer keys with no effect on the language model's outputs: the class names (replaced by
#: the text model's), the initialisation scale.
OUTER_HARMLESS = ("architectures", "model_type", "initializer_range")
#: The two spellings of the conditional model's names (module comment): HF name prefixes of
#: the text model ⇄ where each stores them; and what --text-only leaves out.
SPELLINGS = {
    "new": ({"model.": "model.language_model.", "lm_head.": "lm_head."},
            ("model.vision_tower.*", "model.multi_modal_projector.*")),
    "old": ({"model.": "language_model.model.", "lm_head.": "language_model.lm_head."},
            ("vision_tower.*", "multi_modal_projector.*")),
}


def is_conditional(hf: dict[str, Any]) -> bool:
    return hf.get("model_type") == "gemma3" or CONDITIONAL in (hf.get("architectures") or ()) or "text_config" in hf


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of the conditional model's language model as a ``Gemma3ForCausalLM``:
    its ``text_config`` with ``Gemma3TextConfig``'s size defaults written out, the shared outer
    keys where it lacks them, and the text model's class. Every outer key is translated,
    harmless (above) or refused by name."""
    unknown = sorted(set(hf) - {"text_config", *VISION_KEYS, *SHARED_KEYS, *OUTER_HARMLESS, "tie_word_embeddings"})
    if unknown:
        raise ConfigError(f"{CONDITIONAL} key(s) {', '.join(unknown)} not understood by family gemma3")
    inner = hf.get("text_config") or {}
    if not isinstance(inner, dict):
        raise ConfigError(f"text_config={inner!r} is not a mapping")
    if inner.get("model_type", "gemma3_text") != "gemma3_text":
        raise UnsupportedError(f"text_config model_type={inner.get('model_type')!r} (Gemma 3's language model is "
                               "gemma3_text)")
    tie, inner_tie = hf.get("tie_word_embeddings"), inner.get("tie_word_embeddings", True)
    if tie is not None and bool(tie) != bool(inner_tie):
        raise UnsupportedError(f"tie_word_embeddings={tie!r} beside text_config tie_word_embeddings={inner_tie!r} "
                               f"({CONDITIONAL} ties its lm_head by the outer one)")
    out = {**TEXT_DEFAULTS, **copy.deepcopy(inner)}
    for k in SHARED_KEYS:
        if k in hf and k not in out:
            out[k] = copy.deepcopy(hf[k])
    out.update({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"})
    return out


def text_spelling(hf: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``from_source``: which spelling a conditional checkpoint stores (module comment)."""
    if not is_conditional(hf):
        return {}
    return {"hf_text_spelling": "old" if any(k.startswith("language_model.") for k in keys) else "new"}


def _config_to_nemo(hf: dict[str, Any], text_only: Any = False, hf_text_spelling: Any = "new",
                    **more: Any) -> dict[str, Any]:
    if not is_conditional(hf):
        return TEXT_MODEL.config_to_nemo(hf, **more)
    if str(text_only).strip().lower() in ("false", "0", "no", "none", ""):
        raise UnsupportedError(f"{CONDITIONAL} (a SigLIP vision tower and a projector beside the language model) is "
                               "not imported whole: pass --text-only (--option text_only=true) to import its "
                               "language model as a Gemma3ForCausalLM, leaving the vision tower and projector out")
    if hf_text_spelling not in SPELLINGS:
        raise ConfigError(f"hf_text_spelling={hf_text_spelling!r} (use {' or '.join(SPELLINGS)})")
    cfg = TEXT_MODEL.config_to_nemo(text_config(hf), **more)
    prefixes, left_out = SPELLINGS[str(hf_text_spelling)]
    set_path(cfg, "nemo_convert.hf_read_prefixes", dict(prefixes))
    set_path(cfg, "nemo_convert.hf_left_out", {"option": "--text-only", "what": "the vision tower and the projector",
                                               "names": list(left_out)})
    return cfg


def _config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Export: a model imported from a conditional checkpoint is its text model, so the
    recorded source is read as :func:`text_config` makes it (a ``Gemma3ForCausalLM``'s)."""
    source = provenance_of(cfg).hf_config
    if source is not None and is_conditional(source):
        cfg = copy.deepcopy(cfg)
        set_path(cfg, "nemo_convert.hf_config", text_config(source))
    return TEXT_MODEL.config_to_hf(cfg)


GEMMA3 = dataclasses.replace(
    TEXT_MODEL, hf_architectures=(*TEXT_MODEL.hf_architectures, CONDITIONAL),
    hf_model_types=(*TEXT_MODEL.hf_model_types, "gemma3"), config_to_nemo=_config_to_nemo, config_to_hf=_config_to_hf,
    options=FamilyOptions(keys=("text_only", "hf_text_spelling"), cli=(TEXT_ONLY,), from_source=text_spelling))
