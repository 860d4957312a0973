"""The reading direction of the one config table (:mod:`.megatron_config`, whose docstring
cites the facts): a Megatron-Bridge provider section (``run_config.yaml``'s ``model:``, also
what a NeMo 2 ``model.yaml`` is read as) or a Megatron-LM ``args`` namespace → NeMo 1 config
fields (:func:`provider_to_nemo`, :func:`args_to_nemo`). Every field is read by a row of the
table, known to be neutral, or refused by name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.formats.megatron.megatron_config import (DECODER_MODEL_TYPE, DEEPSEEK_ROUTING, EXPERT_COUNTS, FIELDS,
                                                          FIXED_ABSENT, MLA_FIELDS, MLA_YARN, MOE_FIELDS, MOE_NEUTRAL,
                                                          NEMO_GPT_TARGET, NEUTRAL, NORMALIZATIONS, PROVIDER_DEFAULTS)
from nemo_convert.formats.megatron.megatron_lm_args import (hybrid_family_provider, hybrid_section, is_hybrid_run,
                                                            run_section)
from nemo_convert.formats.megatron.provider_flags import (NEMO_HYBRID_PATTERN, declared_nemo, declared_read, hybrid_nemo,
                                                         target_of)
from nemo_convert.formats.megatron.provider_gpt_oss import GPT_OSS_FIELDS, gpt_oss_nemo, is_gpt_oss, yarn_nemo
from nemo_convert.formats.megatron.providers import GPT_PROVIDER, HYBRID_PROVIDER, MLA_CLASS_DEFAULTS, ProviderFamily, ProviderTable
from nemo_convert.spec import (LLAMA3_DEFAULTS, MLA_PLAIN, Llama3Scaling, dtype_name_of_flags, mcore_activation,
                               precision_of_dtype_name, window_keys)
from nemo_convert.spec.activations import NEMO_ACTIVATION_FIELDS


def _refuse_non_neutral(values: dict[str, Any], where: str, hybrid: bool = False) -> None:
    """Refuse a field that changes the math and that the table does not read. A hybrid
    provider's ``is_hybrid_model`` is read; without experts it has no router, so its router
    fields (which ``NemotronHBridge`` sets whatever the pattern, ``nemotron_h_bridge.py`` at
    ``067f987d`` lines 310-318) change nothing, and ``mtp_num_layers: 0`` is no MTP block."""
    mla = bool(values.get("multi_latent_attention"))
    experts = bool(values.get("num_moe_experts") or values.get("num_experts"))
    if mla and not (values.get("num_moe_experts") or values.get("num_experts")):
        raise UnsupportedError(f"{where}: multi_latent_attention=True changes the model's math and is not "
                               "supported without experts (no family here runs dense multi-latent attention)")
    routed = _sigmoid_routed(values)
    for k, neutral in {**NEUTRAL, **MOE_NEUTRAL}.items():
        v = values.get(k)
        if k in EXPERT_COUNTS or ((mla or routed) and k in DEEPSEEK_ROUTING) or (is_gpt_oss(values) and k in GPT_OSS_FIELDS):
            continue  # read by _moe_nemo / _mla_nemo / gpt_oss_nemo
        if hybrid and (k == "is_hybrid_model" or (k == "mtp_num_layers" and v == 0)
                       or (not experts and k.startswith("moe_router_"))):
            continue
        if v is not None and v != neutral:
            raise UnsupportedError(f"{where}: {k}={v!r} changes the model's math and is not supported")


def _moe_nemo(cfg: dict[str, Any], values: dict[str, Any], where: str) -> None:
    """The MoE fields of a provider section with experts into ``cfg``."""
    if not values.get("num_moe_experts"):
        return
    for f in MOE_FIELDS:
        value = values.get(str(f.provider), f.default)
        if f.nemo == "moe_ffn_hidden_size" and value is None:
            value = cfg["ffn_hidden_size"]
        if value is not None:
            cfg[f.nemo] = f.kind(value)
    if cfg["moe_shared_expert_gate"] and not cfg.get("moe_shared_expert_intermediate_size"):
        raise UnsupportedError(f"{where}: moe_shared_expert_gate without moe_shared_expert_intermediate_size")
    aux = values.get("moe_aux_loss_coeff")
    aux = aux[0] if isinstance(aux, (list, tuple)) and len(aux) == 1 else aux
    balance = values.get("moe_router_load_balancing_type")
    balance = balance[0] if isinstance(balance, (list, tuple)) and len(balance) == 1 else balance
    if values.get("multi_latent_attention"):
        _mla_nemo(cfg, values, where)
        return
    cfg.update({"moe_router_score_function": "softmax",  # MOE_NEUTRAL
                "moe_aux_loss_coeff": float(aux) if isinstance(aux, (int, float)) else 0.0,
                "moe_router_load_balancing_type": str(balance or "aux_loss"),
                "moe_token_dispatcher_type": str(values.get("moe_token_dispatcher_type") or "allgather"),
                "moe_grouped_gemm": bool(values.get("moe_grouped_gemm", False))})
    if _sigmoid_routed(values):
        cfg.update(_routing_nemo(values))
        if values.get("mtp_num_layers"):
            cfg["mtp_num_layers"] = int(values["mtp_num_layers"])


def _sigmoid_routed(values: dict[str, Any]) -> bool:
    """Experts routed by sigmoid scores without multi-latent attention (GLM45Bridge's
    ``GPTModelProvider``): its router fields and MTP are read (:func:`_routing_nemo`)."""
    return (not values.get("multi_latent_attention") and values.get("moe_router_score_function") == "sigmoid"
            and bool(values.get("num_moe_experts") or values.get("num_experts")))


def _routing_nemo(values: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-style routing's NeMo fields from Megatron-Core's router fields (the score
    function as written; groups of 1 mean ungrouped; an absent scaling factor is 1)."""
    groups = int(values.get("moe_router_num_groups") or 1)
    factor_k = values.get("moe_router_topk_scaling_factor")
    return {"moe_router_score_function": str(values.get("moe_router_score_function") or "softmax"),
            "moe_router_enable_expert_bias": bool(values.get("moe_router_enable_expert_bias", False)),
            "moe_router_topk_scaling_factor": float(factor_k) if factor_k is not None else 1.0,
            "moe_router_num_groups": groups if groups > 1 else None,
            "moe_router_group_topk": int(values["moe_router_group_topk"]) if groups > 1 else None}


