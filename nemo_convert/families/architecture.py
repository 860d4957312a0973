"""What a NeMo GPT config computes, and the check that export runs with it.

A family's HF class computes a NeMo config when the config the family's own table writes
for the ``config.json`` it would export has the same :func:`signature`: the same MLP
activation, normalization, positions, rotary fraction and base, linear biases, attention
variant, experts and routing. Every GPT-base family gets the check from
:func:`~nemo_convert.families.gpt.gpt_family`; nothing is declared twice, and a field the
family's table drops (a ``window_size`` on a Llama, a gated GeLU on any SiLU family) shows
up as a difference, refused by name (:func:`nemo_refusal`).

The signature reads NeMo's fields as NeMo and Megatron-Core run them (NeMo ``8cfedd72``,
Megatron-Core 0.16.1):

- ``activation``: gated when the name ends in ``glu``
  (``megatron_base_model.py`` line 514); the function from ``activation_to_func``
  (``nemo/collections/nlp/parts/utils_funcs.py`` lines 170-215), where ``openai_gelu``
  takes precedence over every activation (tanh GeLU); a GeLU with
  ``bias_activation_fusion`` (NeMo's default: ``megatron_base_model.py`` line 550) runs
  Megatron-Core's fused ``bias_gelu`` / ``bias_geglu`` kernels (``mlp.py`` forward,
  ``fusions/fused_bias_gelu.py`` line 19, ``fused_bias_geglu.py`` line 27; NeMo's
  pre-mcore ``fused_bias_gelu.py`` line 37 likewise), which compute the **tanh
  approximation**, not the erf GeLU of ``F.gelu``;
- ``normalization``: ``layernorm1p`` is LayerNorm with ``layernorm_zero_centered_gamma``
  (``megatron_gpt_model.py`` lines 2221-2231: the weight stores γ - 1); NeMo's default is
  ``layernorm``;
- ``position_embedding_type``: NeMo's default is ``learned_absolute``
  (``megatron_gpt_model.py`` line 508).

Fields our mapping reads (linear biases, tied embeddings) are read the way the mapping
reads them; the tensors then prove the rest.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from nemo_convert.errors import UnsupportedError
from nemo_convert.families.config_table import ConfigTable
from nemo_convert.mapping.rules import cfg_get, layer_pattern

#: NeMo ``activation`` → (gated, function) before ``openai_gelu`` and the fused kernels.
#: NeMo 1's names (``activation_to_func``), Megatron-Bridge's non-gated ``silu`` / ``relu``
#: (read from provider directories) and GPT-OSS's ``quick-geglu`` (``x·σ(1.702x)``).
NEMO_ACTIVATIONS: dict[str, tuple[bool, str]] = {
    "gelu": (False, "gelu"), "geglu": (True, "gelu"), "fast-geglu": (True, "gelu"),
    "swiglu": (True, "silu"), "fast-swiglu": (True, "silu"), "silu": (False, "silu"),
    "reglu": (True, "relu"), "fast-reglu": (True, "relu"), "relu": (False, "relu"),
    "squared-relu": (False, "squared_relu"), "approx-gelu": (False, "quick_gelu"),
    "quick-geglu": (True, "quick_gelu"),
}

#: How each function is named in messages.
FUNCTION_NAMES: dict[str, str] = {
    "silu": "SiLU", "gelu": "GeLU (erf)", "gelu_tanh": "GeLU (tanh approximation)", "relu": "ReLU",
    "squared_relu": "squared ReLU", "quick_gelu": "quick GeLU x·σ(1.702x)",
}


def mlp_activation(cfg: dict[str, Any]) -> tuple[bool, str]:
    """(gated, function) of the MLP that NeMo / Megatron-Core run for a NeMo config."""
    name = str(cfg.get("activation") or "gelu")
    gated, fn = NEMO_ACTIVATIONS.get(name, (name.endswith("glu"), f"unknown activation {name!r}"))
    if cfg.get("openai_gelu"):
        fn = "gelu_tanh"
    elif fn == "gelu" and cfg.get("bias_activation_fusion", True):
        fn = "gelu_tanh"
    return gated, fn


def describe_activation(act: tuple[bool, str]) -> str:
    gated, fn = act
    return f"{'gated ' if gated else ''}{FUNCTION_NAMES.get(fn, fn)}"


def linear_bias_pattern(cfg: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(qkv, o_proj, mlp) biases of a NeMo config: our record, else NeMo's switches
    (``bias`` biases every linear, ``qkv_bias`` only q, k and v)."""
    b = cfg_get(cfg, "nemo_convert.linear_biases") or {}
    attention = b.get("attention", bool(cfg.get("qkv_bias") or cfg.get("bias")))
    qkv = b.get("qkv", attention)
    proj = b.get("proj", attention if "attention" in b else bool(cfg.get("bias")))
    return bool(qkv), bool(proj), bool(b.get("mlp", cfg.get("bias")))


