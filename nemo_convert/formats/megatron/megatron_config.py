"""One table between the three spellings of a GPT model config: NeMo 1's
``model_config.yaml``, Megatron-Bridge's model provider (the ``model:`` section of
``run_config.yaml``) and Megatron-LM's ``args`` namespace (``common.pt``).

Megatron-LM core_v0.16.1 builds its transformer arguments from the fields of
``TransformerConfig`` (``megatron/training/arguments.py`` line 1621,
``ArgumentGroupFactory(TransformerConfig, …)``) and turns them back into a config in
``core_transformer_config_from_args`` (lines 1306–1370: ``swiglu`` → gated SiLU,
``group_query_attention`` gates ``num_query_groups``, ``num_experts`` →
``num_moe_experts``); the few arguments of its own are in the "network size" group
(lines 1630–1697). A run's ``args`` are therefore renamed into the provider section that
``TransformerConfig`` is (:func:`~nemo_convert.formats.megatron.megatron_lm_args.run_section`)
and read by this table's provider column: the table has two columns, NeMo and provider.
Megatron-Bridge's ``LlamaBridge.provider_bridge``
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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.megatron.providers import (FAST_GELU, SILU, SQUARED_RELU, ProviderFamily, ProviderTable)
from nemo_convert.formats.megatron.provider_flags import (SCORE_FIELDS, declared_provider, hybrid_provider, scores, scores_provider, target_of)
from nemo_convert.formats.megatron.provider_gpt_oss import (QUICK_GELU, gpt_oss_provider,
                                                             yarn_provider)
from nemo_convert.mapping.ops import largest_pow2_divisor
from nemo_convert.spec import (LLAMA3_DEFAULTS, UNMODELLED, Llama3Scaling, ModelSpec, MoE, Rope, YarnScaling,
                               describe_activation, megatron_window,
                               provenance_of, spec_of)

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
    """One field under its NeMo and provider names (None: the provider has no such field; a
    Megatron-LM run's args are renamed into a provider section first,
    :func:`~nemo_convert.formats.megatron.megatron_lm_args.run_section`), the type its value is
    read as and what it means when absent (``default``); ``of`` is the value written to a
    provider: read from the :class:`~nemo_convert.spec.ModelSpec` (and, for the training knobs
    that are not math, from the NeMo config as it is)."""

    nemo: str
    provider: str | None
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
    Field("num_layers", "num_layers", int, of=lambda s, c: s.geometry.layers),
    Field("hidden_size", "hidden_size", int, of=lambda s, c: s.geometry.hidden),
    Field("ffn_hidden_size", "ffn_hidden_size", int, of=lambda s, c: s.geometry.ffn),
    Field("num_attention_heads", "num_attention_heads", int, of=lambda s, c: s.geometry.heads),
    Field("kv_channels", "kv_channels", int, of=lambda s, c: s.geometry.head_dim),
    Field("max_position_embeddings", "seq_length", int,
          of=lambda s, c: s.geometry.max_positions),
    Field("init_method_std", "init_method_std", float, 0.02,
          of=_passthrough("init_method_std", 0.02)),
    Field("layernorm_epsilon", "layernorm_epsilon", float, 1e-5, of=lambda s, c: s.norm.eps),
    Field("rotary_base", "rotary_base", float, 10000.0, of=lambda s, c: _rope(s).theta),
    Field("rotary_percentage", "rotary_percent", float, 1.0, of=lambda s, c: _rope(s).fraction),
    Field("position_embedding_type", "position_embedding_type", str, "rope",
          of=lambda s, c: s.positions),
    Field("bias", "add_bias_linear", bool, True, of=_linear_bias),  # TransformerConfig's default
    Field("qkv_bias", "add_qkv_bias", bool, False, of=lambda s, c: s.attention.qkv_bias),
    Field("qk_layernorm", "qk_layernorm", bool, False, of=lambda s, c: s.attention.qk_norm),
    Field("layernorm_zero_centered_gamma", "layernorm_zero_centered_gamma",
          bool, False, of=lambda s, c: s.norm.zero_centred),
    Field("window_size", "window_size", lambda v: [int(x) for x in v], of=_window),
    Field("seq_len_interpolation_factor", "seq_len_interpolation_factor",
          _float_or_none, of=lambda s, c: _rope(s).interpolation),
    Field("hidden_dropout", "hidden_dropout", float, 0.0, of=_passthrough("hidden_dropout", 0.0)),
    Field("attention_dropout", "attention_dropout", float, 0.0,
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
    Field("num_moe_experts", "num_moe_experts", int, of=lambda s, c: _moe(s).experts),
    Field("moe_router_topk", "moe_router_topk", int, 2, of=lambda s, c: _moe(s).topk),
    Field("moe_ffn_hidden_size", "moe_ffn_hidden_size", int, of=lambda s, c: _moe(s).ffn),
    Field("moe_router_pre_softmax", "moe_router_pre_softmax", bool, False,
          of=lambda s, c: _moe(s).pre_softmax),
    Field("moe_layer_freq", "moe_layer_freq", _freq, 1, of=_pattern),
    Field("moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", int,
          of=lambda s, c: _moe(s).shared_ffn or None),
    Field("moe_shared_expert_gate", "moe_shared_expert_gate", bool, False,
          of=lambda s, c: _moe(s).shared_gate),
)
#: MoE routing that changes the math and that no readable family here expresses (DeepSeek's
#: sigmoid scores, expert bias, scaling and group-limited routing; token dropping; latent
#: experts): refused unless neutral.
MOE_NEUTRAL: dict[str, Any] = {
    "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False,
    "moe_router_topk_scaling_factor": None, "moe_router_num_groups": None, "moe_router_group_topk": None,
    # block-interleaved GLU halves in the expert weights (core_v0.19.0 transformer_config.py lines
    # 708-711, 969-975): another split of linear_fc1 than the one the mappings read
    "moe_mlp_glu_interleave_size": None, "moe_shared_expert_glu_interleave_size": None,
    **{k: v for k, v in UNMODELLED.items() if k.startswith("moe_")},
}
#: MoE fields a provider without shared experts (Qwen3-MoE's) must leave neutral.
_NO_SHARED = {"moe_shared_expert_intermediate_size": None, "moe_shared_expert_gate": False}
EXPERT_COUNTS = ("num_moe_experts", "num_experts")
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
#: ``qk_l2_norm`` is Llama 4's L2-normalised queries and keys (core_v0.16.1
#: ``transformer_config.py``, "llama 4-style qk L2 norm"); ``use_mup`` Megatron-Core's maximal
#: update parametrisation, which scales the embedding, the logits and the attention scores
#: (core_v0.19.0 ``transformer_config.py`` lines 414-460, ``mup_embedding_mult``,
#: ``mup_output_mult``, ``mup_attn_scale_power``).
NEUTRAL: dict[str, Any] = {
    "num_moe_experts": None, "num_experts": None, "multi_latent_attention": False, "rotary_interleaved": False,
    "apply_residual_connection_post_layernorm": False, "glu_linear_offset": 0.0,
    "activation_func_clamp_value": None, "window_attn_skip_freq": None, "mtp_num_layers": None, "openai_gelu": False,
    "qk_l2_norm": False, "use_mup": False,
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