def _mla_nemo(cfg: dict[str, Any], values: dict[str, Any], where: str) -> None:
    """An MLA model with experts (what the DeepSeek families claim): the MLA head dimensions,
    DeepSeek's routing as written — sigmoid scores with the expert bias (V3), or softmax scores
    without one (V2) —, ungated shared experts and MLA's RoPE (:func:`_mla_rope`)."""
    cfg.update(_mla_rope(values, where))
    score = values.get("moe_router_score_function", MOE_NEUTRAL["moe_router_score_function"])
    for k, want in (("moe_router_enable_expert_bias", score == "sigmoid"), ("moe_shared_expert_gate", False)):
        have = values.get(k, MOE_NEUTRAL.get(k, False))
        if have != want:
            raise UnsupportedError(f"{where}: {k}={have!r} with multi-latent attention and {score} scores: "
                                   f"DeepSeek's routing needs {want!r}")
    cfg["multi_latent_attention"] = True
    if values.get("mtp_num_layers"):
        cfg["mtp_num_layers"] = int(values["mtp_num_layers"])
    for k in MLA_FIELDS:
        cfg[k] = None if values.get(k) is None else int(values[k])
    if cfg["kv_lora_rank"] is None:
        raise ConfigError(f"{where}: multi-latent attention without kv_lora_rank")
    cfg["kv_channels"] = cfg["v_head_dim"]
    cfg["num_query_groups"] = int(cfg["num_attention_heads"])  # MLA has one key and value per head
    cfg["qk_layernorm"] = True  # MLA's latent norms (the DeepSeek-V3 family's constant)
    cfg.update({**_routing_nemo(values), "moe_shared_expert_gate": False,
                "moe_router_load_balancing_type": "aux_loss", "moe_token_dispatcher_type": "alltoall",
                "moe_grouped_gemm": False})
    if score == "sigmoid":
        cfg["moe_router_pre_softmax"] = False  # sigmoid routing does not read it


