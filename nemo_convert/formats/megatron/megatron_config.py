"""One table between the three spellings of a GPT model config: NeMo 1's
``model_config.yaml``, Megatron-Bridge's model provider (the ``model:`` section of
``run_config.yaml``) and Megatron-LM's ``args`` namespace (``common.pt``).

Megatron-LM core_v0.16.1 builds its transformer arguments from the fields of
``TransformerConfig`` (``megatron/training/arguments.py`` line 1621,
``ArgumentGroupFactory(TransformerConfig, …)``) and turns them back into a config in
``core_transformer_config_from_args`` (lines 1306–1370: ``swiglu`` → gated SiLU,
``group_query_attention`` gates ``num_query_groups``, ``num_experts`` →
``num_moe_experts``); the few arguments of its own are in the "network size" group
(lines 1630–1697). Megatron-Bridge's ``LlamaBridge.provider_bridge``
(``src/megatron/bridge/models/llama/llama_bridge.py``) derives a ``GPTModelProvider`` from
an HF config through the base bridge's field table plus RMSNorm, gated linear unit, RoPE,
``rotary_percent`` 1.0 and, for ``rope_type: llama3``, ``rope_scaling`` with
``rope_scaling_factor``; dtype (``bf16``/``fp16``/``params_dtype``) and
``make_vocab_size_divisible_by`` (the largest power of two ≤ 128 dividing the
vocabulary) come from the base bridge. The facts we rely on were measured with
Megatron-Bridge 0.6.2 (``/work/shared/reference/megatron-dirs.md``).

The other dense families follow their own bridges (Megatron-Bridge v0.6.0, ``src/megatron/
bridge/models/``): ``mistral/mistral_bridge.py`` builds a ``MistralModelProvider`` with
``window_size = [sliding_window - 1, 0]`` and ``cp_comm_type: a2a`` (lines 56–59; back in
``conversion/utils.py`` lines 27–39, ``mcore_to_hf_window_size`` = ``window_size[0] + 1``) —
our ``[W-1, 0]``; ``qwen/qwen2_bridge.py`` (lines 46–57) and ``qwen/qwen3_bridge.py``
(lines 43–55) keep the base bridge's ``GPTModelProvider`` and set RMSNorm, gated SiLU,
``add_bias_linear: false``, ``add_qkv_bias`` true (Qwen2) / false with ``qk_layernorm: true``
(Qwen3) and ``autocast_dtype: bfloat16``; ``gemma/gemma_bridge.py`` (lines 31–78) builds a
``GemmaModelProvider`` with ``fast_gelu`` (tanh GeLU), ``layernorm_zero_centered_gamma`` and
tied embeddings, whose ``provide()`` scales the embedding by sqrt(hidden)
(``gemma/gemma_provider.py`` lines 56–80). Megatron-Bridge has no Phi-3 bridge in any release
(a Phi-3 provider exists only on an unmerged branch, commit 0beb53f): Phi-3 is refused.
``nemotron/nemotron_bridge.py`` (v0.6.0 lines 56-72) keeps the base bridge's ``GPTModelProvider``
(``norm_eps`` → ``layernorm_epsilon``, ``partial_rotary_factor`` → ``rotary_percent``, ``head_dim``
→ ``kv_channels``: ``model_bridge.py`` lines 438-459) and sets ``normalization: LayerNorm``,
``activation_func: squared_relu`` (non-gated: the provider's default), ``add_bias_linear: false``,
``layernorm_zero_centered_gamma: true`` and fusion switches; the ``NemotronModelProvider`` class
of v0.3.x (``nemotron/nemotron_provider.py``) is gone since. Megatron-Bridge has no GPT-2
bridge (v0.6.0 ``src/megatron/bridge/models/`` has no ``gpt2``): GPT-2 is refused.

Mixture-of-experts (Megatron-Bridge v0.6.0): Qwen3-MoE and DeepSeek-V3 have bridges.
``qwen/qwen3_moe_bridge.py`` (lines 51–70) keeps the base bridge's
``GPTModelProvider`` — whose field table (``conversion/model_bridge.py`` lines 461–464) maps
``num_experts``/``num_local_experts`` → ``num_moe_experts``, ``num_experts_per_tok`` →
``moe_router_topk``, ``moe_intermediate_size`` → ``moe_ffn_hidden_size`` — and sets Qwen3's
attention fields, ``moe_router_pre_softmax = not norm_topk_prob`` and the training knobs
``moe_grouped_gemm: true``, ``moe_router_load_balancing_type: aux_loss``,
``moe_aux_loss_coeff: 1e-3``, ``moe_token_dispatcher_type: alltoall``,
``moe_permute_fusion: true``. That bridge assumes every layer is MoE (line 47,
``decoder_sparse_step = 1`` on the way back); for a mixed stack (``mlp_only_layers``) we write
Megatron-Core's ``moe_layer_freq`` list, which is the model's math. No release of
Megatron-Bridge (v0.1.0 to v0.6.0, nor main at 067f987) has a Mixtral or a Qwen2-MoE bridge:
both are refused. ``deepseek/deepseek_v3_bridge.py`` (lines 44–99) builds an
``MLAModelProvider`` (``mla_provider.py``: Megatron-Core's ``MLATransformerConfig`` with the
GPT provider): the table's MLA rows (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim`` →
``qk_head_dim``, ``qk_rope_head_dim`` → ``qk_pos_emb_head_dim``, ``v_head_dim``; lines
473–477), ``n_group``/``topk_group``/``routed_scaling_factor`` (469–471), HF's ``head_dim`` (=
``qk_rope_head_dim``) as ``kv_channels``; the bridge then sets sigmoid scores with expert
bias, ``moe_router_pre_softmax: true`` (ignored by sigmoid routing), ``moe_layer_freq`` =
``[0] * first_k_dense_replace + [1] * rest``, ``moe_shared_expert_intermediate_size`` =
``moe_intermediate_size * n_shared_experts``, ``make_vocab_size_divisible_by: 1280`` and, for
a config without YaRN, ``rotary_scaling_factor: 1`` and ``mscale_all_dim: 1`` over the
class's ``rope_type: yarn`` (``model_bridge.py`` lines 604–614): YaRN at factor 1, i.e. plain
RoPE; with YaRN (the hub models'), the HF block's ``factor``, ``original_max_position_embeddings``,
``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim`` as ``rotary_scaling_factor`` and the
same names (lines 495–504, 583–594) — MLATransformerConfig's fields, which our NeMo config
carries under those names already (``nemo_convert/families/yarn.py``). ``mtp_num_layers`` is the count of multi-token-prediction layers (line 97), whose keys we
write as Megatron-Core 0.16.1 names them (``mtp.layers.<k>.transformer_layer.…``). Reading a
directory, the MoE fields (:data:`MOE_FIELDS`; Megatron-LM's
``--num-experts`` is ``num_experts``, arguments.py line 2691, ``moe_ffn_hidden_size``
defaulting to ``ffn_hidden_size``, lines 1016–1018) pass into the NeMo config, where the
family registry decides (Mixtral, Qwen3-MoE, Qwen2-MoE by their claims); routing the table
does not express is refused by name (:data:`MOE_NEUTRAL`).

A provider subclass may carry more than the shared fields, as its family declares
(:class:`~nemo_convert.formats.megatron.providers.ProviderFamily`): the score fields
(:data:`SCORE_FIELDS`: ``query_pre_attn_scalar`` and the tanh soft-caps, ``softcaps``),
post-norms in its layer spec (``post_norms``) and a window pattern of its own layer spec
(``window_layers``: ``window_attn_skip_freq`` is then neither written nor read). Megatron-Bridge
``067f987d`` ``gemma/gemma2_provider.py`` is the case: fields at lines 497-499, the odd 1-based
layers windowed at lines 125-129, the post-norms at lines 438-463. Where such a class's default
for a field is not null (window ``(4095, 0)``, caps 50 / 30), a model without it is written
with an explicit null.
A provider may also spell shared fields its own way (``softmax_scale``, ``local_rope``,
``interleaved_windows``): Megatron-Bridge ``067f987d`` ``gemma/gemma3_provider.py`` holds the
scores' scale as ``softmax_scale`` (line 79), the two RoPE bases as ``rotary_base = (local,
global)`` with the global layers' linear factor ``rope_scaling_factor`` (lines 62, 76, 113-137,
303-316) and its windows as an int ``window_size`` on the layers ``interleaved_attn_pattern``
names (lines 72-73, 241-255, 349-357); :func:`_declared_provider` writes them from the spec and
:func:`_declared_read` turns them into the shared spelling before anything else reads the
section. A ``rotary_base`` pair of any other class, or a local RoPE base for any other
provider, is refused by name.

A hybrid stack (:attr:`ProviderFamily.hybrid`: Megatron-Bridge's ``HybridModelProvider``,
``hybrid/hybrid_provider.py`` at ``067f987d``) carries the per-layer pattern as
``hybrid_layer_pattern`` (the NeMo config's ``hybrid_override_pattern``), the Mamba sizes under
``TransformerConfig``'s names and ``is_hybrid_model``; it has no position embedding
(``position_embedding_type: none``) and, without ``E`` layers, no router (whatever router fields
the bridge writes). Read back, the NeMo class is what the family declares (``nemo``).

Which provider a family writes is the family's own declaration (``ModelFamily.megatron_bridge``,
a :class:`~nemo_convert.formats.megatron.providers.ProviderFamily`, collected by the registry
into a :class:`~nemo_convert.formats.megatron.providers.ProviderTable` that every function here
takes); the facts above are cited beside each family's declaration. A field that passes through
unchanged is a row of :data:`FIELDS`; a field that changes the math and that the table does not
know is refused by name (:data:`NEUTRAL`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.formats.megatron.providers import (FAST_GELU, HYBRID_PROVIDER, MLA_CLASS_DEFAULTS,
                                                      SILU, SQUARED_RELU, ProviderFamily, ProviderTable)
from nemo_convert.formats.megatron.provider_flags import (NEMO_HYBRID_PATTERN, SCORE_FIELDS, declared_nemo,
                                                         declared_provider, declared_read, hybrid_nemo,
                                                         hybrid_provider, scores, scores_provider, target_of)
from nemo_convert.formats.megatron.megatron_lm_args import hybrid_family_provider, hybrid_section, is_hybrid_run
from nemo_convert.formats.megatron.provider_gpt_oss import (GPT_OSS_FIELDS, QUICK_GELU, gpt_oss_nemo, gpt_oss_provider,
                                                             is_gpt_oss, yarn_nemo, yarn_provider)
from nemo_convert.mapping.ops import largest_pow2_divisor
from nemo_convert.spec import (LLAMA3_DEFAULTS, MLA_PLAIN, UNMODELLED, Llama3Scaling, ModelSpec, MoE, Rope, YarnScaling,
                               describe_activation, dtype_name_of_flags, mcore_activation,
                               megatron_window,
                               precision_of_dtype_name, provenance_of, spec_of, window_keys)
from nemo_convert.spec.activations import NEMO_ACTIVATION_FIELDS

if TYPE_CHECKING:
    import torch

#: NeMo 1's GPT model class (the ``target`` of a ``.nemo`` config): which family handles
#: the config is decided by the registry, as for any ``.nemo``.
NEMO_GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"


#: ``args.model_type`` of a GPT run as the safe unpickler presents it (``training.py``
#: ``pretrain``: ``args.model_type = model_type``; ``pretrain_gpt.py`` passes
#: ``ModelType.encoder_or_decoder``, value 1 in every release; see ``MEGATRON_ENUMS``).
DECODER_MODEL_TYPE = "ModelType.encoder_or_decoder"


Getter = Callable[[ModelSpec, dict[str, Any]], Any]


@dataclass(frozen=True)
class Field:
    """One field under its three names (None: that side has no such field), the type its
    value is read as and what it means when absent (``default``); ``of`` is the value
    written to a provider: read from the :class:`~nemo_convert.spec.ModelSpec` (and, for
    the training knobs that are not math, from the NeMo config as it is)."""

    nemo: str
    provider: str | None
    megatron_lm: str | None
    kind: Callable[[Any], Any]
    default: Any = None
    of: Getter | None = None


def _float_or_none(v: Any) -> Any:
    return None if v is None else float(v)


def _rope(s: ModelSpec) -> Rope:
    return s.rope or Rope()


def _passthrough(name: str, default: Any) -> Getter:
    """A training knob that is not math (init, dropout): the NeMo field as it is."""
    return lambda s, cfg: cfg.get(name, default)


def _linear_bias(s: ModelSpec, cfg: dict[str, Any]) -> bool:
    """Megatron-Core's ``add_bias_linear`` biases the output projection and the MLP together."""
    if s.attention.proj_bias != s.mlp.bias:
        raise UnsupportedError(f"linear biases on q/k/v={s.attention.qkv_bias}, o_proj={s.attention.proj_bias}, "
                               f"MLP={s.mlp.bias}: Megatron-Core's add_bias_linear biases o_proj and the MLP together")
    return s.mlp.bias


