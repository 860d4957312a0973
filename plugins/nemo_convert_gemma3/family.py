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

import math
from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import (DENSE, DENSE_CLASS_DEFAULTS, FAST_GELU, GPT_CONFIG, NO_LINEAR_BIAS, Check, Derived,
                                   Field, GPTFeatures, ProviderFamily, activation, gpt_family, layer_windows,
                                   linear_biases, query_pre_attn_scalar, softcap)
from nemo_convert.spec import Rope, rope_of, spec_of

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
#: ``is_vision_language`` (lines 87, 145, 244-260: no causal mask) is read only when false.
GEMMA3_PROVIDER = "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider"
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
    neutral=(("is_vision_language", False),))


def _claims(cfg: dict[str, Any]) -> bool:
    spec = spec_of(cfg)
    return spec.block.post_norms and spec.attention.qk_norm


GEMMA3 = gpt_family(
    "gemma3", architecture="Gemma3ForCausalLM", model_type="gemma3_text", config=GEMMA3_CONFIG,
    features=GPTFeatures(zero_centred_norms=True, post_norms=True, qk_norm=True), claims=_claims,
    megatron_bridge=MEGATRON_BRIDGE,
    description="Gemma 3 text (q/k norms, 5:1 local/global layers, a local RoPE base, four norms a layer)",
)
