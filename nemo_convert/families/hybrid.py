"""Hybrid stacks: Megatron-Core's ``MambaModel``, whose layers each hold one kind of block.

Megatron-Core 0.16.1 builds a hybrid stack from a per-layer pattern
(``ssm/mamba_hybrid_layer_allocation.py``, ``Symbols``: ``M`` Mamba-2, ``*`` attention,
``-`` MLP, ``E`` mixture of experts; ``MambaStack.__init__``, ``ssm/mamba_block.py``
lines 120–159, one layer per symbol) and keys every layer by its index, never stacked
(``MambaStack.sharded_state_dict``, lines 363–419: ``decoder.layers.<i>.…`` with no
sharded offsets). Each layer has its own pre-norm, fused into its first linear by the
Transformer-Engine spec (``models/mamba/mamba_layer_specs.py``: ``mixer.in_proj``,
``self_attention.linear_qkv``, ``mlp.linear_fc1`` are ``TELayerNormColumnParallelLinear``;
the MoE layer's norm is ``pre_mlp_layernorm``); the final norm is ``decoder.final_norm``.

A family declares a hybrid stack as the GPT base's blocks where they fit (attention,
MLP, mixture of experts: :mod:`nemo_convert.families.gpt`, respelled for the HF
checkpoint's names) and the Mamba mixer block here (:func:`mamba_mixer_rules`), each on
the layers of its symbol (``{i:@layer_kinds=M}``: the spec's ``hybrid_override_pattern``,
``mapping/rules/base.py``).
The mixer's fused input projection and its convolution are split across
tensor-parallel ranks by sections (:class:`~nemo_convert.mapping.rules.Sections`), as
Megatron-Core does it, and stored in a distributed checkpoint as one key per section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from nemo_convert.families.config_table import ConfigTable
from nemo_convert.families.fields import HIDDEN, LAYER_KINDS, TIED, VOCAB
from nemo_convert.families.gpt_config import GPT_NEMO_CONSTANTS
from nemo_convert.families.gpt import GPTFeatures, MoEBlock, attention_rules, dense_mlp_rules, moe_mlp_rules
from nemo_convert.families.gpt_family import checked_to_hf, table_translation
from nemo_convert.mapping.rules import Mapping, Parallel, Rename, Rule, Sections, Tied
from nemo_convert.plugins.records import HFSide, ModelFamily, NemoTarget
from nemo_convert.spec import layer_symbols, mamba_dims, spec_of

#: The NeMo field holding the per-layer pattern (NeMo 1's ``MegatronMambaModel``,
#: ``megatron_mamba_model.py`` line 59; NeMo 2's ``SSMConfig``; Megatron-Core's
#: ``MambaModel(hybrid_override_pattern=…)``).
PATTERN = "hybrid_override_pattern"
#: Megatron-Core's layer symbols (``mamba_hybrid_layer_allocation.py`` lines 25–32).
MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"
SYMBOLS = (MAMBA, ATTENTION, MLP, MOE)

D = "decoder.layers."


def kind_layers(symbols: str) -> str:
    """The layer template of the layers whose symbol is one of ``symbols`` (the spec's
    :attr:`ModelSpec.layer_kinds`)."""
    return LAYER_KINDS.layers(symbols)


def pattern_of(cfg: dict[str, Any]) -> list[str]:
    """The NeMo config's per-layer pattern, one symbol per layer (checked against
    ``num_layers`` and Megatron-Core's symbols)."""
    return layer_symbols(cfg.get(PATTERN), spec_of(cfg).geometry.layers)


@dataclass(frozen=True)
class HybridNames:
    """What an HF hybrid checkpoint calls its parts. ``layer`` is one layer's prefix (``{i}``
    its index); each layer has one pre-norm (``norm``) and one block (``mixer``), whatever
    its kind; the block's own names are the GPT base's (``q_proj``, ``up_proj``, …) and the
    Mamba mixer's (``in_proj``, ``conv1d``, ``A_log``, ``D``, ``dt_bias``, ``norm``,
    ``out_proj``)."""

    layer: str = "backbone.layers.{i}."
    norm: str = "norm.weight"
    mixer: str = "mixer."
    embedding: str = "backbone.embeddings.weight"
    final_norm: str = "backbone.norm_f.weight"
    head: str = "lm_head.weight"


@dataclass(frozen=True)
class HybridBlocks:
    """The blocks of a hybrid family beyond the Mamba mixer and the attention: the MLP
    features of its dense MLP layers (``gated_mlp=False``: ``up_proj`` and the activation
    alone) and its mixture-of-experts block (None: the family has no ``E`` layers)."""

    mlp: GPTFeatures = field(default_factory=lambda: GPTFeatures(gated_mlp=False))
    moe: MoEBlock | None = None