def _window(s: ModelSpec, cfg: dict[str, Any]) -> list[int] | None:
    """Megatron-Bridge's ``window_size`` for the window of HF's ``sliding_window=W`` that export
    would write: ``[W-1, 0]`` (:func:`nemo_convert.spec.megatron_window`)."""
    a = s.attention
    if a.window is None:
        return None
    if a.window_lookahead:
        raise UnsupportedError(f"window_size={cfg.get('window_size')!r} is not a causal sliding window [left, 0]")
    return megatron_window(a.window)


#: Fields that pass through unchanged (renamed only).
FIELDS: tuple[Field, ...] = (
    Field("num_layers", "num_layers", "num_layers", int, of=lambda s, c: s.geometry.layers),
    Field("hidden_size", "hidden_size", "hidden_size", int, of=lambda s, c: s.geometry.hidden),
    Field("ffn_hidden_size", "ffn_hidden_size", "ffn_hidden_size", int, of=lambda s, c: s.geometry.ffn),
    Field("num_attention_heads", "num_attention_heads", "num_attention_heads", int, of=lambda s, c: s.geometry.heads),
    Field("kv_channels", "kv_channels", "kv_channels", int, of=lambda s, c: s.geometry.head_dim),
    Field("max_position_embeddings", "seq_length", "max_position_embeddings", int,
          of=lambda s, c: s.geometry.max_positions),
    Field("init_method_std", "init_method_std", "init_method_std", float, 0.02,
          of=_passthrough("init_method_std", 0.02)),
    Field("layernorm_epsilon", "layernorm_epsilon", "layernorm_epsilon", float, 1e-5, of=lambda s, c: s.norm.eps),
    Field("rotary_base", "rotary_base", "rotary_base", float, 10000.0, of=lambda s, c: _rope(s).theta),
    Field("rotary_percentage", "rotary_percent", "rotary_percent", float, 1.0, of=lambda s, c: _rope(s).fraction),
    Field("position_embedding_type", "position_embedding_type", "position_embedding_type", str, "rope",
          of=lambda s, c: s.positions),
    Field("bias", "add_bias_linear", "add_bias_linear", bool, True, of=_linear_bias),  # TransformerConfig's default
    Field("qkv_bias", "add_qkv_bias", "add_qkv_bias", bool, False, of=lambda s, c: s.attention.qkv_bias),
    Field("qk_layernorm", "qk_layernorm", "qk_layernorm", bool, False, of=lambda s, c: s.attention.qk_norm),
    Field("layernorm_zero_centered_gamma", "layernorm_zero_centered_gamma", "layernorm_zero_centered_gamma",
          bool, False, of=lambda s, c: s.norm.zero_centred),
    Field("window_size", "window_size", "window_size", lambda v: [int(x) for x in v], of=_window),
    Field("seq_len_interpolation_factor", "seq_len_interpolation_factor", "rotary_seq_len_interpolation_factor",
          _float_or_none, of=lambda s, c: _rope(s).interpolation),
    Field("hidden_dropout", "hidden_dropout", "hidden_dropout", float, 0.0, of=_passthrough("hidden_dropout", 0.0)),
    Field("attention_dropout", "attention_dropout", "attention_dropout", float, 0.0,
          of=_passthrough("attention_dropout", 0.0)),
)