def _norm(cfg: dict[str, Any]) -> str:
    return str(cfg.get("normalization") or "layernorm").lower()


def _rope_scaling(cfg: dict[str, Any]) -> tuple[Any, ...]:
    llama3 = bool(cfg.get("scale_positional_embedding"))
    factors = tuple(float(cfg.get(k, d)) for k, d in (("scale_factor", 8.0), ("low_freq_factor", 1.0),
                                                       ("high_freq_factor", 4.0), ("old_context_len", 8192)))
    linear = cfg.get("seq_len_interpolation_factor")
    return (llama3, factors if llama3 else None, float(linear) if linear else None)


def _routing(cfg: dict[str, Any]) -> tuple[Any, ...] | None:
    experts = int(cfg.get("num_moe_experts") or 0)
    if not experts:
        return None
    scale = cfg.get("moe_router_topk_scaling_factor")
    groups = int(cfg.get("moe_router_num_groups") or 1)
    return (experts, int(cfg.get("moe_router_topk") or 2), bool(cfg.get("moe_router_pre_softmax")),
            str(cfg.get("moe_router_score_function") or "softmax"), bool(cfg.get("moe_router_enable_expert_bias")),
            float(scale) if scale is not None else 1.0, int(cfg.get("moe_ffn_hidden_size") or cfg["ffn_hidden_size"]),
            int(cfg.get("moe_shared_expert_intermediate_size") or 0), bool(cfg.get("moe_shared_expert_gate")),
            tuple(layer_pattern(cfg.get("moe_layer_freq", 1), int(cfg["num_layers"]))),
            groups, int(cfg.get("moe_router_group_topk") or 1) if groups > 1 else None)


