"""The Megatron-Core GPT decoder, described once for every dense decoder family.

A family is this description parameterised by :class:`GPTFeatures` (what its HF
checkpoint looks like and which optional modules it has) and a :class:`ConfigTable`
(``GPT_CONFIG`` extended with the family's own keys).
:func:`~nemo_convert.families.gpt_family.gpt_family` builds the
:class:`~nemo_convert.plugins.records.ModelFamily` record from them; Llama, Mistral,
Qwen2, Qwen3, Gemma and Phi-3 are each one call (``plugins/nemo_convert_*/``).

Per-config facts (biases, tied embeddings, the norm convention of a NeMo 1 Gemma) are
``when=`` conditions on the typed model spec's fields (:mod:`nemo_convert.families.fields`:
``when=TIED``, ``when=ZERO_CENTRED``; shapes likewise), so one family reads every checkpoint its table
writes and the ones NeMo's own converters wrote. The MLP is one block of rules
(:func:`dense_mlp_rules`); an expert-parallel block slots in beside it. The config
rows live in :mod:`nemo_convert.families.gpt_config` and :mod:`nemo_convert.families.moe_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from nemo_convert.errors import UnsupportedError
from nemo_convert.families.fields import (EXPERT_FFN, EXPERTS, FFN, HEAD_DIM, HEADS, HIDDEN, KV_LORA_RANK,
                                          MOE_LAYER_PATTERN, Q_LORA_RANK, SHARED_FFN, SHARED_GATE, TIED, VOCAB,
                                          ZERO_CENTRED)
from nemo_convert.families.moe_config import HF_MTP_COPIES
from nemo_convert.mapping.rules import (Dim, FuseGated, FuseQKV, Mapping, Offset, PackedQKV, Parallel, Rename, Rule,
                                        Shared, StackedExperts, Tied, cfg_get)
from nemo_convert.spec import provenance_of, spec_of

NEMO_GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"

L = "model.layers.{i}."
D = "decoder.layers.{i}."


# -- mapping -----------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTFeatures:
    """What a family's HF checkpoint holds beyond Llama's, as switches.

    :param packed_qkv: HF ``self_attn.qkv_proj`` = ``[q; k; v]`` (Phi-3) instead of q/k/v.
    :param packed_gate_up: HF ``mlp.gate_up_proj`` = ``[gate; up]`` (Phi-3).
    :param qk_norm: per-head RMSNorms of queries and keys (Qwen3): HF ``self_attn.q_norm`` /
        ``k_norm`` ⇄ ``self_attention.q_layernorm`` / ``k_layernorm``, on the configs whose
        ``qk_layernorm`` is true (a family whose table writes it from a switch, GLM-4.5's
        ``use_qk_norm``, has them only where it is on).
    :param attention_sinks: a learned per-head logit joining every softmax (GPT-OSS
        ``self_attn.sinks``) ⇄ ``self_attention.core_attention.softmax_offset``
        (Megatron's ``softmax_type: learnable``).
    :param mla: multi-latent attention (DeepSeek-V3): low-rank q and kv projections with
        their RMSNorms (:func:`mla_attention_rules`) instead of the grouped QKV.
    :param moe: the mixture-of-experts MLP (:class:`MoEBlock`); None: dense.
    :param zero_centred_norms: the HF norms compute ``rmsnorm(x)·(1 + w)`` (Gemma). NeMo
        runs them with ``layernorm_zero_centered_gamma: true`` and stores ``w`` as HF does;
        a ``.nemo`` without that flag (NeMo 1's converter) stores ``1 + w`` and is read so.
    :param norm_bias: the norms are LayerNorms with a bias (Nemotron): HF ``*.bias`` beside
        each norm weight ⇄ ``linear_qkv.layer_norm_bias``, ``linear_fc1.layer_norm_bias``,
        ``final_layernorm.bias``.
    :param gated_mlp: the MLP is gated (``gate_proj``, ``up_proj``); False: one ``up_proj``
        ⇄ ``linear_fc1`` and the activation alone (Nemotron's squared ReLU).
    :param mtp: the checkpoint may carry multi-token-prediction layers after the last one
        (DeepSeek-V3's ``num_nextn_predict_layers``) ⇄ Megatron-Core's MTP block
        (:func:`mtp_rules`); adds the config row :data:`~nemo_convert.families.moe_config.MTP_LAYERS`
        and the import switch ``--drop-mtp``.
    :param post_norms: each sublayer's output is normalised before the residual add (Gemma 2
        / 3): HF ``post_attention_layernorm`` ⇄ ``self_attention.linear_proj.post_layernorm``,
        ``post_feedforward_layernorm`` ⇄ ``mlp.linear_fc2.post_layernorm``, and the pre-MLP
        norm is HF ``pre_feedforward_layernorm`` (Megatron-Bridge ``067f987d``
        ``src/megatron/bridge/models/gemma/gemma2_bridge.py`` lines 93-100).
    """

    packed_qkv: bool = False
    packed_gate_up: bool = False
    qk_norm: bool = False
    zero_centred_norms: bool = False
    moe: "MoEBlock | None" = None
    mla: bool = False
    attention_sinks: bool = False
    norm_bias: bool = False
    gated_mlp: bool = True
    mtp: bool = False
    post_norms: bool = False


@dataclass(frozen=True)
class MoEBlock:
    """A mixture-of-experts MLP as its HF checkpoint names it (under ``model.layers.{i}.``).

    :param block: the MLP module (``"mlp"``; Mixtral ``"block_sparse_moe"``).
    :param router: the router linear under ``block`` (``"gate"``) ⇄ ``mlp.router``.
    :param experts: one expert's module under ``block``, ``{e}`` its index.
    :param gate, up, down: the expert's projections (Mixtral ``w1``, ``w3``, ``w2``) ⇄
        ``linear_fc1`` = ``[gate; up]`` and ``linear_fc2`` of
        ``mlp.experts.local_experts.{e}`` (stored by Megatron-Core under one
        ``mlp.experts.experts.*`` key with an expert axis).
    :param shared: the shared expert's module (Qwen2-MoE ``"shared_expert"``) ⇄
        ``mlp.shared_experts``, with projections named like the dense MLP's; None: none.
    :param shared_gate: the shared expert's sigmoid gate ``[1, H]`` ⇄
        ``mlp.shared_experts.gate_weight``; None: ungated.
    :param expert_bias: the router's per-expert score correction under ``block`` (DeepSeek-V3
        ``"gate.e_score_correction_bias"``, an HF buffer) ⇄ ``mlp.router.expert_bias``.
    :param router_bias: the router has a bias (``{router}.bias`` ⇄ ``mlp.router.bias``).
    :param fused_transposed, fused_interleaved: the fused layout stores each expert as
        ``x @ W`` (``gate_up_proj`` ``[E, H, 2I]``, ``down_proj`` ``[E, I, H]``) and/or with
        gate and up rows alternating (GPT-OSS, both).
    :param expert_biases: the fused experts have biases (``gate_up_proj_bias`` ``[E, 2I]``,
        ``down_proj_bias`` ``[E, H]``) ⇄ each expert's ``linear_fc1.bias`` / ``linear_fc2.bias``.
    :param expert_tp: whether experts are tensor-parallel (Megatron's expert TP = TP); with
        expert biases Megatron needs ``expert_tensor_parallel_size: 1``: every TP rank holds
        whole experts.
    :param gated: the experts (and the shared expert) are gated MLPs (``gate``, ``up``);
        False: one ``up`` ⇄ ``linear_fc1`` and the activation alone (Nemotron-H's squared
        ReLU experts, ``up_proj`` / ``down_proj``).
    :param fused_block: the MLP module's name in transformers v5's fused layout
        (``{fused_block}.experts.gate_up_proj`` ``[E, 2I, H]`` rows ``[gate; up]`` per
        expert, ``{fused_block}.experts.down_proj`` ``[E, H, I]``, the router beside them);
        None: ``block``. Which layout a checkpoint has is read from its tensor names on
        import and recorded, and export writes the same one.
    """

    block: str = "mlp"
    router: str = "gate"
    experts: str = "experts.{e}"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    shared: str | None = None
    shared_gate: str | None = None
    fused_block: str | None = None
    expert_bias: str | None = None
    router_bias: bool = False
    fused_transposed: bool = False
    fused_interleaved: bool = False
    expert_biases: bool = False
    expert_tp: bool = True
    gated: bool = True


#: Where a MoE family's import records the source's expert layout (``"fused"``; absent:
#: one tensor per expert and projection).
HF_EXPERTS = "nemo_convert.hf_experts"
HF_EXPERT_LAYOUTS = ("per_expert", "fused")


def hf_experts_layout(hf: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The ``hf_experts`` import option read from the source's tensor names."""
    fused = any(k.endswith(".experts.gate_up_proj") or k.endswith(".experts.down_proj") for k in keys)
    return {"hf_experts": "fused" if fused else "per_expert"}


def _norm_bias(rules: list[Rule], features: GPTFeatures, hf: str, nemo: str, shape: tuple[Dim, ...]) -> list[Rule]:
    """``rules`` and, for LayerNorms with a bias, the bias beside the weight
    (``*.weight`` ⇄ ``*.bias``, ``*layer_norm_weight`` ⇄ ``*layer_norm_bias``)."""
    if not features.norm_bias:
        return rules
    bias = nemo[: -len("weight")] + "bias" if nemo.endswith("weight") else nemo + "_bias"
    return [*rules, Rename(hf[: -len("weight")] + "bias", bias, shape=shape)]


def norm_rules(features: GPTFeatures, hf: str, nemo: str, shape: tuple[Dim, ...] = (HIDDEN,)) -> list[Rule]:
    """One norm weight: as HF stores it, or (NeMo 1 Gemma) with the +1 baked in; and its
    bias, for LayerNorms with one."""
    if not features.zero_centred_norms:
        return _norm_bias([Rename(hf, nemo, shape=shape)], features, hf, nemo, shape)
    return _norm_bias([Rename(hf, nemo, shape=shape, when=ZERO_CENTRED),
                       Offset(hf, nemo, 1.0, when=~ZERO_CENTRED)], features, hf, nemo, shape)


def mla_attention_rules(features: GPTFeatures, cfg: dict[str, Any]) -> list[Rule]:
    """Megatron-Core's multi-latent attention (DeepSeek-V2/V3), every weight as HF stores it
    (the rope rows need no reordering: both rotate interleaved pairs the same way):
    ``q_a_proj`` ⇄ ``linear_q_down_proj``, ``q_a_layernorm`` ⇄ ``linear_q_up_proj.layer_norm_weight``,
    ``q_b_proj`` ⇄ ``linear_q_up_proj`` (no q LoRA: ``q_proj`` ⇄ ``linear_q_proj``),
    ``kv_a_proj_with_mqa`` ⇄ ``linear_kv_down_proj``, ``kv_a_layernorm`` ⇄
    ``linear_kv_up_proj.layer_norm_weight``, ``kv_b_proj`` ⇄ ``linear_kv_up_proj``,
    ``o_proj`` ⇄ ``linear_proj``; the input norm is its own module."""
    a, n = L + "self_attn.", D + "self_attention."
    rules: list[Rule] = norm_rules(features, L + "input_layernorm.weight", D + "input_layernorm.weight")
    mla = spec_of(cfg).attention.mla
    if mla is not None and mla.q_lora_rank:
        rules += [Rename(a + "q_a_proj.weight", n + "linear_q_down_proj.weight", shape=(Q_LORA_RANK, HIDDEN)),
                  Rename(a + "q_a_layernorm.weight", n + "linear_q_up_proj.layer_norm_weight", shape=(Q_LORA_RANK,)),
                  Rename(a + "q_b_proj.weight", n + "linear_q_up_proj.weight", Parallel.COLUMN,
                         shape=(None, Q_LORA_RANK))]
    else:
        rules.append(Rename(a + "q_proj.weight", n + "linear_q_proj.weight", Parallel.COLUMN,
                            shape=(None, HIDDEN)))
    rules += [Rename(a + "kv_a_proj_with_mqa.weight", n + "linear_kv_down_proj.weight", shape=(None, HIDDEN)),
              Rename(a + "kv_a_layernorm.weight", n + "linear_kv_up_proj.layer_norm_weight", shape=(KV_LORA_RANK,)),
              Rename(a + "kv_b_proj.weight", n + "linear_kv_up_proj.weight", Parallel.COLUMN,
                     shape=(None, KV_LORA_RANK)),
              Rename(a + "o_proj.weight", n + "linear_proj.weight", Parallel.ROW, shape=(HIDDEN, None))]
    return rules


def attention_rules(features: GPTFeatures, cfg: dict[str, Any]) -> list[Rule]:
    spec = spec_of(cfg).attention
    a, n = L + "self_attn.", D + "self_attention."
    rules: list[Rule] = norm_rules(features, L + "input_layernorm.weight", n + "linear_qkv.layer_norm_weight")
    if features.packed_qkv:
        rules.append(PackedQKV(a + "qkv_proj.weight", n + "linear_qkv.weight"))
    else:
        rules.append(FuseQKV(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight", n + "linear_qkv.weight"))
    if features.qk_norm and spec.qk_norm:  # a config without them (GLM-4.5-Air's use_qk_norm: false) has none
        rules += [Rename(a + "q_norm.weight", n + "q_layernorm.weight", shape=(HEAD_DIM,)),
                  Rename(a + "k_norm.weight", n + "k_layernorm.weight", shape=(HEAD_DIM,))]
    rules.append(Rename(a + "o_proj.weight", n + "linear_proj.weight", Parallel.ROW, shape=(HIDDEN, None)))
    if features.post_norms:
        rules += norm_rules(features, L + "post_attention_layernorm.weight", n + "linear_proj.post_layernorm.weight")
    if spec.qkv_bias:
        rules.append(PackedQKV(a + "qkv_proj.bias", n + "linear_qkv.bias") if features.packed_qkv else
                     FuseQKV(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias", n + "linear_qkv.bias"))
    if spec.proj_bias:
        rules.append(Rename(a + "o_proj.bias", n + "linear_proj.bias"))
    if features.attention_sinks:
        rules.append(Rename(a + "sinks", n + "core_attention.softmax_offset", Parallel.COLUMN,
                            shape=(HEADS,)))
    return rules


#: The MoE layers of a stack (the spec's :attr:`MoE.layer_pattern`: Megatron's
#: ``moe_layer_freq``) and the others.
MOE_LAYERS, DENSE_LAYERS = MOE_LAYER_PATTERN.layers(), (~MOE_LAYER_PATTERN).layers()


def dense_mlp_rules(features: GPTFeatures, cfg: dict[str, Any], layers: str = "{i}") -> list[Rule]:
    """The gated MLP: ``linear_fc1`` = ``[gate; up]``, ``linear_fc2`` = ``down_proj``
    (on the layers of the ``layers`` template: all of them, or a mixed stack's dense ones);
    without ``features.gated_mlp``, ``linear_fc1`` = ``up_proj``."""
    bias = spec_of(cfg).mlp.bias
    m, n = f"model.layers.{layers}.mlp.", f"decoder.layers.{layers}.mlp."
    pre = "pre_feedforward_layernorm" if features.post_norms else "post_attention_layernorm"
    rules: list[Rule] = norm_rules(features, f"model.layers.{layers}.{pre}.weight", n + "linear_fc1.layer_norm_weight")
    if features.post_norms:
        rules += norm_rules(features, f"model.layers.{layers}.post_feedforward_layernorm.weight",
                            n + "linear_fc2.post_layernorm.weight")
    suffixes = ("weight", "bias") if bias else ("weight",)
    for s in suffixes:
        if not features.gated_mlp:
            rules.append(Rename(m + "up_proj." + s, n + "linear_fc1." + s, Parallel.COLUMN,
                                shape=(FFN, HIDDEN) if s == "weight" else (FFN,)))
        elif features.packed_gate_up:
            rules.append(Rename(m + "gate_up_proj." + s, n + "linear_fc1." + s, Parallel.GATED_FC1))
        else:
            rules.append(FuseGated(m + "gate_proj." + s, m + "up_proj." + s, n + "linear_fc1." + s))
    rules.append(Rename(m + "down_proj.weight", n + "linear_fc2.weight", Parallel.ROW,
                        shape=(HIDDEN, FFN)))
    if bias:
        rules.append(Rename(m + "down_proj.bias", n + "linear_fc2.bias"))
    return rules


def moe_mlp_rules(features: GPTFeatures, cfg: dict[str, Any], layers: str = MOE_LAYERS) -> list[Rule]:
    """The mixture-of-experts MLP (:class:`MoEBlock`) on the MoE layers: the pre-MLP norm,
    the router ``[E, H]``, every expert's gated fc1 and fc2 (``{e}`` over
    ``num_moe_experts``), and the optional gated shared expert."""
    moe = features.moe
    assert moe is not None
    fused = provenance_of(cfg).hf_experts == "fused"
    block = (moe.fused_block or moe.block) if fused else moe.block
    h, n = f"model.layers.{layers}.{block}.", f"decoder.layers.{layers}."
    x, nx = h + moe.experts + ".", n + "mlp.experts.local_experts.{e}."
    rules: list[Rule] = norm_rules(features, f"model.layers.{layers}.post_attention_layernorm.weight",
                                   n + "pre_mlp_layernorm.weight")
    rules.append(Rename(h + moe.router + ".weight", n + "mlp.router.weight", shape=(EXPERTS, HIDDEN)))
    if moe.router_bias:
        rules.append(Rename(h + moe.router + ".bias", n + "mlp.router.bias", shape=(EXPERTS,)))
    fc1, fc2 = (Parallel.GATED_FC1, Parallel.ROW) if moe.expert_tp else (Parallel.REPLICATED, Parallel.REPLICATED)
    if not moe.gated:
        if fused:
            raise UnsupportedError("the fused expert layout of an ungated MoE block is not mapped (one tensor per "
                                   "expert and projection is)")
        fc1 = Parallel.COLUMN if moe.expert_tp else Parallel.REPLICATED
        rules += [Rename(x + moe.up + ".weight", nx + "linear_fc1.weight", fc1,
                         shape=(EXPERT_FFN, HIDDEN)),
                  Rename(x + moe.down + ".weight", nx + "linear_fc2.weight", fc2,
                         shape=(HIDDEN, EXPERT_FFN))]
    elif fused:
        rules += [StackedExperts(h + "experts.gate_up_proj", nx + "linear_fc1.weight", fc1,
                                 transpose=moe.fused_transposed, interleaved=moe.fused_interleaved),
                  StackedExperts(h + "experts.down_proj", nx + "linear_fc2.weight", fc2,
                                 transpose=moe.fused_transposed)]
        if moe.expert_biases:
            rules += [StackedExperts(h + "experts.gate_up_proj_bias", nx + "linear_fc1.bias", fc1,
                                     interleaved=moe.fused_interleaved),
                      StackedExperts(h + "experts.down_proj_bias", nx + "linear_fc2.bias", Parallel.REPLICATED)]
    else:
        rules += [FuseGated(x + moe.gate + ".weight", x + moe.up + ".weight", nx + "linear_fc1.weight",
                            ffn=EXPERT_FFN, parallel=fc1),
                  Rename(x + moe.down + ".weight", nx + "linear_fc2.weight", fc2,
                         shape=(HIDDEN, EXPERT_FFN))]
    if moe.expert_bias:
        rules.append(Rename(h + moe.expert_bias, n + "mlp.router.expert_bias", shape=(EXPERTS,)))
    if moe.shared:
        s, ns = h + moe.shared + ".", n + "mlp.shared_experts."
        rules += [FuseGated(s + "gate_proj.weight", s + "up_proj.weight", ns + "linear_fc1.weight",
                            ffn=SHARED_FFN) if moe.gated else
                  Rename(s + "up_proj.weight", ns + "linear_fc1.weight", Parallel.COLUMN,
                         shape=(SHARED_FFN, HIDDEN)),
                  Rename(s + "down_proj.weight", ns + "linear_fc2.weight", Parallel.ROW,
                         shape=(HIDDEN, SHARED_FFN))]
    if moe.shared_gate:
        rules.append(Rename(h + moe.shared_gate + ".weight", n + "mlp.shared_experts.gate_weight",
                            shape=(1, HIDDEN), when=SHARED_GATE))
    return rules


def _at_layer(rule: Rule, hf_prefix: str, nemo_prefix: str) -> Rule:
    """A decoder-layer rule (``model.layers.{i}.`` ⇄ ``decoder.layers.{i}.``) respelled for
    one concrete layer under other prefixes."""

    def hf(name: str) -> str:
        return name.replace(L, hf_prefix)

    def nemo(name: str) -> str:
        return name.replace(D, nemo_prefix)

    return rule.renamed(hf=hf, nemo=nemo)


def mtp_rules(features: GPTFeatures, cfg: dict[str, Any]) -> list[Rule]:
    """Megatron-Core's multi-token-prediction block ⇄ the MTP layers an HF checkpoint stores
    after its ``L`` decoder layers (DeepSeek-V3's hub files: ``model.layers.{L+k}.*``).

    Megatron-Core 0.16.1 (``megatron/core/transformer/multi_token_prediction.py``,
    ``MultiTokenPredictionLayer``, lines 589-679; ``MultiTokenPredictionBlock.sharded_state_dict``,
    lines 1135-1163) keeps MTP layer ``k`` under ``mtp.layers.{k}.`` unstacked: ``enorm``,
    ``hnorm`` (RMSNorms), ``eh_proj`` (column-parallel ``[H, 2H]``, applied to
    ``[enorm(embedding); hnorm(hidden)]``, lines 726-737), ``transformer_layer`` (the *last*
    decoder layer's spec: ``get_gpt_mtp_block_spec_for_backend`` in
    ``models/gpt/gpt_layer_specs.py``, lines 698-708) and ``final_layernorm``; the embedding and
    the output layer are the main model's (``GPTModel._postprocess``, lines 589-622). The HF
    layer names them ``enorm``, ``hnorm``, ``eh_proj``, its attention and MLP,
    ``shared_head.norm``, and stores copies of ``embed_tokens`` and ``shared_head.head``
    (DeepSeek-V3's README_WEIGHTS.md: they share parameters with the main model) — checked
    equal on import and written again on export (:class:`~nemo_convert.mapping.rules.Shared`);
    a source whose MTP layers lack the copies (GLM-4.6's) is recorded as such
    (:data:`~nemo_convert.families.moe_config.HF_MTP_COPIES`) and exported without them.
    Megatron-Bridge maps the same names (``deepseek/common.py`` at v0.6.0, lines 96-157)."""
    spec = spec_of(cfg)
    layers, count = spec.geometry.layers, spec.mtp_layers
    if not count:
        return []
    moe_last = features.moe is not None and spec.moe is not None and spec.moe.layer_pattern[-1]
    layer = mla_attention_rules(features, cfg) if features.mla else attention_rules(features, cfg)
    layer += moe_mlp_rules(features, cfg, "{i}") if moe_last else dense_mlp_rules(features, cfg, "{i}")
    why = ("Megatron-Core's MTP block shares the main model's embedding and output layer; import with --drop-mtp "
           "to leave the MTP layers out")
    copies = cfg_get(cfg, HF_MTP_COPIES, True) is not False  # the source's MTP layers store them
    rules: list[Rule] = []
    for k in range(count):
        h, n = f"model.layers.{layers + k}.", f"mtp.layers.{k}."
        rules += norm_rules(features, h + "enorm.weight", n + "enorm.weight")
        rules += norm_rules(features, h + "hnorm.weight", n + "hnorm.weight")
        rules.append(Rename(h + "eh_proj.weight", n + "eh_proj.weight", Parallel.COLUMN, shape=(HIDDEN, None)))
        rules += [_at_layer(r, h, n + "transformer_layer.") for r in layer]
        rules += norm_rules(features, h + "shared_head.norm.weight", n + "final_layernorm.weight")
        if not copies:
            continue
        rules += [Shared(h + "embed_tokens.weight", "model.embed_tokens.weight", "embedding.word_embeddings.weight",
                         why=why),
                  Shared(h + "shared_head.head.weight", "lm_head.weight", "output_layer.weight", why=why,
                         when=~TIED),
                  Shared(h + "shared_head.head.weight", "model.embed_tokens.weight",
                         "embedding.word_embeddings.weight", why=why, when=TIED)]
    return rules


def gpt_mapping(features: GPTFeatures = GPTFeatures()) -> Callable[[dict[str, Any]], Mapping]:
    """The family's ``mapping(cfg)``: HF decoder names ⇄ NeMo mcore GPT names (logical,
    per layer, without the ``model.`` prefix)."""

    def mapping(cfg: dict[str, Any]) -> Mapping:
        vocab = (VOCAB, HIDDEN)
        rules: list[Rule] = [Rename("model.embed_tokens.weight", "embedding.word_embeddings.weight", Parallel.VOCAB,
                                    shape=vocab)]
        rules += mla_attention_rules(features, cfg) if features.mla else attention_rules(features, cfg)
        spec = spec_of(cfg)
        if features.moe is not None and spec.moe is not None:
            rules += dense_mlp_rules(features, cfg, DENSE_LAYERS) + moe_mlp_rules(features, cfg)
        else:
            rules += dense_mlp_rules(features, cfg)
        rules += norm_rules(features, "model.norm.weight", "decoder.final_layernorm.weight")
        rules += [Rename("lm_head.weight", "output_layer.weight", Parallel.VOCAB, shape=vocab,
                         when=~TIED),
                  Tied("lm_head.weight", "model.embed_tokens.weight", when=TIED)]
        if features.mtp:
            rules += mtp_rules(features, cfg)
        # MTP layers left out on request (--drop-mtp): consumed without output and reported.
        dropped = provenance_of(cfg).mtp_dropped
        extra = tuple(f"model.layers.{spec.geometry.layers + k}.*" for k in range(dropped))
        return Mapping(tuple(rules), layers="num_layers", drop_hf=(L + "self_attn.rotary_emb.inv_freq", *extra))

    return mapping