def _freq(v: Any) -> Any:
    """``moe_layer_freq``: an int N (every N-th layer from 0) or one 0/1 per layer."""
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else int(v)


#: The mixture-of-experts fields that pass through unchanged when the model has experts
#: (``default``: TransformerConfig's, megatron-core 0.16.1 ``transformer_config.py`` lines
#: 534–617; ``moe_ffn_hidden_size`` None means ``ffn_hidden_size``).
def _moe(s: ModelSpec) -> MoE:
    assert s.moe is not None  # _moe_provider checks it first
    return s.moe


def _pattern(s: ModelSpec, cfg: dict[str, Any]) -> Any:
    """``moe_layer_freq``: 1 when every layer is MoE, else one 0/1 per layer."""
    pattern = _moe(s).layer_pattern
    return 1 if all(pattern) else [int(x) for x in pattern]


MOE_FIELDS: tuple[Field, ...] = (
    Field("num_moe_experts", "num_moe_experts", "num_experts", int, of=lambda s, c: _moe(s).experts),
    Field("moe_router_topk", "moe_router_topk", "moe_router_topk", int, 2, of=lambda s, c: _moe(s).topk),
    Field("moe_ffn_hidden_size", "moe_ffn_hidden_size", "moe_ffn_hidden_size", int, of=lambda s, c: _moe(s).ffn),
    Field("moe_router_pre_softmax", "moe_router_pre_softmax", "moe_router_pre_softmax", bool, False,
          of=lambda s, c: _moe(s).pre_softmax),
    Field("moe_layer_freq", "moe_layer_freq", "moe_layer_freq", _freq, 1, of=_pattern),
    Field("moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
          "moe_shared_expert_intermediate_size", int, of=lambda s, c: _moe(s).shared_ffn or None),
    Field("moe_shared_expert_gate", "moe_shared_expert_gate", "moe_shared_expert_gate", bool, False,
          of=lambda s, c: _moe(s).shared_gate),
)
#: MoE routing that changes the math and that no readable family here expresses (DeepSeek's
#: sigmoid scores, expert bias, scaling and group-limited routing; token dropping; latent
#: experts): refused unless neutral.
MOE_NEUTRAL: dict[str, Any] = {
    "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False,
    "moe_router_topk_scaling_factor": None, "moe_router_num_groups": None, "moe_router_group_topk": None,
    **{k: v for k, v in UNMODELLED.items() if k.startswith("moe_")},
}
#: MoE fields a provider without shared experts (Qwen3-MoE's) must leave neutral.
_NO_SHARED = {"moe_shared_expert_intermediate_size": None, "moe_shared_expert_gate": False}
_EXPERT_COUNTS = ("num_moe_experts", "num_experts")
#: Multi-latent attention's fields (same names in NeMo, the provider and Megatron-LM's
#: args, arguments.py lines 2723-2740) and DeepSeek-V3's routing, which only an MLA model
#: (the DeepSeek-V3 family) expresses here.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
#: MLA's RoPE: ``rope_type`` and MLATransformerConfig's YaRN fields, same names in the NeMo
#: config (nemo_convert/families/yarn.py) and the provider; what Megatron-LM's arguments
#: lack (core_v0.16.1 arguments.py lines 2735-2740 have --rotary-scaling-factor, --mscale,
#: --mscale-all-dim, line 2049 --rope-type) is the class's default (MLA_CLASS_DEFAULTS).
MLA_YARN = ("rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
            "mscale_all_dim")