def mamba_sections(cfg: dict[str, Any]) -> tuple[Sections, Sections]:
    """The sections of the mixer's ``in_proj`` rows (``[z; x; B; C; dt]``) and of its
    ``conv1d`` channels (``[x; B; C]``), from the NeMo config: ``d_inner`` =
    ``mamba_num_heads × mamba_head_dim``, ``B`` and ``C`` ``mamba_num_groups ×
    mamba_state_dim`` each, ``dt`` one per head (Megatron-Core 0.16.1
    ``ssm/mamba_mixer.py`` lines 233–292)."""
    heads, head_dim, groups, state = mamba_dims(cfg)
    inner, bc = heads * head_dim, groups * state
    # each rank holds whole heads of z, x, dt and whole groups of B, C (lines 249–262)
    in_proj = Sections(("z", "x", "B", "C", "dt"), (inner, inner, bc, bc, heads),
                       units=(heads, heads, groups, groups, heads))
    conv = Sections(("x", "B", "C"), (inner, bc, bc), units=(heads, groups, groups))
    return in_proj, conv


def mamba_mixer_rules(names: HybridNames, cfg: dict[str, Any]) -> list[Rule]:
    """The Mamba-2 mixer on the ``M`` layers, every tensor as HF stores it:

    ======================================  ========================================  ===========
    HF (under the layer)                    NeMo (under ``decoder.layers.<i>.``)      TP
    ======================================  ========================================  ===========
    ``norm.weight`` ``[H]``                 ``mixer.in_proj.layer_norm_weight``       replicated
    ``mixer.in_proj.weight``                ``mixer.in_proj.weight`` ``[z;x;B;C;dt]``  sections
    ``mixer.conv1d.weight`` ``[c, 1, k]``   ``mixer.conv1d.weight`` ``[x;B;C]``       sections
    ``mixer.conv1d.bias`` ``[c]``           ``mixer.conv1d.bias``                     sections
    ``mixer.A_log``, ``D``, ``dt_bias``     the same ``[heads]``                      by head
    ``mixer.norm.weight`` ``[d_inner]``     ``mixer.norm.weight`` (gated RMSNorm)     by group
    ``mixer.out_proj.weight``               ``mixer.out_proj.weight``                 row
    ======================================  ========================================  ===========

    Megatron-Core 0.16.1 ``ssm/mamba_mixer.py``: the parameters (lines 268–379), their TP
    axes (``sharded_state_dict``, lines 1104–1116: ``A_log``, ``dt_bias``, ``D`` on dim 0;
    ``norm.weight`` dim 0, ``ExtendedRMSNorm``, lines 88–100) and the sections (lines
    1138–1182). Megatron-Bridge maps the same names (``nemotronh/nemotron_h_bridge.py`` at
    067f987, lines 509–549: ``ColumnParallelMapping`` for ``A_log``, ``D``, ``dt_bias``,
    ``norm.weight``; ``RowParallelMapping`` for ``out_proj``; ``MambaInProjMapping``,
    ``MambaConv1dMapping``), and so does NeMo 2 (``nemo/collections/llm/gpt/model/ssm.py``
    lines 512–535)."""
    t = kind_layers(MAMBA)
    h, n = names.layer.replace("{i}", t), D + t + "."
    m = h + names.mixer
    in_proj, conv = mamba_sections(cfg)
    heads, inner = (in_proj.sizes[-1],), in_proj.sizes[0]
    return [
        Rename(h + names.norm, n + "mixer.in_proj.layer_norm_weight", shape=(HIDDEN,)),
        Rename(m + "in_proj.weight", n + "mixer.in_proj.weight", in_proj, shape=(in_proj.rows, HIDDEN)),
        Rename(m + "conv1d.weight", n + "mixer.conv1d.weight", conv, shape=(conv.rows, 1, None)),
        Rename(m + "conv1d.bias", n + "mixer.conv1d.bias", conv, shape=(conv.rows,)),
        Rename(m + "A_log", n + "mixer.A_log", Parallel.COLUMN, shape=heads),
        Rename(m + "D", n + "mixer.D", Parallel.COLUMN, shape=heads),
        Rename(m + "dt_bias", n + "mixer.dt_bias", Parallel.COLUMN, shape=heads),
        Rename(m + "norm.weight", n + "mixer.norm.weight", Parallel.COLUMN, shape=(inner,)),
        Rename(m + "out_proj.weight", n + "mixer.out_proj.weight", Parallel.ROW, shape=(HIDDEN, inner)),
    ]


