"""GPT-2 and NeMo's GPT-3-style models of 2022: HF ``GPT2LMHeadModel`` ⇄ NeMo GPT with
learned absolute positions, LayerNorms with biases, biases on every linear, a non-gated
GeLU MLP and tied embeddings.

HF's GPT-2 (transformers 5.24 ``models/gpt2/modeling_gpt2.py``) stores its linears as
``Conv1D`` (``[in, out]``, ``x @ W``): every weight is transposed into Megatron's
``[out, in]``; ``attn.c_attn`` ``[H, 3H]`` holds ``[q | k | v]`` side by side, which is
regrouped per head into ``linear_qkv`` (:class:`~nemo_convert.mapping.rules.PackedQKV`
with ``transposed``; its bias ``[3H]`` likewise, without the transpose). Attention is
multi-head (no GQA), scaled by 1/sqrt(head size).

The activation: HF's ``gelu_new`` / ``gelu_pytorch_tanh`` / ``gelu_fast`` are the tanh
approximation, ``gelu`` the erf GeLU. NeMo's ``activation: gelu`` runs the tanh
approximation when ``openai_gelu`` is set or Megatron's fused bias-GeLU kernel runs
(``bias_activation_fusion``, NeMo's default), the erf GeLU otherwise
(:func:`~nemo_convert.families.architecture.mlp_activation`); import writes the fields
that say which. Refused by name: ``scale_attn_weights: false``,
``scale_attn_by_inverse_layer_idx``, ``reorder_and_upcast_attn``, ``add_cross_attention``,
and any other activation.

The hub's own ``openai-community/gpt2`` files name the tensors without the ``transformer.``
prefix (``h.0.attn.c_attn.weight``, ``wte.weight``) and keep the causal-mask buffers
``h.N.attn.bias`` / ``attn.masked_bias``; transformers loads either spelling. Import reads
the spelling from the tensor names (the ``hf_names`` option), drops the buffers (reported)
and records the spelling; export writes it back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from nemo_convert import FamilyOptions
from nemo_convert.errors import ConfigError
from nemo_convert.families import (Check, Derived, Field, GELU_ERF, GELU_TANH, GPT_CONFIG, activation_choice,
                                   gpt_family, set_path)
from nemo_convert.families.fields import FFN, HIDDEN, MAX_POSITIONS, TIED, VOCAB
from nemo_convert.mapping import Mapping
from nemo_convert.mapping.rules import PackedQKV, Parallel, Rename, Rule, Tied, Transposed
from nemo_convert.spec import provenance_of, spec_of


#: Where import records the HF checkpoint's tensor-name spelling (``"unprefixed"``: the hub's).
HF_NAMES = "nemo_convert.hf_names"
HF_NAME_SPELLINGS = ("prefixed", "unprefixed")


def gpt2_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF GPT-2 names ⇄ NeMo mcore GPT names (logical, per layer, no ``model.`` prefix), in
    the spelling import recorded."""
    mapping = _prefixed_mapping(cfg)
    if provenance_of(cfg).hf_names == "unprefixed":
        return mapping.respelled_hf(lambda n: n.removeprefix("transformer."))
    return mapping


def _prefixed_mapping(cfg: dict[str, Any]) -> Mapping:
    """The names ``GPT2LMHeadModel.save_pretrained`` writes (``transformer.h.{i}.…``)."""
    t, h, n = "transformer.", "transformer.h.{i}.", "decoder.layers.{i}."
    a, m = n + "self_attention.", n + "mlp."
    vocab, hidden = (VOCAB, HIDDEN), (HIDDEN,)

    def norm(hf: str, nemo_weight: str, nemo_bias: str) -> list[Rule]:
        return [Rename(hf + ".weight", nemo_weight, shape=hidden), Rename(hf + ".bias", nemo_bias, shape=hidden)]

    rules: list[Rule] = [
        Rename(t + "wte.weight", "embedding.word_embeddings.weight", Parallel.VOCAB, shape=vocab),
        Rename(t + "wpe.weight", "embedding.position_embeddings.weight",
               shape=(MAX_POSITIONS, HIDDEN)),
        *norm(h + "ln_1", a + "linear_qkv.layer_norm_weight", a + "linear_qkv.layer_norm_bias"),
        PackedQKV(h + "attn.c_attn.weight", a + "linear_qkv.weight", transposed=True),
        PackedQKV(h + "attn.c_attn.bias", a + "linear_qkv.bias"),
        Transposed(h + "attn.c_proj.weight", a + "linear_proj.weight", Parallel.ROW, shape=(HIDDEN, None)),
        Rename(h + "attn.c_proj.bias", a + "linear_proj.bias", shape=hidden),
        *norm(h + "ln_2", m + "linear_fc1.layer_norm_weight", m + "linear_fc1.layer_norm_bias"),
        Transposed(h + "mlp.c_fc.weight", m + "linear_fc1.weight", Parallel.COLUMN,
                   shape=(FFN, HIDDEN)),
        Rename(h + "mlp.c_fc.bias", m + "linear_fc1.bias", Parallel.COLUMN, shape=(FFN,)),
        Transposed(h + "mlp.c_proj.weight", m + "linear_fc2.weight", Parallel.ROW,
                   shape=(HIDDEN, FFN)),
        Rename(h + "mlp.c_proj.bias", m + "linear_fc2.bias", shape=hidden),
        *norm(t + "ln_f", "decoder.final_layernorm.weight", "decoder.final_layernorm.bias"),
        Rename("lm_head.weight", "output_layer.weight", Parallel.VOCAB, shape=vocab,
               when=~TIED),
        Tied("lm_head.weight", t + "wte.weight", when=TIED),
    ]
    # The causal-mask buffers older checkpoints saved (not weights; transformers ignores them).
    return Mapping(tuple(rules), layers="num_layers", drop_hf=(h + "attn.bias", h + "attn.masked_bias"))