#: What DeepSeekV3Bridge writes for a config without YaRN (model_bridge.py lines 604-614):
#: YaRN at factor 1 over the class's ``rope_type: yarn``, i.e. plain RoPE.
MLA_BRIDGE_PLAIN = {"rope_type": "yarn", "rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
DEEPSEEK_ROUTING = ("multi_latent_attention", "moe_router_score_function", "moe_router_enable_expert_bias",
                    "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk",
                    "mtp_num_layers")  # DeepSeekV3Bridge: mtp_num_layers = num_nextn_predict_layers or None

#: What an absent provider field means where it differs from :data:`FIELDS`' default
#: (``GPTModelProvider``'s own defaults, ``src/megatron/bridge/models/gpt_provider.py``).
PROVIDER_DEFAULTS: dict[str, Any] = {"position_embedding_type": "learned_absolute", "seq_length": 1024,
                                     "share_embeddings_and_output_weights": True, "normalization": "LayerNorm"}

#: Fields (TransformerConfig / provider fields, and Megatron-LM arguments) that change the
#: math and that no family here handles: refused unless they hold this neutral value
#: (those no spec field models are the spec's :data:`nemo_convert.spec.UNMODELLED`).
NEUTRAL: dict[str, Any] = {
    "num_moe_experts": None, "num_experts": None, "multi_latent_attention": False, "rotary_interleaved": False,
    "apply_residual_connection_post_layernorm": False, "glu_linear_offset": 0.0,
    "activation_func_clamp_value": None, "window_attn_skip_freq": None, "mtp_num_layers": None, "openai_gelu": False,
    **{k: v for k, v in UNMODELLED.items() if not k.startswith("moe_")},
}

#: The canonical MLP functions (:mod:`nemo_convert.spec.activations`) → a provider's
#: ``activation_func`` (the tanh GeLU is Megatron-Core's ``fast_gelu``).
PROVIDER_FUNCTIONS: dict[str, str] = {
    "silu": SILU, "gelu": "torch.nn.functional.gelu", "gelu_tanh": FAST_GELU, "relu": "torch.nn.functional.relu",
    "squared_relu": SQUARED_RELU, "quick_gelu": QUICK_GELU,
}
NORMALIZATIONS = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}


