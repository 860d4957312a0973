"""The typed model spec: what a decoder computes, as frozen records.

A :class:`ModelSpec` says what the model *computes* — geometry, attention, positions,
MLP, norms, embeddings, experts, multi-token prediction — and nothing about where it came
from or how it is stored. Two configs whose specs are equal compute the same function of
the same weights. What is *not* math — the source ``config.json``, the tokenizer files,
the import options, the HF expert layout and key spelling — is :class:`Provenance`, a
record of its own.

The records are built by exactly one reader of each config form
(:func:`nemo_convert.spec.nemo.spec_of` for NeMo 1's ``model_config.yaml``, the stored
canonical form), and every target's config is a table over them. No record holds a dict
of unknown keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

#: How a token's position enters the model: rotary embeddings (``rope``, and GPTModel's
#: YaRN spelling ``yarn``), a learned table (``learned_absolute``), or none.
Positions = str
#: Canonical MLP activation functions, as Megatron-Core / NeMo compute them
#: (:data:`nemo_convert.spec.activations.FUNCTION_NAMES`).
Activation = str


@dataclass(frozen=True)
class Geometry:
    """The sizes. ``query_groups`` and ``head_dim`` are resolved (NeMo's null ``kv_channels``
    means ``hidden // heads``, a null ``num_query_groups`` means ``heads``); ``vocab_size``
    is the true vocabulary (None when unknown: the embedding's rows may be padded);
    ``ffn`` is the dense MLP's size (None when the config has none)."""

    layers: int
    hidden: int
    heads: int
    query_groups: int
    head_dim: int
    ffn: int | None = None
    vocab_size: int | None = None
    max_positions: int | None = None


@dataclass(frozen=True)
class MLA:
    """Multi-latent attention's low-rank dimensions (Megatron-Core ``MLATransformerConfig``):
    ``q_lora_rank`` None means a plain ``q_proj``."""

    q_lora_rank: int | None
    kv_lora_rank: int | None
    qk_head_dim: int | None
    qk_pos_emb_head_dim: int | None
    v_head_dim: int | None


@dataclass(frozen=True)
class Attention:
    """Self-attention beyond its sizes.

    :param qkv_bias: q, k and v have biases.
    :param proj_bias: the output projection has a bias.
    :param qk_norm: per-head norms of queries and keys.
    :param window: the keys a query sees (HF's ``sliding_window``), None for full attention.
    :param window_lookahead: keys after the query inside the window (0: causal).
    :param window_pattern: per layer, whether the window applies (GPT-OSS alternates);
        None: every layer (when there is a window).
    :param softmax: ``vanilla``, or ``learnable`` (a learned per-head logit joins every
        softmax: attention sinks).
    :param mla: multi-latent attention's dimensions, None for grouped-query attention.
    :param normalized_scores: scores divided by sqrt(head size) — or, with
        ``query_pre_attn_scalar``, by sqrt of that number instead (Gemma 2 / 3's
        ``scaling = query_pre_attn_scalar**-0.5``).
    :param query_pre_attn_scalar: what the scores are divided by the square root of, None:
        the head size.
    :param logit_softcap: the scores pass through ``c·tanh(s / c)`` before the mask and
        the softmax (Gemma 2's ``attn_logit_softcapping``), None: they do not.
    :param headscale: NeMo's per-head output scale.
    :param kind: NeMo's ``attention_type`` (``multihead``).
    """

    qkv_bias: bool = False
    proj_bias: bool = False
    qk_norm: bool = False
    window: int | None = None
    window_lookahead: int = 0
    window_pattern: tuple[bool, ...] | None = None
    softmax: str = "vanilla"
    mla: MLA | None = None
    normalized_scores: bool = True
    query_pre_attn_scalar: float | None = None
    logit_softcap: float | None = None
    headscale: bool = False
    kind: str = "multihead"


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1's RoPE frequency scaling (HF ``rope_type: llama3``; NeMo's
    ``scale_positional_embedding``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192


#: The one place Llama 3's defaults live: transformers' ``llama3`` block without a key, and
#: NeMo / Megatron-Core's ``apply_rope_scaling`` constants (only the factor is configurable
#: in Megatron-Core: ``low_freq_factor`` 1, ``high_freq_factor`` 4, original context 8192).
LLAMA3_DEFAULTS = Llama3Scaling()


@dataclass(frozen=True)
class YarnScaling:
    """YaRN (:mod:`nemo_convert.families.yarn` has both sides' formulas). ``mscale`` /
    ``mscale_all_dim`` None mean the concentration ``mscale(factor)``; ``truncate``: the
    correction range is rounded to integers (always, for multi-latent attention)."""

    factor: float | None
    original_max_positions: int | None
    beta_fast: float | None
    beta_slow: float | None
    mscale: float | None
    mscale_all_dim: float | None
    truncate: bool = True


Scaling = Union[Llama3Scaling, YarnScaling]


@dataclass(frozen=True)
class Rope:
    """Rotary position embeddings.

    :param theta: the base.
    :param fraction: the part of each head that rotates (``rotary_percent``).
    :param interleaved: pairs are adjacent channels instead of halves.
    :param interpolation: position interpolation (HF's ``linear`` scaling factor, NeMo's
        ``seq_len_interpolation_factor``); None: none. It composes with ``scaling``.
    :param scaling: frequency scaling (llama3 or YaRN), None: none.
    :param local_theta: the base of the windowed layers' RoPE, which neither interpolation
        nor scaling touch (Gemma 3's ``rope_local_base_freq``: its full-attention layers
        rotate with ``theta`` and the scaling, its sliding-window layers with this base
        alone); None: every layer rotates alike.
    """

    theta: float = 10000.0
    fraction: float = 1.0
    interleaved: bool = False
    interpolation: float | None = None
    scaling: Scaling | None = None
    local_theta: float | None = None


@dataclass(frozen=True)
class MLP:
    """The (dense or expert) MLP's function: ``gated`` (``[gate; up]`` fc1), the
    ``activation`` as computed (canonical names), linear biases, GPT-OSS's ``glu_offset``
    (added to up) and ``clamp``."""

    gated: bool
    activation: Activation
    bias: bool = False
    glu_offset: float = 0.0
    clamp: float | None = None


@dataclass(frozen=True)
class Norm:
    """The norms: ``rmsnorm`` or ``layernorm`` (LayerNorms have a bias); ``zero_centred``:
    the weight stores γ - 1 (Gemma, NeMo's ``layernorm1p``)."""

    kind: str
    zero_centred: bool = False
    eps: float = 1e-5


@dataclass(frozen=True)
class Embedding:
    """``tied``: the output layer is the word embedding; ``scaled``: the embedding is
    multiplied by sqrt(hidden) in the model (Gemma)."""

    tied: bool = False
    scaled: bool = False


@dataclass(frozen=True)
class Block:
    """The transformer block's wiring: NeMo's ``transformer_block_type`` (``pre_ln``) and
    ``apply_residual_connection_post_layernorm``; ``post_norms``: each sublayer's output is
    normalised again before the residual add (Gemma 2 / 3's ``post_attention_layernorm``
    and ``post_feedforward_layernorm``; Megatron-Bridge's ``linear_proj`` /
    ``linear_fc2`` with a ``post_layernorm``)."""

    kind: str = "pre_ln"
    residual_post_norm: bool = False
    post_norms: bool = False


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP.

    :param experts: routed experts.
    :param topk: experts per token.
    :param ffn: one expert's MLP size.
    :param layer_pattern: per layer, whether it is MoE (the others are dense).
    :param score_function: ``softmax`` or ``sigmoid`` router scores.
    :param pre_softmax: softmax over all experts before top-k (else top-k, then softmax).
    :param expert_bias: a per-expert score correction (DeepSeek-V3).
    :param topk_scaling: the routed output's factor.
    :param groups, group_topk: group-limited routing (None: none).
    :param shared_ffn: the shared experts' MLP size (0: none).
    :param shared_gate: the shared experts' output is gated by a sigmoid.
    """

    experts: int
    topk: int
    ffn: int
    layer_pattern: tuple[bool, ...]
    score_function: str = "softmax"
    pre_softmax: bool = False
    expert_bias: bool = False
    topk_scaling: float = 1.0
    groups: int = 1
    group_topk: int | None = None
    shared_ffn: int = 0
    shared_gate: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """What a decoder computes (module docstring). ``precision`` is the dtype its weights
    are kept in (``bfloat16``, ``float16``, ``float32``), the one storage fact every target
    records; ``final_logit_softcap``: the logits pass through ``c·tanh(x / c)`` (Gemma 2's
    ``final_logit_softcapping``), None: they do not; ``mtp_layers`` counts the multi-token-prediction layers after the last one;
    ``layer_kinds``: a hybrid stack's layers, one symbol each (Megatron-Core's
    ``hybrid_override_pattern``: ``M`` Mamba, ``*`` attention, ``-`` MLP, ``E`` mixture of
    experts), None: every layer is a transformer layer;
    ``unsupported`` lists the math fields the config sets that no field here models
    (:data:`nemo_convert.spec.nemo.UNMODELLED`, field and value): no target computes them."""

    geometry: Geometry
    attention: Attention
    positions: Positions
    rope: Rope | None
    mlp: MLP
    norm: Norm
    embedding: Embedding = Embedding()
    block: Block = Block()
    moe: MoE | None = None
    mtp_layers: int = 0
    layer_kinds: str | None = None
    final_logit_softcap: float | None = None
    precision: str = "float32"
    unsupported: tuple[tuple[str, Any], ...] = ()


#: The HF expert layouts a MoE checkpoint may have (``fused``: transformers v5 in memory).
HFExperts = Literal["per_expert", "fused"]


@dataclass(frozen=True)
class LeftOut:
    """Source tensors an import option leaves out (:attr:`Provenance.hf_left_out`).

    :param option: the option that asked for it (``--text-only``).
    :param what: what they are, in words (``the vision tower and the projector``).
    :param names: HF name globs (in the source's spelling) of the tensors left out.
    """

    option: str
    what: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Provenance:
    """Where a model came from and how its source spelled it — never what it computes.

    :param family: the family that wrote it (our record), None for a NeMo-native config.
    :param hf_config: the source ``config.json``, verbatim (None: none recorded).
    :param source_format: the format it was read from (``nemo2``, ``megatron-bridge``, …).
    :param hf_experts: the HF experts' layout to write back.
    :param hf_names: the HF tensor-name spelling to write back (GPT-2 ``unprefixed``).
    :param mtp_dropped: MTP layers left out at import on request (``--drop-mtp``).
    :param mtp_absent: MTP layers the source's config announced but did not store.
    :param ignored_config_keys: ``config.json`` keys import was told to ignore.
    :param tokenizer_files: tokenizer files by HF name → where the archive holds them.
    :param hf_read_prefixes: HF name prefixes import read the source's tensors under (a
        text model stored inside a multimodal checkpoint: ``{"model.": "model.language_model."}``);
        import only — export writes the mapping's own names.
    :param hf_left_out: what import left out of the source on request (``hf_left_out``
        record: the option, what it is, the name globs), reported in one note.
    """

    family: str | None = None
    hf_config: dict[str, Any] | None = None
    source_format: str | None = None
    hf_experts: HFExperts = "per_expert"
    hf_names: str | None = None
    mtp_dropped: int = 0
    mtp_absent: int = 0
    ignored_config_keys: tuple[str, ...] = ()
    tokenizer_files: dict[str, str] = field(default_factory=dict)
    hf_read_prefixes: dict[str, str] = field(default_factory=dict)
    hf_left_out: LeftOut | None = None
