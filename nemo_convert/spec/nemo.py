"""The one reader of a NeMo 1 GPT config: ``model_config.yaml`` → :class:`ModelSpec`.

NeMo 1's ``model_config.yaml`` is the stored canonical form: the families' HF tables write
it, NeMo writes it, and the Megatron-Bridge / Megatron-LM / NeMo 2 readers translate into
it. This module is the only code that interprets its fields and our ``nemo_convert``
section's side channels, with NeMo's defaults applied once (NeMo ``8cfedd72``
``megatron_gpt_model.py`` / ``megatron_base_model.py``; Megatron-Core 0.16.1):

- ``activation`` ``gelu``, fused (:mod:`.activations`); ``normalization`` ``layernorm``,
  ``layernorm1p`` = LayerNorm with zero-centred γ (``megatron_gpt_model.py`` lines
  2221-2231); ``position_embedding_type`` ``learned_absolute`` (line 508);
  ``layernorm_epsilon`` 1e-5; ``rotary_base`` 10000; ``rotary_percentage`` 1;
  ``normalize_attention_scores`` true; ``transformer_block_type`` ``pre_ln``;
- ``num_query_groups`` null = the heads; ``kv_channels`` null = hidden / heads;
- linear biases: our record ``nemo_convert.linear_biases`` (``attention`` or ``qkv`` /
  ``proj`` / ``mlp``), else NeMo's ``bias`` (every linear) and ``qkv_bias`` (q, k, v);
- the sliding window: HF's ``sliding_window`` recorded as ``nemo_convert.sliding_window``,
  else NeMo's importer convention ``window_size: [W, 0]`` read as W keys (Megatron-Core
  keeps ``i - w0 ≤ j ≤ i + w1``, so our own ``[W-1, 0]`` is exactly W keys; NeMo's
  importer wrote one key too many for the HF model whose weights it holds,
  docs/families/mistral.md);
- RoPE scaling: ``scale_positional_embedding`` is llama3 (:data:`LLAMA3_DEFAULTS` for
  absent factors), ``seq_len_interpolation_factor`` position interpolation (HF ``linear``),
  GPTModel's ``position_embedding_type: yarn`` with its ``yarn_*`` fields or MLA's
  ``rope_type: yarn`` with MLATransformerConfig's (absent ``rope_type`` in our MLA configs:
  plain RoPE; :mod:`nemo_convert.families.yarn`);
- experts (``num_moe_experts``): top-k 2, ``moe_ffn_hidden_size`` null = ``ffn_hidden_size``,
  ``moe_layer_freq`` 1 (every layer), softmax scores, no groups;
- Gemma 2's fields, named as Megatron-Bridge's ``Gemma2ModelProvider`` names them
  (Megatron-Bridge ``067f987d`` ``src/megatron/bridge/models/gemma/gemma2_provider.py``
  lines 497-499): ``query_pre_attn_scalar`` (scores × its ``-0.5`` power, line 150),
  ``attn_logit_softcapping`` and ``final_logit_softcapping`` (``c·tanh(x/c)``, null or
  absent: none); the sublayer post-norms, which Megatron-Bridge puts in its layer spec
  (lines 441-463), not in a config field: our record ``nemo_convert.post_norms``. NeMo 1
  wrote the same model as ``name: megatron_gemma2`` (its layer spec, NeMo ``8c8bf720``
  ``megatron_gpt_model.py`` ``get_specs``) with the three numbers in
  ``mcore_customization_config`` (``scripts/checkpoint_converters/convert_gemma2_hf_to_nemo.py``
  ``adjust_nemo_config``); both spellings are read, ours first;
- a second RoPE base for the windowed layers, ``rotary_base_local`` (absent or null: none;
  :attr:`Rope.local_theta`): those layers rotate with it and no interpolation or scaling,
  the others with ``rotary_base`` and ``seq_len_interpolation_factor``. Megatron-Bridge's
  ``Gemma3ModelProvider`` holds the same two numbers as ``rotary_base = (local, global)``
  and the global layers' linear factor as ``rope_scaling_factor`` (Megatron-Bridge
  ``067f987d`` ``src/megatron/bridge/models/gemma/gemma3_provider.py`` lines 62, 76,
  113-137, 285-309); a NeMo config has one number per field, so the local base is its own;
- a hybrid stack's ``hybrid_override_pattern`` (one symbol per layer, a string or a list:
  :func:`layer_symbols`) is :attr:`ModelSpec.layer_kinds`, absent: none;
- ``precision`` 32.
"""