def _callable(name: str) -> dict[str, Any]:
    """How a ``run_config.yaml`` names a function without calling it."""
    return {"_target_": name, "_call_": False}


# ------------------------------------------------------------------- NeMo → provider
def _inexpressible(s: ModelSpec, pf: ProviderFamily) -> dict[str, Any]:
    """What the model computes that the family's provider does not express, by the NeMo
    field holding it: experts, MLA, MTP or GPT-OSS's attention and GLU where the provider
    has none, DeepSeek's routing and shared experts where it is not DeepSeek-V3's, and
    whatever no spec field models (:data:`nemo_convert.spec.UNMODELLED`)."""
    a, moe, mlp = s.attention, s.moe, s.mlp
    bad: dict[str, Any] = {}
    if moe is not None and not pf.moe:
        bad["num_moe_experts"] = moe.experts
    if a.mla is not None and not pf.mla:
        bad["multi_latent_attention"] = True
    if s.rope is not None and s.rope.interleaved:
        bad["rotary_interleaved"] = True
    if s.block.residual_post_norm:
        bad["apply_residual_connection_post_layernorm"] = True
    pattern = None if a.window_pattern is None else [int(x) for x in a.window_pattern]
    if not pf.gpt_oss:
        bad.update({k: v for k, v, neutral in (
            ("softmax_type", a.softmax, "vanilla"), ("glu_linear_offset", mlp.glu_offset, 0.0),
            ("activation_func_clamp_value", mlp.clamp, None),
            ("window_attn_skip_freq", None if pf.window_layers is not None or pf.interleaved_windows else pattern,
             None),
        ) if v != neutral})
    if pf.window_layers is not None and a.window is not None:
        layers = s.geometry.layers
        if [int(x) for x in pf.window_layers(layers)] != (pattern or [1] * layers):
            bad["window_attn_skip_freq"] = pattern or [1] * layers  # the provider's layer spec windows others
    if not pf.softcaps:
        bad.update({k: v for k, v in zip(SCORE_FIELDS, scores(s))
                    if v is not None and not (pf.softmax_scale and k == "query_pre_attn_scalar")})
    if s.rope is not None and s.rope.local_theta is not None and not pf.local_rope:
        bad["rotary_base_local"] = s.rope.local_theta  # the windowed layers' own RoPE base
    if s.block.post_norms != pf.post_norms:
        bad["nemo_convert.post_norms"] = s.block.post_norms
    if s.mtp_layers and not (pf.mla or pf.mtp):
        bad["mtp_num_layers"] = s.mtp_layers
    if moe is not None and pf.moe and not (pf.mla or pf.routing):
        bad.update({k: v for k, v, neutral in (
            ("moe_router_score_function", moe.score_function, "softmax"),
            ("moe_router_enable_expert_bias", moe.expert_bias, False),
            ("moe_router_topk_scaling_factor", moe.topk_scaling, 1.0),
            ("moe_router_num_groups", moe.groups, 1),
        ) if v != neutral})
    if moe is not None and pf.moe and not pf.shared_experts:
        bad.update({k: v for k, v, neutral in (("moe_shared_expert_intermediate_size", moe.shared_ffn, 0),
                                               ("moe_shared_expert_gate", moe.shared_gate, False)) if v != neutral})
    bad.update(dict(s.unsupported))
    return bad