def _mla_rope(values: dict[str, Any], where: str) -> dict[str, Any]:
    """MLA's RoPE fields for the NeMo config. ``rope_type`` absent means MLATransformerConfig's
    ``yarn``; YaRN at factor 1 (what DeepSeekV3Bridge writes without YaRN: concentration
    mscale(1, m) / mscale(1, a) = 1, softmax factor mscale(1, a)² = 1) is plain RoPE; other
    YaRN passes through (MLATransformerConfig's defaults for the fields not given). Plain
    ``rope_type: rope`` with a softmax factor (MLA applies mscale(factor, mscale_all_dim)² for
    both types, multi_latent_attention.py line 125) has no HF spelling and is refused."""
    rope = values.get("rope_type") or "yarn"
    yarn: dict[str, Any] = {k: values[k] if values.get(k) is not None else MLA_CLASS_DEFAULTS[k]
                            for k in MLA_YARN}
    factor, all_dim = float(yarn["rotary_scaling_factor"]), float(yarn["mscale_all_dim"])
    if rope == "rope" and factor > 1.0 and all_dim:
        raise UnsupportedError(f"{where}: rope_type='rope' with rotary_scaling_factor={factor} and mscale_all_dim="
                               f"{all_dim} scales MLA's softmax, which plain RoPE in transformers does not")
    if rope == "rope" or (rope == "yarn" and factor == 1.0):
        return dict(MLA_PLAIN)  # the spec's plain MLA RoPE
    if rope != "yarn":
        raise UnsupportedError(f"{where}: rope_type={rope!r} is not a RoPE of multi-latent attention (rope, yarn)")
    return {"rope_type": "yarn", **{k: (int(v) if k == "original_max_position_embeddings" else float(v))
                                    for k, v in yarn.items()}}


def _common_nemo(values: dict[str, Any], hybrid: bool = False) -> dict[str, Any]:
    cfg: dict[str, Any] = {"mcore_gpt": True, "target": NEMO_GPT_TARGET}
    for f in FIELDS:
        name = f.provider
        if name is None:
            continue
        value = values.get(name, PROVIDER_DEFAULTS.get(name, f.default))
        cfg[f.nemo] = f.kind(value) if value is not None else None
    if cfg.get("position_embedding_type") == "yarn":
        cfg.update(yarn_nemo(values, "the model section"))
    elif cfg.get("position_embedding_type") not in (("rope", "none") if hybrid else ("rope",)):
        raise UnsupportedError(f"position_embedding_type={cfg.get('position_embedding_type')!r}: only rope "
                               "models" + (" and hybrid stacks without position embeddings" if hybrid else "")
                               + " are supported")
    if cfg.get("seq_len_interpolation_factor") is None:
        cfg.pop("seq_len_interpolation_factor")
    cfg["encoder_seq_length"] = cfg["max_position_embeddings"]
    return cfg


def _llama3_fields(scaling: Llama3Scaling) -> dict[str, Any]:
    """NeMo's llama3 RoPE fields (the NeMo projection of :class:`~nemo_convert.spec.Llama3Scaling`)."""
    return {"scale_positional_embedding": True, "scale_factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
            "old_context_len": scaling.original_max_positions}


def _apply_rope_scaling(cfg: dict[str, Any], on: Any, factor: Any) -> None:
    """Megatron-Core's ``rope_scaling`` / ``rope_scaling_factor``: llama3 scaling with the
    factor given and the rest fixed (:data:`nemo_convert.spec.LLAMA3_DEFAULTS`)."""
    cfg["scale_positional_embedding"] = bool(on)
    if on:
        d = LLAMA3_DEFAULTS
        cfg.update(_llama3_fields(replace(d, factor=float(factor if factor is not None else d.factor))))


def _sliding_window_record(cfg: dict[str, Any]) -> None:
    """Megatron's ``window_size=[W-1, 0]`` (Megatron-Bridge's and Megatron-LM's convention:
    W-1 keys before the query) recorded as HF's ``sliding_window=W`` for export."""
    ws = cfg.get("window_size")
    if ws:
        if len(ws) != 2 or int(ws[1]) != 0:
            raise UnsupportedError(f"window_size={ws!r} is not a causal sliding window [left, 0]")
        cfg["nemo_convert"] = {**(cfg.get("nemo_convert") or {}), "sliding_window": window_keys(ws)}