from __future__ import annotations

from typing import Any, Mapping

from nemo_convert.errors import ConfigError
from nemo_convert.spec.activations import nemo_activation
from nemo_convert.spec.model import (LLAMA3_DEFAULTS, MLA, MLP, Attention, Block, Embedding, Geometry, Llama3Scaling,
                                     LeftOut, ModelSpec, MoE, Norm, Provenance, Rope, Scaling, YarnScaling)
from nemo_convert.spec.precision import dtype_name_of_precision

SECTION = "nemo_convert"

#: Fields of Megatron-Core's ``TransformerConfig`` (which NeMo passes through) and of
#: Megatron-LM's arguments that change the math and that no spec field models, at their
#: neutral values: a config setting one otherwise is what no family here computes, and its
#: spec says so (:attr:`ModelSpec.unsupported`). Megatron-Core 0.16.1
#: ``transformer_config.py``; core_v0.16.1 ``arguments.py`` (``--squared-relu``,
#: ``--quick-geglu``, ``--apply-layernorm-1p``).
UNMODELLED: dict[str, Any] = {
    "softmax_scale": None, "attention_output_gate": False, "no_rope_freq": None,
    "experimental_attention_variant": None, "linear_attention_freq": None, "is_hybrid_model": False,
    "heterogeneous_layers_config_path": None, "mrope_section": None, "squared_relu": False, "quick_geglu": False,
    "apply_layernorm_1p": False,
    # token dropping, probabilities on the input, latent experts, device-limited routing, upcycling
    "moe_expert_capacity_factor": None, "moe_apply_probs_on_input": False, "moe_latent_size": None,
    "moe_router_topk_limited_devices": None, "moe_use_upcycling": False,
}

#: Plain RoPE in an MLA NeMo config: ``rope_type: rope`` and the two fields that enter MLA's
#: softmax scale, at values that make it ``1/sqrt(d)`` whatever the reader's class defaults
#: are (MLATransformerConfig: factor 40, NeMo 2's DeepSeekConfig: mscale_all_dim 1).
MLA_PLAIN: dict[str, Any] = {"rope_type": "rope", "rotary_scaling_factor": 1.0, "mscale_all_dim": 0.0}


def layer_pattern(value: Any, layers: int) -> list[bool]:
    """Megatron's per-layer pattern (``moe_layer_freq``): an int ``N`` selects every N-th
    layer from 0 (1: all), a list gives one 0/1 per layer; None selects none."""
    if value is None:
        return [False] * layers
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise ConfigError(f"layer pattern {value!r} is neither an int nor a list")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"layer pattern {value} is not a positive frequency")
        return [i % value == 0 for i in range(layers)]
    if len(value) != layers:
        raise ConfigError(f"layer pattern {list(value)} has {len(value)} entries for {layers} layers")
    return [bool(v) for v in value]


def layer_symbols(value: Any, layers: int) -> list[str]:
    """A hybrid stack's per-layer pattern (Megatron-Core's ``hybrid_override_pattern``,
    ``ssm/mamba_hybrid_layer_allocation.py``: one symbol per layer, ``M`` Mamba, ``*``
    attention, ``-`` MLP, ``E`` mixture of experts) as one symbol per layer: a string, or
    a list of one-character strings."""
    if isinstance(value, str):
        symbols = list(value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) and len(v) == 1 for v in value):
        symbols = list(value)
    else:
        raise ConfigError(f"layer pattern {value!r} is neither a string nor a list of one-character symbols")
    if len(symbols) != layers:
        raise ConfigError(f"layer pattern {''.join(symbols)!r} has {len(symbols)} symbols for {layers} layers")
    return symbols