def nemo_to_provider(cfg: dict[str, Any], family: str, *, providers: ProviderTable, vocab_size: int,
                     params_dtype: torch.dtype, tp: int = 1, pp: int = 1, ep: int = 1) -> dict[str, Any]:
    """The ``model:`` section of ``run_config.yaml`` for a NeMo 1 config: what
    Megatron-Bridge's bridge derives from the HF config (module docstring), as a table over
    the config's :class:`~nemo_convert.spec.ModelSpec`, with ``family``'s declared provider
    (``providers``: the registry's)."""
    pf = providers.of(family)
    s = spec_of(cfg)
    bad = _inexpressible(s, pf)
    if bad:
        raise UnsupportedError("the config sets " + ", ".join(f"{k}={v!r}" for k, v in bad.items())
                               + ", which Megatron-Bridge's provider for this family does not express")
    fn = PROVIDER_FUNCTIONS.get(s.mlp.activation)
    if fn is None:
        raise UnsupportedError(f"activation {cfg.get('activation')!r} "
                               f"({describe_activation((s.mlp.gated, s.mlp.activation))}) has no Megatron-Bridge "
                               f"spelling here (known: {', '.join(describe_activation((False, f)) for f in PROVIDER_FUNCTIONS)})")
    if s.norm.kind not in NORMALIZATIONS:
        raise UnsupportedError(f"normalization {s.norm.kind!r} has no Megatron-Bridge spelling here")
    model: dict[str, Any] = {"_target_": pf.target}
    for f in FIELDS:
        value = f.of(s, cfg) if f.provider is not None and f.of is not None else None
        if value is not None:
            model[str(f.provider)] = f.kind(value)
    declared = declared_provider(s, pf)
    if pf.local_rope:
        model.pop("seq_len_interpolation_factor", None)  # rope_scaling_factor holds the global layers' factor
    model.update(declared)
    if s.embedding.scaled != bool(dict(pf.nemo).get("apply_embedding_scaling")):
        raise UnsupportedError(f"{family}: apply_embedding_scaling={s.embedding.scaled} "
                               f"does not match its provider {pf.target.rsplit('.', 1)[-1]}")
    dtype = str(params_dtype).replace("torch.", "")
    model.update({
        "num_query_groups": s.geometry.query_groups,
        "normalization": NORMALIZATIONS[s.norm.kind],
        "gated_linear_unit": s.mlp.gated,
        "activation_func": _callable(fn),
        "share_embeddings_and_output_weights": s.embedding.tied,
        "vocab_size": int(vocab_size),
        "make_vocab_size_divisible_by": largest_pow2_divisor(int(vocab_size)),
        "should_pad_vocab": False,
        "bf16": dtype == "bfloat16",
        "fp16": dtype == "float16",
        "params_dtype": _callable(f"torch.{dtype}"),
        "tensor_model_parallel_size": int(tp),
        "pipeline_model_parallel_size": int(pp),
    })
    rope = _rope(s)
    if isinstance(rope.scaling, Llama3Scaling):
        sc, d = rope.scaling, LLAMA3_DEFAULTS
        odd = {k: v for k, v, fixed in (("low_freq_factor", sc.low_freq_factor, d.low_freq_factor),
                                         ("high_freq_factor", sc.high_freq_factor, d.high_freq_factor),
                                         ("old_context_len", sc.original_max_positions, d.original_max_positions))
               if v != fixed}
        if odd:
            raise UnsupportedError("llama3 RoPE scaling with " + ", ".join(f"{k}={v}" for k, v in odd.items())
                                   + ": Megatron-Core fixes these at low_freq_factor=1, high_freq_factor=4, "
                                   "original_max_position_embeddings=8192")
        model["rope_scaling"] = True
        model["rope_scaling_factor"] = sc.factor
    experts = pf.moe and (s.moe is not None or not pf.hybrid)  # a hybrid stack may have no E layers
    if experts:
        model.update(_moe_provider(s, cfg, family, shared=pf.shared_experts))
        model["expert_model_parallel_size"] = int(ep)
        if pf.hybrid:
            model.pop("moe_layer_freq", None)  # the pattern's E layers are the MoE layers
    if pf.hybrid:
        model.update(hybrid_provider(s, cfg))
    if pf.mla:
        model.update(_mla_provider(s, cfg, family))
    else:
        if pf.routing and experts:
            model.update(_routing_provider(s, cfg))
        if pf.mtp:
            model["mtp_num_layers"] = s.mtp_layers or None  # the bridges' num_nextn_predict_layers or None
    if pf.gpt_oss:
        model.update(gpt_oss_provider(s, cfg))
    if isinstance(rope.scaling, YarnScaling) and s.attention.mla is None:
        model.update(yarn_provider(rope.scaling))
    if "window_size" in model:
        model.update(dict(pf.extra_with_window))
    for k, v in pf.fixed:
        have = target_of(model[k]) if k == "activation_func" else model.get(k, FIXED_ABSENT.get(k, v))
        if have != v:
            raise UnsupportedError(f"{family}: the config has {k}={have!r}; its provider needs {v!r}")
        model[k] = _callable(v) if k == "activation_func" else v
    model.update(dict(pf.extra))
    if pf.softcaps:
        model.update(scores_provider(s))
    # a field left unset reads as the class's default: where that is not null, say null
    class_defaults = dict(pf.defaults)
    for name in [str(f.provider) for f in FIELDS if f.provider is not None]:
        if name not in model and class_defaults.get(name) is not None:
            model[name] = None
    return model