def provider_to_nemo(model: dict[str, Any], where: str, providers: ProviderTable) -> dict[str, Any]:
    """NeMo 1 config fields from a ``run_config.yaml`` ``model:`` section (plain YAML);
    fields it leaves out mean its provider class's defaults (``providers``: the classes the
    installed families declare, :meth:`ProviderTable.class_defaults`)."""
    target = target_of(model)
    classes = providers.class_defaults()
    known = classes.get(target)
    if known is None and target.startswith(providers.family_modules()):
        raise UnsupportedError(f"{where}: model provider {target} is not supported (known: "
                               + ", ".join(sorted(t.rsplit(".", 1)[-1] for t in classes)) + ")")
    written = model
    model = {**(known or {}), **model}
    pf = providers.declared(target)
    hybrid = pf is not None and pf.hybrid
    if target == HYBRID_PROVIDER and not hybrid:
        raise UnsupportedError(f"{where}: model provider {target} is declared by no installed family")
    counted = model.get("hybrid_layer_pattern") or model.get(NEMO_HYBRID_PATTERN)
    if hybrid and model.get("num_layers") is None and isinstance(counted, str):
        model["num_layers"] = len(counted)  # HybridModelProvider.finalize counts the pattern
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if model.get(k) is None]
    if missing:
        raise ConfigError(f"{where}: the model section lacks {', '.join(missing)}")
    model, declared = declared_read(model, pf, where)
    _refuse_non_neutral(model, where, hybrid=hybrid)
    if pf is not None:
        _refuse_unfixed(model, pf, where)
    cfg = _common_nemo(model, hybrid=hybrid)
    cfg.update(declared)
    heads = int(model["num_attention_heads"])
    cfg["num_query_groups"] = int(model.get("num_query_groups") or heads)
    if cfg.get("kv_channels") is None:
        cfg["kv_channels"] = int(model["hidden_size"]) // heads
    if cfg.get("ffn_hidden_size") is None:
        cfg["ffn_hidden_size"] = 4 * int(model["hidden_size"])
    norm = str(model.get("normalization", PROVIDER_DEFAULTS["normalization"]))
    cfg["normalization"] = {v: k for k, v in NORMALIZATIONS.items()}.get(norm) or _refuse(where, "normalization", norm)
    fn = target_of(model.get("activation_func") or "torch.nn.functional.gelu").rsplit(".", 1)[-1]
    gated = bool(model.get("gated_linear_unit", False))
    if fn == "quick_gelu" and not is_gpt_oss(model):
        raise UnsupportedError(f"{where}: activation_func quick_gelu without GPT-OSS's attention sinks is not a "
                               "model any family here runs")
    cfg.update(_activation(gated, fn, bool(model.get("bias_activation_fusion", False)), where))
    cfg.update(providers.implied_nemo(target))
    declared_nemo(cfg, model, pf, where)
    if cfg.get("layernorm_zero_centered_gamma") and cfg["normalization"] == "rmsnorm" and not cfg.get(
            "apply_embedding_scaling"):
        raise UnsupportedError(f"{where}: layernorm_zero_centered_gamma without GemmaModelProvider's embedding "
                               f"scaling ({target or 'no _target_'}) is not a model any family here runs")
    _sliding_window_record(cfg)
    _moe_nemo(cfg, model, where)
    if hybrid:
        hybrid_nemo(cfg, model, where)
    if is_gpt_oss(model):
        extra = gpt_oss_nemo(model, int(cfg["num_layers"]), where)
        cfg["nemo_convert"] = {**(cfg.get("nemo_convert") or {}), **extra.pop("nemo_convert")}
        cfg.update(extra)
    cfg["share_embeddings_and_output_weights"] = bool(model.get("share_embeddings_and_output_weights",
                                                                PROVIDER_DEFAULTS["share_embeddings_and_output_weights"]))
    cfg["precision"] = precision_of_dtype_name(dtype_name_of_flags(
        model.get("bf16"), model.get("fp16"), target_of(model.get("params_dtype")).rsplit(".", 1)[-1]))
    cfg["make_vocab_size_divisible_by"] = int(model.get("make_vocab_size_divisible_by") or 128)
    _read_rope_scaling(cfg, model, written, where)
    return cfg


#: NeMo 2's spelling of llama3 RoPE scaling (NeMo 8cfedd7 ``llm/gpt/model/llama.py``
#: ``Llama31Config`` lines 159-171), which Megatron-Bridge v0.1.0a0 to v0.3.0 also wrote for its
#: own llama3 provider classes (v0.3.0 ``llama/llama_provider.py`` lines 135-171, applied in
#: ``provide()``; replaced by ``rope_scaling`` / ``rope_scaling_factor`` in 30489d616).
NEMO2_LLAMA3 = ("scale_factor", "low_freq_factor", "high_freq_factor", "old_context_len")