def _heads_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    heads = int(hf.get("n_head") or 12)
    return {"num_attention_heads": heads, "num_query_groups": heads}


def _heads_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"n_head": int(cfg["num_attention_heads"])}


def _inner_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    return {"ffn_hidden_size": int(hf.get("n_inner") or 4 * int(hf.get("n_embd") or 768))}


def _inner_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    ffn = int(cfg["ffn_hidden_size"])
    return {"n_inner": None if ffn == 4 * int(cfg["hidden_size"]) else ffn}


def _must(key: str, want: bool, why: str) -> Check:
    return Check((key,), lambda hf: None if bool(hf.get(key, want)) is want else f"{key}={hf[key]!r} ({why})")


GPT2_CONFIG = GPT_CONFIG.extend(
    Field("n_embd", "hidden_size", 768, to_nemo=int, to_hf=int),
    Field("n_layer", "num_layers", 12, to_nemo=int, to_hf=int),
    Derived(("n_head",), _heads_to_nemo, _heads_to_hf),
    Derived(("n_inner",), _inner_to_nemo, _inner_to_hf),
    Field("n_positions", "max_position_embeddings", 1024, to_nemo=int, to_hf=int),
    Field("n_positions", "encoder_seq_length", 1024, to_nemo=int, to_hf=None),
    Field("layer_norm_epsilon", "layernorm_epsilon", 1e-5, to_nemo=float, to_hf=float),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", True, to_nemo=bool, to_hf=bool),
    activation_choice("activation_function", {"gelu_new": GELU_TANH, "gelu_pytorch_tanh": GELU_TANH,
                                              "gelu_fast": GELU_TANH, "gelu": GELU_ERF}, "gelu_new"),
    _must("scale_attn_weights", True, "attention without the 1/sqrt(head size) scale"),
    _must("scale_attn_by_inverse_layer_idx", False, "attention scores divided by the layer number"),
    _must("reorder_and_upcast_attn", False, "attention computed in another order and precision"),
    _must("add_cross_attention", False, "cross-attention layers, an encoder-decoder"),
    harmless=("resid_pdrop", "embd_pdrop", "attn_pdrop",  # dropout: training only
              "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
              "summary_first_dropout",  # GPT2DoubleHeadsModel's classification head only
              "n_ctx",  # not read by GPT2Model (the positions are n_positions)
              "n_special", "predict_special_tokens"),  # OpenAI-GPT keys that GPT-2 does not read
    drop=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "head_dim", "max_position_embeddings", "rms_norm_eps", "attention_dropout", "hidden_act", "rope_theta"),
    nemo_constants={"normalization": "layernorm", "position_embedding_type": "learned_absolute", "bias": True,
                    "kv_channels": None, "attention_dropout": 0.0,
                    "nemo_convert.linear_biases": {"attention": True, "mlp": True}},
)

#: ``--to megatron-bridge`` is refused: no provider to confirm against.
MEGATRON_BRIDGE = "Megatron-Bridge has no GPT-2 bridge (v0.6.0: src/megatron/bridge/models/ has no gpt2/)"

GPT2 = gpt_family(
    "gpt2", architecture="GPT2LMHeadModel", model_type="gpt2", config=GPT2_CONFIG, mapping=gpt2_mapping,
    claims=lambda cfg: spec_of(cfg).positions == "learned_absolute",
    description="GPT-2, NeMo's GPT-3-style models (learned positions, LayerNorm and linear biases, GeLU, tied)",
    megatron_bridge=MEGATRON_BRIDGE)


def hf_names_of(hf: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The ``hf_names`` import option read from the source's tensor names."""
    prefixed = any(k.startswith("transformer.") for k in keys)
    return {"hf_names": "prefixed" if prefixed or not keys else "unprefixed"}


def _with_names(to_nemo: Any) -> Any:
    def config_to_nemo(hf: dict[str, Any], hf_names: str = "prefixed") -> dict[str, Any]:
        if hf_names not in HF_NAME_SPELLINGS:
            raise ConfigError(f"hf_names={hf_names!r} is not a GPT-2 tensor-name spelling "
                              f"(use {' or '.join(HF_NAME_SPELLINGS)})")
        cfg = to_nemo(hf)
        if hf_names == "unprefixed":
            set_path(cfg, HF_NAMES, hf_names)
        return cfg

    return config_to_nemo


GPT2 = dataclasses.replace(GPT2, config_to_nemo=_with_names(GPT2.config_to_nemo),
                           options=FamilyOptions(keys=("hf_names",), from_source=hf_names_of))
