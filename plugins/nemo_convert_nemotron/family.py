"""Nemotron-3 / Nemotron-4 / Minitron: HF ``NemotronForCausalLM`` ⇄ NeMo mcore GPT with a
squared-ReLU MLP, zero-centred LayerNorms with biases and partial RoPE.

What each side computes (transformers 5.24 ``models/nemotron/modeling_nemotron.py``):
``NemotronLayerNorm1P`` is a LayerNorm with a bias computing ``layer_norm(x, w + 1, b)``
and storing ``w``, which is NeMo's ``normalization: layernorm1p`` (Megatron-Core
``LayerNorm`` with ``layernorm_zero_centered_gamma``): the norms are copied as stored, in
both directions. The MLP is ``down(relu2(up(x)))`` (``ReLUSquaredActivation``) = NeMo's
``activation: squared-relu`` (non-gated; ``linear_fc1`` is ``up_proj``). The attention
rotates the first ``partial_rotary_factor`` of each head (default 0.5 when the config has
no factor) = Megatron's ``rotary_percent``. ``attention_bias`` biases q, k, v and o,
``mlp_bias`` up and down (Megatron's ``bias`` all of them).

NeMo writes these as NVIDIA's own configs do (NeMo-Framework-Launcher
``conf/training/nemotron/nemotron_8b.yaml``: ``normalization: layernorm1p``,
``layernorm_zero_centered_gamma: True``, ``activation: squared-relu``,
``bias_activation_fusion: false``). Refused by name: gated MLPs (no HF class runs a gated
MLP under zero-centred LayerNorms exactly; docs/families/nemotron.md), RoPE scaling,
and the ``kv_channels`` / ``layer_norm_eps`` spellings some converters wrote, which
transformers ignores, unless they agree with ``head_dim`` / ``norm_eps``.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.families import (Check, Field, GPTFeatures, GPT_CONFIG, GPT_PROVIDER, NO_LINEAR_BIAS, NemoCheck,
                                   ProviderFamily, SQUARED_RELU, activation, gpt_family, linear_biases, partial_rope)
from nemo_convert.spec import spec_of
from nemo_convert_nemotron.nemo2 import NEMO2_CONFIGS


def _head_dim(hf: dict[str, Any]) -> int:
    return int(hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"]))


def _kv_channels(hf: dict[str, Any]) -> str | None:
    """``kv_channels`` (NeMo's early Minitron converter wrote it): transformers'
    ``NemotronConfig`` ignores it; harmless only when it is the head size HF runs."""
    kv = hf.get("kv_channels")
    if kv is None or int(kv) == _head_dim(hf):
        return None
    return f"kv_channels={kv} while transformers runs head_dim={_head_dim(hf)} (it reads head_dim only)"


def _layer_norm_eps(hf: dict[str, Any]) -> str | None:
    """``layer_norm_eps`` (a community converter's spelling): transformers reads ``norm_eps``."""
    eps = hf.get("layer_norm_eps")
    if eps is None or float(eps) == float(hf.get("norm_eps") or 1e-5):
        return None
    return f"layer_norm_eps={eps} while transformers runs norm_eps={hf.get('norm_eps') or 1e-5} (it reads norm_eps only)"


def _gated_layernorm1p(cfg: dict[str, Any]) -> str | None:
    """GPT-2B-001's architecture (a gated SwiGLU under zero-centred LayerNorms) has no exact
    HF class: say what would be needed."""
    spec = spec_of(cfg)
    if not (spec.mlp.gated and spec.norm.zero_centred):
        return None
    return (f"activation={cfg.get('activation')!r} is a gated MLP under zero-centred LayerNorms (GPT-2B-001's "
            "architecture): NemotronForCausalLM's MLP is not gated, and the class that runs the rest, "
            "StableLmForCausalLM, would need 1 added to every LayerNorm weight, which bfloat16 cannot store exactly "
            "(docs/families/nemotron.md)")


NEMOTRON_CONFIG = GPT_CONFIG.extend(
    Field("norm_eps", "layernorm_epsilon", 1e-5, to_nemo=float, to_hf=float),
    linear_biases("attention_bias", "mlp_bias"),
    activation("relu2", "squared-relu"),
    partial_rope(0.5),
    Check(("kv_channels",), _kv_channels),
    Check(("layer_norm_eps",), _layer_norm_eps),
    NemoCheck("gated_layernorm1p", _gated_layernorm1p),
    harmless=("unk_token_id",),  # a token id, as bos/eos/pad
    drop=("rms_norm_eps",),
    nemo_constants={"normalization": "layernorm1p", "layernorm_zero_centered_gamma": True,
                    "bias_activation_fusion": False},
)


def _claims(cfg: dict[str, Any]) -> bool:
    """A NeMo-written LayerNorm + RoPE decoder (the family's check then decides)."""
    spec = spec_of(cfg)
    return spec.norm.kind == "layernorm" and spec.positions == "rope"


#: ``--to megatron-bridge``: Megatron-Bridge v0.6.0 ``nemotron/nemotron_bridge.py`` lines 56-72 keeps the
#: ``GPTModelProvider`` with LayerNorm, squared ReLU (not gated), no linear biases, zero-centred
#: norms and the fusion switches below.
MEGATRON_BRIDGE = ProviderFamily(
    GPT_PROVIDER, (("normalization", "LayerNorm"), ("gated_linear_unit", False), ("position_embedding_type", "rope"),
                   ("activation_func", SQUARED_RELU), ("layernorm_zero_centered_gamma", True)) + NO_LINEAR_BIAS,
    extra=(("masked_softmax_fusion", True), ("persist_layer_norm", True), ("cross_entropy_loss_fusion", True),
           ("apply_rope_fusion", True), ("hidden_dropout", 0.0), ("attention_dropout", 0.0)))

NEMOTRON = gpt_family(
    "nemotron", architecture="NemotronForCausalLM", model_type="nemotron", config=NEMOTRON_CONFIG,
    features=GPTFeatures(gated_mlp=False, norm_bias=True),
    claims=_claims,
    nemo2_targets=("nemo.collections.llm.gpt.model.nemotron.NemotronModel",), nemo2_configs=NEMO2_CONFIGS,
    description="Nemotron-3/4, Minitron (squared-ReLU MLP, zero-centred LayerNorm with bias, partial RoPE, GQA)",
    megatron_bridge=MEGATRON_BRIDGE)