def _read_rope_scaling(cfg: dict[str, Any], model: dict[str, Any], written: dict[str, Any], where: str) -> None:
    """llama3 RoPE scaling from a provider section: NeMo 2's fields (:data:`NEMO2_LLAMA3`) where
    the section writes them, else Megatron-Core's ``rope_scaling`` / ``rope_scaling_factor``
    (``model``: the section over its class's declared defaults). A section writing both
    spellings must mean the same scaling."""
    if not any(written.get(k) is not None for k in NEMO2_LLAMA3):
        _apply_rope_scaling(cfg, model.get("rope_scaling"), model.get("rope_scaling_factor"))
        return
    d = LLAMA3_DEFAULTS
    sc = Llama3Scaling(float(model.get("scale_factor") or d.factor),
                       float(model.get("low_freq_factor") or d.low_freq_factor),
                       float(model.get("high_freq_factor") or d.high_freq_factor),
                       int(model.get("old_context_len") or d.original_max_positions))
    if "rope_scaling" in written or "rope_scaling_factor" in written:
        on, factor = written.get("rope_scaling", model.get("rope_scaling")), written.get("rope_scaling_factor")
        if not on or (factor is not None and float(factor) != sc.factor):
            raise UnsupportedError(f"{where}: scale_factor={sc.factor} with rope_scaling={on!r}, rope_scaling_factor="
                                   f"{factor!r}: the two spellings of llama3 RoPE scaling disagree")
    cfg.update(_llama3_fields(sc))


def _refuse_unfixed(values: dict[str, Any], pf: ProviderFamily, where: str) -> None:
    """A section of a class one family declares holds that family's constants
    (:attr:`ProviderFamily.fixed`, absent fields as the class's defaults): another value is a
    model the family's HF class does not compute (a hybrid stack with RoPE or GeLU), refused by
    name rather than read as that family. Functions compare by their last name."""
    for k, want in pf.fixed:
        have = values.get(k, FIXED_ABSENT.get(k, PROVIDER_DEFAULTS.get(k)))
        if k == "activation_func":
            have, want = (target_of(have) or "torch.nn.functional.gelu").rsplit(".", 1)[-1], want.rsplit(".", 1)[-1]
        if have != want:
            raise UnsupportedError(f"{where}: {k}={have!r}, but {pf.target.rsplit('.', 1)[-1]} is read only as the "
                                   f"family that declares it, whose model needs {want!r}")


def _refuse(where: str, what: str, value: Any) -> Any:
    raise UnsupportedError(f"{where}: {what}={value!r} is not supported")


def _activation(gated: bool, fn: str, fused: bool, where: str) -> dict[str, Any]:
    """NeMo 1's activation fields for a Megatron-Core ``activation_func`` (its last name),
    ``gated_linear_unit`` and ``bias_activation_fusion`` (:mod:`nemo_convert.spec.activations`)."""
    act = mcore_activation(fn, gated, fused=fused)
    fields = NEMO_ACTIVATION_FIELDS.get(act) if act is not None else None
    return dict(fields) if fields is not None else _refuse(where, "activation_func", f"{fn} (gated={gated})")


def args_to_nemo(args: dict[str, Any], where: str, providers: ProviderTable | None = None) -> dict[str, Any]:
    """NeMo 1 config fields from a Megatron-LM ``args`` namespace (as a plain dict), read as the
    provider section the run's ``TransformerConfig`` is
    (:func:`~nemo_convert.formats.megatron.megatron_lm_args.run_section`) by
    :func:`provider_to_nemo`: one translation for both. A GPT run's section is of the generic
    ``GPTModelProvider`` (``pretrain_gpt.py`` builds Megatron-Core's ``GPTModel`` from it, whatever
    the family: the family is then picked by its own claim); a hybrid run's
    (:func:`~nemo_convert.formats.megatron.megatron_lm_args.is_hybrid_run`) is of the hybrid
    family that ``providers`` (the registry's) declares."""
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if args.get(k) is None]
    if missing:
        raise ConfigError(f"{where}: args lacks {', '.join(missing)}")
    table = providers if providers is not None else ProviderTable()  # none: no family declares one
    hybrid = is_hybrid_run(args, f"{where}: args")
    model_type = args.get("model_type")
    if model_type is not None and model_type != DECODER_MODEL_TYPE:
        raise UnsupportedError(f"{where}: args: model_type={model_type} is not " + (
            f"the decoder-only model type ({DECODER_MODEL_TYPE}) pretrain_mamba.py trains" if hybrid else
            f"a decoder-only GPT model ({DECODER_MODEL_TYPE}); only those are read"))
    if hybrid:
        pf = hybrid_family_provider(table, f"{where}: args")
        return provider_to_nemo(hybrid_section(args, f"{where}: args", pf.target), f"{where}: args", table)
    return provider_to_nemo(run_section(args, f"{where}: args", GPT_PROVIDER), f"{where}: args", table)