def respell(rules: list[Rule], names: HybridNames, layers: str, norm: str, block: str) -> list[Rule]:
    """GPT-base rules (``model.layers.<layers>.`` ⇄ ``decoder.layers.<layers>.``) in the
    HF checkpoint's spelling: the layer prefix, its one pre-norm (the GPT base's ``norm``,
    e.g. ``input_layernorm.weight``) and its block (the GPT base's ``block``, e.g.
    ``self_attn.``) renamed to ``names``'."""
    gpt = f"model.layers.{layers}."
    ours = names.layer.replace("{i}", layers)

    def hf(name: str) -> str:
        if not name.startswith(gpt):
            raise ValueError(f"internal error: {name} is not a layer name under {gpt}")
        rest = name[len(gpt):]
        if rest == norm:
            return ours + names.norm
        if rest.startswith(block):
            return ours + names.mixer + rest[len(block):]
        raise ValueError(f"internal error: {name} is neither the layer's norm nor its block")

    return [r.renamed(hf=hf) for r in rules]


def attention_block(names: HybridNames, cfg: dict[str, Any]) -> list[Rule]:
    """The attention layers (``*``): the GPT base's grouped QKV, ``o_proj`` and the fused
    input norm (``self_attention.linear_qkv.layer_norm_weight``)."""
    t = kind_layers(ATTENTION)
    rules = [r.renamed(hf=lambda x: x.replace("model.layers.{i}.", f"model.layers.{t}."),
                       nemo=lambda x: x.replace(D + "{i}.", D + t + "."))
             for r in attention_rules(GPTFeatures(), cfg)]
    return respell(rules, names, t, "input_layernorm.weight", "self_attn.")


def mlp_block(blocks: HybridBlocks, names: HybridNames, cfg: dict[str, Any]) -> list[Rule]:
    """The MLP layers (``-``): the GPT base's dense MLP with its fused pre-norm
    (``mlp.linear_fc1.layer_norm_weight``)."""
    t = kind_layers(MLP)
    return respell(dense_mlp_rules(blocks.mlp, cfg, t), names, t, "post_attention_layernorm.weight", "mlp.")


def moe_block(blocks: HybridBlocks, names: HybridNames, cfg: dict[str, Any]) -> list[Rule]:
    """The mixture-of-experts layers (``E``): the GPT base's MoE block (router, experts,
    shared expert) and its ``pre_mlp_layernorm``."""
    assert blocks.moe is not None
    t = kind_layers(MOE)
    features = GPTFeatures(moe=blocks.moe)
    return respell(moe_mlp_rules(features, cfg, t), names, t, "post_attention_layernorm.weight",
                   blocks.moe.block + ".")


def hybrid_mapping(blocks: HybridBlocks = HybridBlocks(), names: HybridNames = HybridNames()) -> Callable[
        [dict[str, Any]], Mapping]:
    """The family's ``mapping(cfg)``: the embedding, every layer's block by its symbol,
    the final norm (``decoder.final_norm``) and the output layer (or, tied, a check)."""

    def mapping(cfg: dict[str, Any]) -> Mapping:
        kinds = set(pattern_of(cfg))
        vocab = (VOCAB, HIDDEN)
        rules: list[Rule] = [Rename(names.embedding, "embedding.word_embeddings.weight", Parallel.VOCAB, shape=vocab)]
        if MAMBA in kinds:
            rules += mamba_mixer_rules(names, cfg)
        if ATTENTION in kinds:
            rules += attention_block(names, cfg)
        if MLP in kinds:
            rules += mlp_block(blocks, names, cfg)
        if MOE in kinds:
            if blocks.moe is None:
                raise ValueError(f"internal error: {PATTERN} has {MOE} layers and the family declares no MoE block")
            rules += moe_block(blocks, names, cfg)
        rules += [Rename(names.final_norm, "decoder.final_norm.weight", shape=(HIDDEN,)),
                  Rename(names.head, "output_layer.weight", Parallel.VOCAB, shape=vocab,
                         when=~TIED),
                  Tied(names.head, names.embedding, when=TIED)]
        return Mapping(tuple(rules), layers="num_layers")

    return mapping


#: NeMo 1's class for a Megatron-Core ``MambaModel`` (the ``target`` of ``model_config.yaml``;
#: NVIDIA/NeMo ``nemo/collections/nlp/models/language_modeling/megatron_mamba_model.py``).
NEMO_MAMBA_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_mamba_model.MegatronMambaModel"