def mamba_dims(cfg: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """A hybrid stack's Mamba-2 mixer sizes (heads, head size, groups, state size) from a NeMo
    config, with Megatron-Core 0.16.1's defaults for what the config leaves out
    (``TransformerConfig``: ``mamba_state_dim`` 128, ``mamba_head_dim`` 64,
    ``mamba_num_groups`` 8, ``mamba_num_heads`` None = ``expand × hidden / head size`` with the
    mixer's ``expand=2``: ``transformer_config.py`` lines 846–857, ``mamba_mixer.py`` lines
    151, 187, 233–239). NeMo 1's own config spells the groups ``mamba_ssm_ngroups``
    (``megatron_mamba_config.yaml``)."""
    head_dim = int(cfg.get("mamba_head_dim") or 64)
    heads = int(cfg.get("mamba_num_heads") or 2 * int(cfg["hidden_size"]) // head_dim)
    groups = int(cfg.get("mamba_num_groups") or cfg.get("mamba_ssm_ngroups") or 8)
    return heads, head_dim, groups, int(cfg.get("mamba_state_dim") or 128)


def window_pattern(value: Any, layers: int) -> tuple[bool, ...] | None:
    """Megatron-Core's ``window_attn_skip_freq`` as one flag per layer (True: windowed): a
    list as given, an int N windowing layer ``n`` (1-based) unless ``n % N == 0``
    (``transformer/utils.py`` lines 451–467), None: every layer (when there is a window)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"window_attn_skip_freq={value} is not a positive frequency")
        return tuple((n + 1) % value != 0 for n in range(layers))
    if isinstance(value, (list, tuple)):
        return tuple(bool(v) for v in value)
    raise ConfigError(f"window_attn_skip_freq={value!r} is neither an int nor a list")


def section(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Our ``nemo_convert`` section (empty when absent or not a mapping)."""
    ours = cfg.get(SECTION)
    return dict(ours) if isinstance(ours, Mapping) else {}


def recorded_vocab(cfg: Mapping[str, Any]) -> int | None:
    """The true vocabulary our section records (``nemo_convert.vocab_size``; NeMo has no
    field for it: the embedding's rows may hold Megatron's padding), or None. Any family's
    config (CLIP's and NeVA's too)."""
    vocab = section(cfg).get("vocab_size")
    return int(vocab) if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"the NeMo config lacks {key}")
        return default
    if isinstance(value, bool):
        raise ConfigError(f"the NeMo config has {key}={value!r}, not an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"the NeMo config has {key}={value!r}, not an integer") from None


def _opt_int(cfg: Mapping[str, Any], key: str) -> int | None:
    return None if cfg.get(key) is None else _int(cfg, key)


def _float(cfg: Mapping[str, Any], key: str, default: float) -> float:
    value = cfg.get(key)
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"the NeMo config has {key}={value!r}, not a number") from None


def _opt_float(cfg: Mapping[str, Any], key: str) -> float | None:
    return None if cfg.get(key) is None else _float(cfg, key, 0.0)


def _window_pattern(cfg: Mapping[str, Any], layers: int) -> tuple[bool, ...] | None:
    """The windowed layers: ``window_attn_skip_freq``; without it, NeMo 1's Gemma 2 layer
    spec (``name: megatron_gemma2``) windows the layers whose 1-based number is even
    (NeMo ``8cfedd72`` ``nemo/collections/nlp/models/language_modeling/megatron/gemma2/
    gemma2_modules.py`` lines 82-84: 0-based odd layers, where transformers windows the even
    ones); else every layer."""
    value = cfg.get("window_attn_skip_freq")
    if value is None and cfg.get("name") == "megatron_gemma2":
        return tuple(n % 2 == 1 for n in range(layers))
    return window_pattern(value, layers)


def _layer_kinds(cfg: Mapping[str, Any], layers: int) -> str | None:
    """A hybrid stack's ``hybrid_override_pattern`` as one string (:func:`layer_symbols`),
    None without one."""
    value = cfg.get("hybrid_override_pattern")
    return None if value is None else "".join(layer_symbols(value, layers))


def _customised(cfg: Mapping[str, Any], key: str) -> float | None:
    """A Gemma 2 field: top-level (Megatron-Bridge's name), else in NeMo 1's
    ``mcore_customization_config`` (module docstring)."""
    if cfg.get(key) is not None:
        return _opt_float(cfg, key)
    custom = cfg.get("mcore_customization_config")
    return _opt_float(custom, key) if isinstance(custom, Mapping) else None


def linear_biases(cfg: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """(q/k/v, o_proj, MLP) biases: our record, else NeMo's ``bias`` (every linear) and
    ``qkv_bias`` (q, k and v only)."""
    b = section(cfg).get("linear_biases")
    b = b if isinstance(b, Mapping) else {}
    attention = b.get("attention", bool(cfg.get("qkv_bias") or cfg.get("bias")))
    qkv = b.get("qkv", attention)
    proj = b.get("proj", attention if "attention" in b else bool(cfg.get("bias")))
    return bool(qkv), bool(proj), bool(b.get("mlp", cfg.get("bias")))


def megatron_window(keys: int) -> list[int]:
    """Megatron-Core's ``window_size`` for a window of ``keys`` keys (HF's ``sliding_window``):
    ``[keys - 1, 0]`` (it keeps ``i - w0 ≤ j ≤ i + w1``; Megatron-Bridge's convention too,
    ``mistral_bridge.py`` lines 56–59)."""
    return [int(keys) - 1, 0]


def window_keys(window_size: Any) -> int:
    """The keys a query sees under Megatron-Core's ``window_size`` ``[w0, w1]``: ``w0 + 1``
    (the inverse of :func:`megatron_window`)."""
    return int(window_size[0]) + 1


def unsupported(cfg: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The :data:`UNMODELLED` fields a config sets to other than their neutral value."""
    return tuple((k, cfg[k]) for k, neutral in UNMODELLED.items() if cfg.get(k) is not None and cfg[k] != neutral)


def sliding_window(cfg: Mapping[str, Any]) -> tuple[int | None, int]:
    """(keys a query sees, keys after it) of a config's window (module docstring): (None, 0)
    without one."""
    ws = cfg.get("window_size")
    right = 0
    if isinstance(ws, (list, tuple)) and len(ws) > 1 and ws[1] is not None:
        right = int(ws[1])
    recorded = section(cfg).get("sliding_window")
    if recorded is not None:
        return int(recorded), right
    if isinstance(ws, (list, tuple)) and ws and ws[0] is not None and int(ws[0]) >= 0:
        return int(ws[0]), right
    return None, right


def _norm(cfg: Mapping[str, Any]) -> Norm:
    kind = str(cfg.get("normalization") or "layernorm").lower()
    one_p = kind == "layernorm1p"
    return Norm("layernorm" if one_p else kind, one_p or bool(cfg.get("layernorm_zero_centered_gamma")),
                _float(cfg, "layernorm_epsilon", 1e-5))


def _mla(cfg: Mapping[str, Any]) -> MLA | None:
    if not cfg.get("multi_latent_attention"):
        return None
    return MLA(*(_opt_int(cfg, k) for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                             "v_head_dim")))


def yarn_scaling(cfg: Mapping[str, Any], *, mla: bool) -> YarnScaling | None:
    """The YaRN scaling of a config: MLA's ``rope_type: yarn`` fields (``mla``), GPTModel's
    ``position_embedding_type: yarn`` with its ``yarn_*`` fields; None: no YaRN."""
    if mla:
        if cfg.get("rope_type") != "yarn":
            return None
        return YarnScaling(_opt_float(cfg, "rotary_scaling_factor"), _opt_int(cfg, "original_max_position_embeddings"),
                           _opt_float(cfg, "beta_fast"), _opt_float(cfg, "beta_slow"),
                           _float(cfg, "mscale", 1.0), _float(cfg, "mscale_all_dim", 0.0), True)
    if cfg.get("position_embedding_type") != "yarn":
        return None
    return YarnScaling(_opt_float(cfg, "yarn_rotary_scaling_factor"), _opt_int(cfg, "yarn_original_max_position_embeddings"), _opt_float(cfg, "yarn_beta_fast"),
                       _opt_float(cfg, "yarn_beta_slow"), _opt_float(cfg, "yarn_mscale"),
                       _opt_float(cfg, "yarn_mscale_all_dim"), bool(cfg.get("yarn_correction_range_round_to_int")))


def llama3_scaling(cfg: Mapping[str, Any]) -> Llama3Scaling | None:
    """NeMo's llama3 RoPE scaling (``scale_positional_embedding``; absent factors are
    Llama 3.1's, :data:`LLAMA3_DEFAULTS`), or None."""
    if not cfg.get("scale_positional_embedding"):
        return None
    d = LLAMA3_DEFAULTS
    return Llama3Scaling(_float(cfg, "scale_factor", d.factor), _float(cfg, "low_freq_factor", d.low_freq_factor),
                         _float(cfg, "high_freq_factor", d.high_freq_factor),
                         _int(cfg, "old_context_len", d.original_max_positions))


def _rope(cfg: Mapping[str, Any], positions: str, mla: bool) -> Rope | None:
    if positions not in ("rope", "yarn"):
        return None
    scaling: Scaling | None = yarn_scaling(cfg, mla=mla) or llama3_scaling(cfg)
    interpolation = _opt_float(cfg, "seq_len_interpolation_factor")
    return Rope(_float(cfg, "rotary_base", 10000.0), _float(cfg, "rotary_percentage", 1.0),
                bool(cfg.get("rotary_interleaved")), interpolation or None, scaling,
                _opt_float(cfg, "rotary_base_local"))


def rope_of(cfg: Mapping[str, Any]) -> Rope | None:
    """The rotary embedding of a NeMo config (None: its positions are not rotary)."""
    positions = str(cfg.get("position_embedding_type") or "learned_absolute")
    return _rope(cfg, positions, bool(cfg.get("multi_latent_attention")))


def _moe(cfg: Mapping[str, Any], layers: int) -> MoE | None:
    experts = _int(cfg, "num_moe_experts", 0)
    if not experts:
        return None
    if cfg.get("moe_ffn_hidden_size") is None and cfg.get("ffn_hidden_size") is None:
        raise ConfigError("the NeMo config lacks moe_ffn_hidden_size (and ffn_hidden_size)")
    ffn = _int(cfg, "moe_ffn_hidden_size") if cfg.get("moe_ffn_hidden_size") else _int(cfg, "ffn_hidden_size")
    groups = _int(cfg, "moe_router_num_groups", 0) or 1
    return MoE(experts=experts, topk=_int(cfg, "moe_router_topk", 0) or 2, ffn=ffn,
               layer_pattern=tuple(layer_pattern(cfg.get("moe_layer_freq", 1), layers)),
               score_function=str(cfg.get("moe_router_score_function") or "softmax"),
               pre_softmax=bool(cfg.get("moe_router_pre_softmax")),
               expert_bias=bool(cfg.get("moe_router_enable_expert_bias")),
               topk_scaling=_float(cfg, "moe_router_topk_scaling_factor", 1.0),
               groups=groups, group_topk=(_int(cfg, "moe_router_group_topk", 0) or 1) if groups > 1 else None,
               shared_ffn=_int(cfg, "moe_shared_expert_intermediate_size", 0),
               shared_gate=bool(cfg.get("moe_shared_expert_gate")))


def query_groups(cfg: Mapping[str, Any]) -> int | None:
    """``num_query_groups``, null meaning the heads (None when the config has no heads:
    not a decoder's)."""
    heads = _int(cfg, "num_attention_heads", 0)
    return (_int(cfg, "num_query_groups", 0) or heads) or None


def head_dim(cfg: Mapping[str, Any]) -> int:
    """``kv_channels``, null meaning hidden / heads."""
    return _int(cfg, "kv_channels", 0) or _int(cfg, "hidden_size") // _int(cfg, "num_attention_heads")


def geometry_of(cfg: Mapping[str, Any]) -> Geometry:
    """The sizes of a NeMo config (module docstring's nulls resolved)."""
    layers, hidden, heads = _int(cfg, "num_layers"), _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    if heads < 1:
        raise ConfigError(f"the NeMo config has num_attention_heads={heads}")
    positions = cfg.get("max_position_embeddings") or cfg.get("encoder_seq_length")
    return Geometry(layers=layers, hidden=hidden, heads=heads,
                    query_groups=query_groups(cfg) or heads, head_dim=head_dim(cfg),
                    ffn=_opt_int(cfg, "ffn_hidden_size"),
                    vocab_size=recorded_vocab(cfg),
                    max_positions=int(positions) if positions is not None else None)


def spec_of(cfg: Mapping[str, Any]) -> ModelSpec:
    """What a NeMo 1 GPT config computes (module docstring); :class:`ConfigError` naming a
    required field it lacks or one that is not a number."""
    geometry = geometry_of(cfg)
    positions = str(cfg.get("position_embedding_type") or "learned_absolute")
    mla = _mla(cfg)
    qkv, proj, mlp_bias = linear_biases(cfg)
    window, lookahead = sliding_window(cfg)
    clamp = cfg.get("activation_func_clamp_value")
    gated, fn = nemo_activation(cfg)
    return ModelSpec(
        geometry=geometry,
        attention=Attention(qkv_bias=qkv, proj_bias=proj, qk_norm=bool(cfg.get("qk_layernorm")),
                            window=window, window_lookahead=lookahead,
                            # which layers a window applies to means nothing without a window
                            window_pattern=None if window is None else _window_pattern(cfg, geometry.layers),
                            softmax=str(cfg.get("softmax_type") or "vanilla"), mla=mla,
                            normalized_scores=bool(cfg.get("normalize_attention_scores", True)),
                            query_pre_attn_scalar=_customised(cfg, "query_pre_attn_scalar"),
                            logit_softcap=_customised(cfg, "attn_logit_softcapping"),
                            headscale=bool(cfg.get("headscale")), kind=str(cfg.get("attention_type") or "multihead")),
        positions=positions,
        rope=_rope(cfg, positions, mla is not None),
        mlp=MLP(gated=gated, activation=fn, bias=mlp_bias, glu_offset=_float(cfg, "glu_linear_offset", 0.0),
                clamp=None if clamp is None else float(clamp)),
        norm=_norm(cfg),
        embedding=Embedding(tied=bool(cfg.get("share_embeddings_and_output_weights")),
                            scaled=bool(cfg.get("apply_embedding_scaling"))),
        block=Block(str(cfg.get("transformer_block_type") or "pre_ln"),
                    bool(cfg.get("apply_residual_connection_post_layernorm")),
                    bool(section(cfg).get("post_norms")) or cfg.get("name") == "megatron_gemma2"),
        moe=_moe(cfg, geometry.layers),
        mtp_layers=_int(cfg, "mtp_num_layers", 0),
        layer_kinds=_layer_kinds(cfg, geometry.layers),
        final_logit_softcap=_customised(cfg, "final_logit_softcapping"),
        precision=dtype_name_of_precision(cfg.get("precision", 32)),
        unsupported=unsupported(cfg),
    )


def provenance_of(cfg: Mapping[str, Any]) -> Provenance:
    """Where a NeMo config came from (our section), never what it computes."""
    ours = section(cfg)
    raw = ours.get("hf_mtp")
    mtp: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    hf = ours.get("hf_config")
    files = ours.get("tokenizer_files")
    prefixes, left = ours.get("hf_read_prefixes"), ours.get("hf_left_out")
    return Provenance(
        family=ours.get("family") or None, hf_config=dict(hf) if isinstance(hf, Mapping) else None,
        source_format=ours.get("source_format"),
        hf_experts="fused" if ours.get("hf_experts") == "fused" else "per_expert",
        hf_names=ours.get("hf_names"),
        mtp_dropped=int(mtp.get("dropped") or 0), mtp_absent=int(mtp.get("absent") or 0),
        ignored_config_keys=tuple(str(k) for k in ours.get("ignored_config_keys") or ()),
        tokenizer_files=dict(files) if isinstance(files, Mapping) else {},
        hf_read_prefixes={str(k): str(v) for k, v in prefixes.items()} if isinstance(prefixes, Mapping) else {},
        hf_left_out=LeftOut(str(left.get("option", "")), str(left.get("what", "")),
                            tuple(str(n) for n in left.get("names") or ())) if isinstance(left, Mapping) else None)
