"""Megatron-Bridge model providers as the families declare them.

A family says what ``--to megatron-bridge`` writes for it on its own record
(``ModelFamily.megatron_bridge``): a :class:`ProviderFamily` (its provider class and the
constants Megatron-Bridge's bridge for it sets) or a string, the reason the family is
refused. :class:`ProviderTable` is the registry's collection of those declarations; the
one provider table (:mod:`.megatron_config`) reads it both ways. Nothing here names a
family: the shared pieces below are Megatron-Core's and Megatron-Bridge's own classes and
the field groups several bridges set alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_convert.errors import UnsupportedError

#: Megatron-Bridge's generic GPT provider (``src/megatron/bridge/models/gpt_provider.py``).
GPT_PROVIDER = "megatron.bridge.models.gpt_provider.GPTModelProvider"
#: Megatron-Bridge's multi-latent-attention provider (``mla_provider.py``: Megatron-Core's
#: ``MLATransformerConfig`` + ``GPTModelProvider``).
MLA_PROVIDER = "megatron.bridge.models.mla_provider.MLAModelProvider"
#: What an absent field of ``MLAModelProvider`` means: ``MLATransformerConfig``'s defaults
#: (megatron-core 0.16.1 ``transformer_config.py`` lines 2013-2059).
MLA_CLASS_DEFAULTS: dict[str, Any] = {
    "multi_latent_attention": True, "q_lora_rank": 512, "kv_lora_rank": 512, "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "normalization": "RMSNorm", "rope_type": "yarn",
    "rotary_scaling_factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
    "mscale": 1.0, "mscale_all_dim": 0.0}

#: Megatron-Bridge's hybrid provider (``hybrid/hybrid_provider.py`` at ``067f987d``: Megatron-Core's
#: ``TransformerConfig`` for its ``HybridModel``, a stack of Mamba-2, attention, MLP and MoE
#: layers chosen by ``hybrid_layer_pattern``).
HYBRID_PROVIDER = "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider"
#: What an absent field of ``HybridModelProvider`` means (``hybrid_provider.py`` at ``067f987d``
#: lines 116-152; the Mamba sizes it leaves to ``TransformerConfig``: Megatron-Core 0.16.1
#: ``transformer_config.py`` lines 846-857, ``mamba_num_heads`` None = ``2 × hidden / head size``).
HYBRID_CLASS_DEFAULTS: dict[str, Any] = {
    "share_embeddings_and_output_weights": False, "bf16": True, "fp16": False, "params_dtype": "torch.bfloat16",
    "mamba_num_groups": 8, "mamba_head_dim": 64, "mamba_state_dim": 128, "mamba_num_heads": None,
    "num_attention_heads": 1, "hybrid_attention_ratio": 0.0, "hybrid_mlp_ratio": 0.0, "seq_length": 8192,
    "position_embedding_type": "none", "rotary_percent": 1.0, "rotary_base": 10000, "gated_linear_unit": False,
    "normalization": "RMSNorm", "add_bias_linear": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    "layernorm_epsilon": 1e-5, "make_vocab_size_divisible_by": 128}

#: ``activation_func`` spellings (Megatron-Core's and torch's functions by import path).
SILU = "torch.nn.functional.silu"
#: Megatron-Core's tanh GeLU.
FAST_GELU = "megatron.core.activations.fast_gelu"
#: Megatron-Core's squared ReLU.
SQUARED_RELU = "megatron.core.activations.squared_relu"

Pairs = tuple[tuple[str, Any], ...]

#: What ``LlamaBridge`` and the bridges built like it set: RMSNorm, a gated linear unit, RoPE.
DENSE: Pairs = (("normalization", "RMSNorm"), ("gated_linear_unit", True), ("position_embedding_type", "rope"))
NO_LINEAR_BIAS: Pairs = (("add_bias_linear", False),)
#: ``autocast_dtype: bfloat16``, which the Qwen bridges set (not math).
AUTOCAST_BF16: Pairs = (("autocast_dtype", {"_target_": "torch.bfloat16", "_call_": False}),)
#: What an absent field of a dense provider subclass means where it differs from
#: ``GPTModelProvider`` (the subclasses' common choices).
DENSE_CLASS_DEFAULTS: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": SILU, "gated_linear_unit": True, "position_embedding_type": "rope",
    "add_bias_linear": False, "share_embeddings_and_output_weights": False}


@dataclass(frozen=True)
class ProviderFamily:
    """A family's confirmed Megatron-Bridge provider.

    :param target: the provider class (``_target_`` of ``run_config.yaml``'s ``model:``).
    :param fixed: provider fields that are constants for the family (a config that needs
        another value is refused).
    :param nemo: NeMo fields the provider implies when read back (Gemma's embedding
        scaling, which its provider's ``provide()`` applies).
    :param extra: what the bridge sets that does not change the math.
    :param extra_with_window: what the bridge sets beside a sliding window (not math).
    :param defaults: what an absent field of ``target`` means when a directory is read
        (the class's own defaults; ``GPTModelProvider``'s where not given).
    :param reads: older provider classes of the family that are read (never written),
        each with its defaults.
    :param modules: Megatron-Bridge modules that hold the family's other provider classes
        (Gemma 2 beside Gemma): a class of theirs not declared is refused by name, never
        read as a plain GPT (the modules of ``target`` and ``reads`` count already).
    :param moe, mla, gpt_oss, shared_experts: what the provider expresses: experts,
        multi-latent attention with DeepSeek's routing and MTP, GPT-OSS's sinks / window
        pattern / clamped GLU (:mod:`.provider_gpt_oss`), shared experts.
    :param routing: without multi-latent attention, the router fields of DeepSeek-style
        routing (``moe_router_score_function``, ``moe_router_enable_expert_bias``,
        ``moe_router_topk_scaling_factor``, ``moe_router_num_groups`` /
        ``moe_router_group_topk``), written from the spec.
    :param mtp: without multi-latent attention, ``mtp_num_layers`` (the multi-token
        prediction block).
    :param softcaps: the provider carries ``query_pre_attn_scalar`` (the scores scaled by
        its ``-0.5`` power) and the tanh soft-caps ``attn_logit_softcapping`` /
        ``final_logit_softcapping`` (null or 0: none), under the NeMo config's names.
    :param post_norms: the provider's layer spec normalises each sublayer's output before
        the residual add (read back as our record ``nemo_convert.post_norms``).
    :param hybrid: the provider is :data:`HYBRID_PROVIDER`'s hybrid stack: ``hybrid_layer_pattern``
        (the NeMo config's ``hybrid_override_pattern``), the Mamba sizes (``mamba_num_heads``,
        ``mamba_head_dim``, ``mamba_num_groups``, ``mamba_state_dim``) and ``is_hybrid_model``;
        ``moe`` then means the ``E`` layers' experts, when the pattern has any. ``nemo``
        names the NeMo class read back (``target``).
    :param window_layers: the provider's layer spec picks the windowed layers itself
        (``window_attn_skip_freq`` is not read): ``window_layers(num_layers)`` is one flag per
        layer (True: ``window_size`` applies). A model windowing other layers is refused.
    :param softmax_scale: the provider carries the scores' scale as Megatron-Core's
        ``softmax_scale`` (``query_pre_attn_scalar ** -0.5``; null: the head size's), not as
        ``query_pre_attn_scalar``; it has no soft-caps unless ``softcaps`` says so.
    :param local_rope: the provider holds two RoPEs: ``rotary_base = (local, global)`` (the
        windowed layers' base first) and the global layers' linear factor as
        ``rope_scaling_factor``; its RoPE module takes 1 for ``rotary_percent`` and gives
        ``seq_len_interpolation_factor`` to both, so those must be neutral.
    :param interleaved_windows: the provider's layer spec windows the layers its
        ``interleaved_attn_pattern`` names (``(local, global)`` counts repeating from the first
        layer, or one ``sliding_attention`` / ``full_attention`` per layer) with an int
        ``window_size`` of W keys (Megatron-Core's ``(W - 1, 0)`` on those layers);
        ``window_attn_skip_freq`` is not read.
    :param neutral: fields of the class that change the math and are read only at this
        value (a section setting another is refused by name).
    """

    target: str
    fixed: Pairs = ()
    nemo: Pairs = ()
    extra: Pairs = ()
    extra_with_window: Pairs = ()
    defaults: Pairs = ()
    reads: tuple[tuple[str, Pairs], ...] = ()
    modules: tuple[str, ...] = ()
    moe: bool = False
    mla: bool = False
    gpt_oss: bool = False
    shared_experts: bool = False
    routing: bool = False
    mtp: bool = False
    softcaps: bool = False
    post_norms: bool = False
    hybrid: bool = False
    window_layers: Callable[[int], tuple[bool, ...]] | None = None
    softmax_scale: bool = False
    local_rope: bool = False
    interleaved_windows: bool = False
    neutral: Pairs = ()


#: A family's declaration: its provider, a refusal's reason, or nothing (not confirmed).
Declaration = ProviderFamily | str | None


@dataclass(frozen=True)
class ProviderTable:
    """The providers the installed families declare (``Registry.providers()``), by family,
    and the NeMo 2 config classes they read (``nemo2``: NeMo 2 model class → config class →
    :attr:`~nemo_convert.plugins.records.NemoTarget.nemo2_configs` declaration)."""

    families: Mapping[str, ProviderFamily | str] = field(default_factory=dict)
    nemo2: Mapping[str, Mapping[str, Mapping[str, Any] | str]] = field(default_factory=dict)

    def writable(self) -> list[str]:
        """The families ``--to megatron-bridge`` writes, sorted."""
        return sorted(f for f, p in self.families.items() if isinstance(p, ProviderFamily))

    def of(self, family: str) -> ProviderFamily:
        """The confirmed provider of ``family``, or a one-line refusal naming it."""
        p = self.families.get(family)
        if isinstance(p, ProviderFamily):
            return p
        if isinstance(p, str):
            raise UnsupportedError(f"family {family!r} cannot be written with --to megatron-bridge: {p}")
        raise UnsupportedError(f"family {family!r} has no confirmed Megatron-Bridge model provider; --to "
                               f"megatron-bridge supports: {', '.join(self.writable())}")

    def class_defaults(self) -> dict[str, dict[str, Any]]:
        """What an absent field means, by provider class: ``GPTModelProvider``,
        ``MLAModelProvider`` and ``HybridModelProvider`` (Megatron-Bridge's), then each declared class and the older
        classes the families read."""
        out: dict[str, dict[str, Any]] = {GPT_PROVIDER: {}, MLA_PROVIDER: dict(MLA_CLASS_DEFAULTS),
                                          HYBRID_PROVIDER: dict(HYBRID_CLASS_DEFAULTS)}
        for p in self.families.values():
            if isinstance(p, ProviderFamily):
                out.setdefault(p.target, dict(p.defaults))
                for target, defaults in p.reads:
                    out.setdefault(target, dict(defaults))
        return out

    def declared(self, target: str) -> ProviderFamily | None:
        """The one declaration whose provider class is ``target``: what that class
        expresses when a directory is read (None: no family declares it, or several share it,
        like ``GPTModelProvider``: then only the shared fields are read)."""
        mine = [p for p in self.families.values() if isinstance(p, ProviderFamily) and p.target == target]
        return mine[0] if len(mine) == 1 else None

    def implied_nemo(self, target: str) -> dict[str, Any]:
        """The NeMo fields provider class ``target`` implies (:attr:`ProviderFamily.nemo`)."""
        out: dict[str, Any] = {}
        for p in self.families.values():
            if isinstance(p, ProviderFamily) and p.target == target:
                out.update(dict(p.nemo))
        return out

    def family_modules(self) -> tuple[str, ...]:
        """The modules of the declared provider subclasses: another class of one of them
        is a model these tables do not know (refused by name, never read as a GPT)."""
        known = {t.rsplit(".", 1)[0] + "." for t in set(self.class_defaults()) - {GPT_PROVIDER}}
        for p in self.families.values():
            if isinstance(p, ProviderFamily):
                known.update(p.modules)
        return tuple(sorted(known))