#: NeMo fields every hybrid family writes with a fixed value: the GPT base's, and what
#: ``MegatronMambaModel`` reads beside them (lines 59–73: ``add_bias_linear``,
#: ``gated_linear_unit``) and ``MambaModel`` runs (no position embedding: its default,
#: ``models/mamba/mamba_model.py`` line 76).
HYBRID_NEMO_CONSTANTS: dict[str, Any] = {**GPT_NEMO_CONSTANTS, "add_bias_linear": False, "gated_linear_unit": False,
                                         "position_embedding_type": "none"}


#: The fields ``MegatronMambaModel`` passes to Megatron-Core itself, over what its GPT base
#: derived, with its defaults (``model_provider_func``, ``megatron_mamba_model.py`` lines 62-64 at
#: NeMo ``8cfedd7``): NeMo's ``bias`` and the activation's own gating are overridden by them.
MAMBA_MODEL_OVERRIDES: dict[str, Any] = {"add_bias_linear": False, "gated_linear_unit": False}


def constants_refusal(cfg: dict[str, Any], constants: dict[str, Any]) -> str | None:
    """Why a NeMo config computes other than a hybrid family's constant fields (its table's
    ``nemo_constants``: linear biases, gating, the MLP function, the norm), or None. (The
    position embedding is not compared: ``MegatronMambaModel`` builds ``MambaModel`` without
    one whatever ``position_embedding_type`` says, lines 66-73.) The linear biases count where
    the pattern has attention, MLP or MoE layers, the MLP's function and gating where it has
    MLP or MoE layers (a Mamba-only stack has neither)."""
    kinds = set(pattern_of(cfg))
    mlp = bool(kinds & {MLP, MOE})
    for k, default in MAMBA_MODEL_OVERRIDES.items():
        have = bool(cfg.get(k, default) or False)
        counts = mlp if k == "gated_linear_unit" else bool(kinds - {MAMBA})
        if counts and k in constants and have != bool(constants[k]):
            return f"{k}={have}: the family's HF class computes {k}={bool(constants[k])}"
    s = spec_of(cfg)
    want = spec_of({**cfg, **{k: constants[k] for k in ("activation", "normalization") if k in constants}})
    if mlp and s.mlp.activation != want.mlp.activation:
        return (f"activation={cfg.get('activation')!r}: the family's HF class computes "
                f"{constants.get('activation')!r}")
    if s.norm.kind != want.norm.kind:
        return f"normalization={cfg.get('normalization')!r}: the family's HF class computes {want.norm.kind!r}"
    return None


def hybrid_family(name: str, *, architecture: str, model_type: str, config: ConfigTable,
                  blocks: HybridBlocks = HybridBlocks(), names: HybridNames = HybridNames(),
                  description: str = "", nemo2_targets: tuple[str, ...] = (),
                  nemo2_configs: dict[str, dict[str, Any] | str] | None = None, **extra: Any) -> ModelFamily:
    """A hybrid-stack family: the blocks of ``blocks`` on the layers of their symbols,
    HF names ``names``, translated by ``config`` (its rows and :data:`HYBRID_NEMO_CONSTANTS`).
    The NeMo side is ``MegatronMambaModel`` in the ``dist`` layout with every layer's keys
    unstacked (``MambaStack.sharded_state_dict``); export refuses a NeMo config the table's
    :class:`~nemo_convert.families.config_table.NemoCheck` rows refuse, or one whose biases,
    gating, MLP function or norm are not the family's constants (:func:`constants_refusal`).
    ``nemo2_targets`` / ``nemo2_configs``: NeMo 2's model classes and their config classes'
    defaults (:class:`NemoTarget`). ``extra`` replaces other :class:`ModelFamily` fields."""
    table = config.extend(hf_constants={"architectures": [architecture], "model_type": model_type})
    to_nemo, to_hf = table_translation(table, name)

    constants = {**HYBRID_NEMO_CONSTANTS, **table.nemo_constants}

    def refuse(cfg: dict[str, Any]) -> str | None:
        return constants_refusal(cfg, constants) or table.refuse_nemo(cfg)

    fields: dict[str, Any] = {
        "nemo": NemoTarget(NEMO_MAMBA_TARGET, default_layout="dist", dist_unstacked=(D,),
                           dist_extra_states=("output_layer",), nemo2_targets=nemo2_targets,
                           nemo2_configs=dict(nemo2_configs or {})),
        "hf": HFSide(model_class=architecture), **extra}
    return ModelFamily(
        name=name, hf_architectures=(architecture,), hf_model_types=(model_type,),
        mapping=hybrid_mapping(blocks, names), config_to_nemo=to_nemo,
        config_to_hf=checked_to_hf(to_hf, refuse, name), description=description, refuses_nemo_config=refuse,
        **fields)