#: What a provider field the table did not write means, for a family's fixed fields:
#: TransformerConfig's / MLATransformerConfig's defaults (Megatron-Core 0.16.1).
FIXED_ABSENT: dict[str, Any] = {"multi_latent_attention": False, "moe_router_score_function": "softmax",
                                "moe_router_enable_expert_bias": False, "moe_shared_expert_gate": False,
                                "softmax_type": "vanilla"}


def _moe_provider(s: ModelSpec, cfg: dict[str, Any], family: str, shared: bool = False) -> dict[str, Any]:
    """The MoE fields of the provider (:data:`MOE_FIELDS`) from a spec with experts
    (``shared``: the provider has shared experts)."""
    if s.moe is None:
        raise UnsupportedError(f"{family}: the config has no num_moe_experts; its provider is a mixture of experts")
    out: dict[str, Any] = {}
    for f in MOE_FIELDS:
        value = f.of(s, cfg) if f.of is not None else None
        if value is not None and (shared or f.nemo not in _NO_SHARED):
            out[str(f.provider)] = f.kind(value)
    return out


def _mla_provider(s: ModelSpec, cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """What ``DeepSeekV3Bridge`` derives beyond the MoE fields (Megatron-Bridge v0.6.0
    ``deepseek/deepseek_v3_bridge.py`` lines 53–99 over ``conversion/model_bridge.py``'s
    table, lines 461–478): the MLA head dimensions, ``kv_channels`` from HF's ``head_dim``
    (= ``qk_rope_head_dim``; MLA does not read it), DeepSeek's routing with ``n_group`` /
    ``topk_group`` as given (1 when ungrouped), and MLA's RoPE: YaRN's fields as the config
    has them (``model_bridge.py`` lines 495–504, 583–594: the HF block's keys under the same
    names), plain RoPE as the bridge writes it (:data:`MLA_BRIDGE_PLAIN`)."""
    mla, moe, rope = s.attention.mla, s.moe, _rope(s)
    dims = {k: getattr(mla, k) if mla is not None else None for k in MLA_FIELDS}
    missing = [k for k, v in dims.items() if v is None and k != "q_lora_rank"]
    if missing or moe is None:
        raise UnsupportedError(f"{family}: the config lacks {', '.join(missing or ['num_moe_experts'])}")
    if isinstance(rope.scaling, Llama3Scaling) or rope.interpolation:
        raise UnsupportedError(f"{family}: RoPE scaling has no MLAModelProvider spelling here")
    out: dict[str, Any] = dict(dims)
    if isinstance(rope.scaling, YarnScaling):
        y = rope.scaling
        out["rope_type"] = "yarn"
        out.update({"rotary_scaling_factor": _req_float(y.factor), "original_max_position_embeddings":
                    int(y.original_max_positions or 0), "beta_fast": _req_float(y.beta_fast),
                    "beta_slow": _req_float(y.beta_slow), "mscale": _req_float(y.mscale),
                    "mscale_all_dim": _req_float(y.mscale_all_dim)})
    else:
        out.update(MLA_BRIDGE_PLAIN)
    out.update({"kv_channels": dims["qk_pos_emb_head_dim"], "multi_latent_attention": True,
                **_routing_provider(s, cfg),
                "moe_aux_loss_coeff": float((provenance_of(cfg).hf_config or {}).get("aux_loss_alpha", 0.0001)),
                # deepseek_v3_bridge.py line 97: the MTP block's layer count (None: none)
                "mtp_num_layers": s.mtp_layers or None})
    return out


def _routing_provider(s: ModelSpec, cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-style routing as Megatron-Core's router fields (:attr:`ProviderFamily.routing`;
    groups as given, 1 when ungrouped, as DeepSeekV3Bridge and GLM45Bridge write them)."""
    moe = _moe(s)
    return {"moe_router_score_function": moe.score_function, "moe_router_enable_expert_bias": moe.expert_bias,
            "moe_router_topk_scaling_factor": moe.topk_scaling, "moe_router_num_groups": moe.groups,
            "moe_router_group_topk": moe.group_topk or 1}


def _req_float(v: float | None) -> float:
    if v is None:
        raise UnsupportedError("multi-latent attention's YaRN lacks a field MLAModelProvider needs")
    return float(v)


# ------------------------------------------------------------ provider / args → NeMo
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
        if k in _EXPERT_COUNTS or ((mla or routed) and k in DEEPSEEK_ROUTING) or (is_gpt_oss(values) and k in GPT_OSS_FIELDS):
            continue  # read by _moe_nemo / _mla_nemo / gpt_oss_nemo
        if hybrid and (k == "is_hybrid_model" or (k == "mtp_num_layers" and v == 0)
                       or (not experts and k.startswith("moe_router_"))):
            continue
        if v is not None and v != neutral:
            raise UnsupportedError(f"{where}: {k}={v!r} changes the model's math and is not supported")


def _moe_nemo(cfg: dict[str, Any], values: dict[str, Any], side: str, where: str) -> None:
    """The MoE fields of a provider / Megatron-LM ``args`` with experts into ``cfg``."""
    experts = values.get("num_moe_experts" if side == "provider" else "num_experts")
    if not experts:
        return
    for f in MOE_FIELDS:
        value = values.get(str(getattr(f, side)), f.default)
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


def _common_nemo(values: dict[str, Any], side: str, hybrid: bool = False) -> dict[str, Any]:
    cfg: dict[str, Any] = {"mcore_gpt": True, "target": NEMO_GPT_TARGET}
    for f in FIELDS:
        name = getattr(f, side)
        if name is None:
            continue
        default = PROVIDER_DEFAULTS.get(name, f.default) if side == "provider" else f.default
        value = values.get(name, default)
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
    cfg = _common_nemo(model, "provider", hybrid=hybrid)
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
    _moe_nemo(cfg, model, "provider", where)
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
    """NeMo 1 config fields from a Megatron-LM ``args`` namespace (as a plain dict). A hybrid
    run's (:func:`~nemo_convert.formats.megatron.megatron_lm_args.is_hybrid_run`) is read as the
    provider section of the hybrid family that ``providers`` (the registry's) declares."""
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if args.get(k) is None]
    if missing:
        raise ConfigError(f"{where}: args lacks {', '.join(missing)}")
    if is_hybrid_run(args, f"{where}: args"):
        model_type = args.get("model_type")
        if model_type is not None and model_type != DECODER_MODEL_TYPE:
            raise UnsupportedError(f"{where}: args: model_type={model_type} is not the decoder-only model type "
                                   f"({DECODER_MODEL_TYPE}) pretrain_mamba.py trains")
        table = providers if providers is not None else ProviderTable()  # none: no family declares one
        pf = hybrid_family_provider(table, f"{where}: args")
        return provider_to_nemo(hybrid_section(args, f"{where}: args", pf.target), f"{where}: args", table)
    _refuse_non_neutral(args, f"{where}: args")
    model_type = args.get("model_type")
    if model_type is not None and model_type != DECODER_MODEL_TYPE:
        raise UnsupportedError(f"{where}: args: model_type={model_type} is not a decoder-only GPT model "
                               f"({DECODER_MODEL_TYPE}); only those are read")
    if args.get("layernorm_zero_centered_gamma"):
        raise UnsupportedError(f"{where}: args: layernorm_zero_centered_gamma=True (Gemma's norms) without the "
                               "embedding scaling Megatron-LM's GPT model does not have is not supported")
    if args.get("layernorm_epsilon") is None and args.get("norm_epsilon") is not None:
        args = {**args, "layernorm_epsilon": args["norm_epsilon"]}  # older Megatron-LM spelling
    cfg = _common_nemo(args, "megatron_lm")
    heads = int(args["num_attention_heads"])
    cfg["num_query_groups"] = int(args.get("num_query_groups") or heads) if args.get("group_query_attention") \
        else heads
    if cfg.get("kv_channels") is None:
        cfg["kv_channels"] = int(args["hidden_size"]) // heads
    if cfg.get("ffn_hidden_size") is None:
        cfg["ffn_hidden_size"] = 4 * int(args["hidden_size"])
    norm = str(args.get("normalization") or "LayerNorm")
    cfg["normalization"] = {v: k for k, v in NORMALIZATIONS.items()}.get(norm) or _refuse(where, "normalization", norm)
    # core_transformer_config_from_args: --swiglu is gated SiLU, else GeLU fused as --bias-gelu-fusion says
    cfg.update(_activation(True, "silu", False, where) if args.get("swiglu") else
               _activation(False, "gelu", bool(args.get("bias_gelu_fusion", True)), where))
    cfg["share_embeddings_and_output_weights"] = not bool(args.get("untie_embeddings_and_output_weights", False))
    cfg["precision"] = precision_of_dtype_name(dtype_name_of_flags(args.get("bf16"), args.get("fp16"),
                                                                   str(args.get("params_dtype"))))
    cfg["make_vocab_size_divisible_by"] = int(args.get("make_vocab_size_divisible_by") or 128)
    _apply_rope_scaling(cfg, args.get("use_rope_scaling"), args.get("rope_scaling_factor"))
    _sliding_window_record(cfg)
    _moe_nemo(cfg, args, "megatron_lm", where)
    return cfg