def signature(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a NeMo GPT config computes, field by field (module docstring), in a form two
    configs can be compared by."""
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    pos = str(cfg.get("position_embedding_type") or "learned_absolute")
    rope = pos == "rope"
    windows = cfg.get("window_attn_skip_freq")
    return {
        "activation": mlp_activation(cfg),
        "normalization": "layernorm" if _norm(cfg) == "layernorm1p" else _norm(cfg),
        "layernorm_zero_centered_gamma": _norm(cfg) == "layernorm1p" or bool(cfg.get("layernorm_zero_centered_gamma")),
        "layernorm_epsilon": float(cfg.get("layernorm_epsilon") or 1e-5),
        "position_embedding_type": pos,
        "rotary_percentage": float(cfg.get("rotary_percentage") or 1.0) if rope else None,
        "rotary_base": float(cfg.get("rotary_base") or 10000) if rope else None,
        "rope_scaling": _rope_scaling(cfg) if rope else None,
        "rotary_interleaved": bool(cfg.get("rotary_interleaved")),
        "bias": linear_bias_pattern(cfg),
        "num_query_groups": int(cfg.get("num_query_groups") or heads),
        "kv_channels": int(cfg.get("kv_channels") or hidden // heads),
        "share_embeddings_and_output_weights": bool(cfg.get("share_embeddings_and_output_weights")),
        "qk_layernorm": bool(cfg.get("qk_layernorm")),
        "window_size": bool(cfg.get("window_size")),
        "window_attn_skip_freq": tuple(windows) if isinstance(windows, (list, tuple)) else windows,
        "softmax_type": str(cfg.get("softmax_type") or "vanilla"),
        "glu_linear_offset": float(cfg.get("glu_linear_offset") or 0.0),
        "activation_func_clamp_value": cfg.get("activation_func_clamp_value"),
        "apply_embedding_scaling": bool(cfg.get("apply_embedding_scaling")),
        "multi_latent_attention": bool(cfg.get("multi_latent_attention")),
        "num_moe_experts": _routing(cfg),
        "transformer_block_type": str(cfg.get("transformer_block_type") or "pre_ln"),
        "normalize_attention_scores": bool(cfg.get("normalize_attention_scores", True)),
        "apply_residual_connection_post_layernorm": bool(cfg.get("apply_residual_connection_post_layernorm")),
        "headscale": bool(cfg.get("headscale")),
        "attention_type": str(cfg.get("attention_type") or "multihead"),
    }


def _shown(key: str, cfg: dict[str, Any], value: Any) -> str:
    """A signature entry as the user's config spells it."""
    if key == "activation":
        return f"activation={cfg.get('activation', 'gelu')!r} ({describe_activation(value)})"
    if key == "normalization":
        return f"normalization={cfg.get('normalization', 'layernorm')!r}"
    if key == "bias":
        qkv, proj, mlp = value
        return f"linear biases on q/k/v={qkv}, o_proj={proj}, MLP={mlp}"
    if key == "num_moe_experts":
        return "no experts" if value is None else f"num_moe_experts={value[0]} with its routing"
    return f"{key}={value!r}"


def _theirs(key: str, value: Any) -> str:
    if key == "activation":
        return describe_activation(value)
    if key == "bias":
        return "linear biases on q/k/v={}, o_proj={}, MLP={}".format(*value)
    if key == "num_moe_experts":
        return "no experts" if value is None else f"{value[0]} experts routed otherwise"
    return repr(value)


def _drop_ignored(hf: dict[str, Any], keys: Any) -> dict[str, Any]:
    """``hf`` without the keys import was told to ignore (``section.key`` names a key of a section)."""
    for key in keys or ():
        *parents, last = str(key).split(".")
        cur: Any = hf
        for p in parents:
            cur = cur.get(p) if isinstance(cur, dict) else None
        if isinstance(cur, dict):
            cur.pop(last, None)
    return hf


def nemo_refusal(table: ConfigTable, family: str, model: str, *,
                 zero_centred_either: bool = False) -> Callable[[dict[str, Any]], str | None]:
    """``refuse(nemo_config)``: None when ``model`` (the family's HF class) computes the
    config, else why not, in one line naming the field. The table's :class:`NemoCheck`
    rows speak first; then the config the table writes for the ``config.json`` it exports
    must have the config's :func:`signature`. ``zero_centred_either``: the family reads
    norms stored either way (NeMo 1 Gemma's ``1 + w``). A config that lacks what the
    table needs raises (``ConfigError``, ``KeyError``, …) as the translation would."""

    def refuse(cfg: dict[str, Any]) -> str | None:
        reason = table.refuse_nemo(cfg)
        if reason is not None:
            return reason
        try:
            mine = signature(cfg)
            hf = table.to_hf(copy.deepcopy(cfg))
            hf.setdefault("vocab_size", cfg_get(cfg, "nemo_convert.vocab_size") or 1)
            hf = _drop_ignored(hf, cfg_get(cfg, "nemo_convert.ignored_config_keys"))
            theirs = signature(table.to_nemo(hf, family))
        except UnsupportedError as exc:
            return str(exc)
        for key, value in mine.items():
            if key == "layernorm_zero_centered_gamma" and zero_centred_either:
                continue
            if theirs.get(key) != value:
                return f"{_shown(key, cfg, value)}: {model} computes {_theirs(key, theirs.get(key))}"
        return None

    return refuse
