"""Nemotron-H (Nemotron-H 4B/8B/47B/56B, Nemotron-Nano-v2, Nemotron-3 Nano): HF
``NemotronHForCausalLM`` ⇄ Megatron-Core's hybrid ``MambaModel`` (NeMo 1
``MegatronMambaModel``), declared on the hybrid base (:mod:`nemo_convert.families.hybrid`).

What each side computes — transformers 5.24 ``models/nemotron_h/modeling_nemotron_h.py``
and Megatron-Core 0.16.1 (``ssm/``, ``models/mamba/``):

* Every layer is ``x + block(rmsnorm(x))`` with one ``norm`` (``NemotronHBlock``, lines
  934–993) ⇄ the norm fused into the block's first linear (``MambaLayer``, attention and
  MLP ``TransformerLayer``) or the MoE layer's ``pre_mlp_layernorm``. The final norm is
  ``norm_f`` ⇄ ``decoder.final_norm``; no position embedding anywhere (the attention calls
  no rotary embedding, lines 889–931 ⇄ ``MambaModel``'s ``position_embedding_type='none'``).
* ``M``: the Mamba-2 mixer (lines 390–614): ``in_proj`` → ``[z; xBC; dt]``, a depthwise
  causal ``conv1d`` with SiLU, the SSM with ``A = -exp(A_log)``, ``D`` per head and
  ``softplus(dt + dt_bias)``, then ``rmsnorm(y · silu(z))`` per group of ``d_inner / n_groups``
  channels (``NemotronHRMSNormGated``, lines 56–77) and ``out_proj`` ⇄ ``MambaMixer``
  (``ssm/mamba_mixer.py``) with ``rmsnorm=True``, ``norm_before_gate=False``, the same
  split (``_ssm_prefill``, lines 716–898).
* ``*``: attention with grouped queries, no bias, scaling ``head_dim**-0.5`` ⇄ the GPT
  base's attention. ``-``: ``down(relu2(up(x)))`` (``NemotronHMLP``) ⇄ a non-gated MLP with
  ``squared_relu``. ``E``: sigmoid routing with a score-correction bias, the chosen scores
  renormalised (``norm_topk_prob``) and scaled by ``routed_scaling_factor``, non-gated
  squared-ReLU experts and one shared expert (``NemotronHMoE``, lines 715–797) ⇄
  Megatron-Core's router with ``moe_router_score_function: sigmoid``,
  ``moe_router_enable_expert_bias`` and ``moe_router_topk_scaling_factor``
  (``transformer/moe/moe_utils.py`` lines 716–729: it renormalises when ``topk > 1``).

Refused by name: a mixer Megatron-Core builds otherwise (hybrid_config.mixer_checks),
biases on attention or MLP, a sliding window, latent MoE projections
(``moe_latent_size``: Nemotron-3 Super; Megatron-Core 0.16.1 has ``fc1_latent_proj``, not
mapped here), multi-token-prediction layers (``num_nextn_predict_layers``: ``MambaModel``
0.16.1 has no MTP block), a routing normalisation Megatron-Core does not do, and groups of
experts scored otherwise: ``NemotronHTopkRouter`` (lines 872-876) scores each of ``n_group``
groups by the sum of its two best experts, Megatron-Core 0.16.1 by its best
``topk // group_topk`` (``transformer/moe/moe_utils.py`` lines 552-555), so more than one
group with ``num_experts_per_tok // topk_group`` other than 2 is refused
(:func:`~nemo_convert.families.top_two_groups`, shared with the DeepSeek-style families).
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import (GPT_CONFIG, HYBRID_PROVIDER, NO_LINEAR_BIAS, SQUARED_RELU, Check, Derived, Field,
                                   MoEBlock, ProviderFamily, activation, top_two_groups)
from nemo_convert.families.hybrid import (HYBRID_NEMO_CONSTANTS, MOE, NEMO_MAMBA_TARGET, PATTERN, HybridBlocks,
                                          hybrid_family)
from nemo_convert.families.hybrid_config import HYBRID_PATTERN, MIXER_HARMLESS, MIXER_ROWS, _pattern_from_hf
from nemo_convert.spec import spec_of
from nemo_convert_nemotron_h.nemo2 import NEMO2_CONFIGS

#: transformers 5.24's default head size (``NemotronHConfig.head_dim = 128``,
#: ``configuration_nemotron_h.py`` line 108), which ``NemotronHAttention`` uses (line 878).
HF_HEAD_DIM = 128


def _head_dim_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    d = hf.get("head_dim") if hf.get("head_dim") is not None else hf.get("attention_head_dim")
    return {"kv_channels": int(d) if d is not None else HF_HEAD_DIM}


def _head_dim_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"head_dim": spec_of(cfg).geometry.head_dim}


def _head_dim_checks(hf: dict[str, Any]) -> str | None:
    head, older = hf.get("head_dim"), hf.get("attention_head_dim")
    if head is not None and older is not None and int(head) != int(older):
        return f"head_dim={head} and attention_head_dim={older} disagree"
    if head is None and older is not None and int(older) != HF_HEAD_DIM:
        return (f"attention_head_dim={older} without head_dim: transformers' NemotronHConfig runs head_dim "
                f"{HF_HEAD_DIM} (its default) and ignores attention_head_dim")
    return None


def _no_biases(hf: dict[str, Any]) -> str | None:
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            return f"{key}=True (NemotronH's attention has no biases; Megatron-Core's add_bias_linear would bias every linear)"
    if hf.get("sliding_window") is not None:
        return f"sliding_window={hf['sliding_window']} (a window on the attention layers is not mapped)"
    return None


#: The mixture-of-experts keys (``NemotronHConfig`` lines 132–145).
MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
            "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "moe_latent_size", "n_shared_experts",
            "moe_shared_expert_overlap", "output_router_logits", "num_nextn_predict_layers", "mtp_layers_block_type",
            "mtp_hybrid_override_pattern")

#: What Megatron-Core runs Nemotron-H's router with (Megatron-Bridge sets the same:
#: ``nemotronh/nemotron_h_bridge.py`` at 067f987, lines 310–318).
MOE_CONSTANTS: dict[str, Any] = {
    "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True, "moe_router_pre_softmax": False,
    "moe_router_dtype": "fp32", "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-4,
    "moe_grouped_gemm": False, "moe_token_dispatcher_type": "alltoall", "moe_shared_expert_gate": False,
    "expert_model_parallel_size": 1,
}


def _moe_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    if int(hf.get("num_nextn_predict_layers") or 0):
        raise UnsupportedError(f"num_nextn_predict_layers={hf['num_nextn_predict_layers']} (Megatron-Core 0.16.1's "
                               "MambaModel has no multi-token-prediction block; family nemotron_h cannot represent it "
                               "exactly)")
    if MOE not in _pattern_from_hf(hf):
        return {}
    if hf.get("moe_latent_size") is not None:
        raise UnsupportedError(f"moe_latent_size={hf['moe_latent_size']} (latent MoE projections are not mapped; "
                               "family nemotron_h cannot represent it)")
    topk, norm = int(hf.get("num_experts_per_tok", 2)), hf.get("norm_topk_prob", True)
    if bool(norm) != (topk > 1):
        raise UnsupportedError(f"norm_topk_prob={norm} with num_experts_per_tok={topk} (Megatron-Core renormalises "
                               "the chosen sigmoid scores exactly when top-k > 1; family nemotron_h cannot represent "
                               "it exactly)")
    groups = int(hf.get("n_group") or 1)
    if groups > 1:  # NemotronHTopkRouter scores a group by its two best experts (lines 872-876)
        top_two_groups(topk, int(hf.get("topk_group") or 1), "num_experts_per_tok", "topk_group")
    return {**MOE_CONSTANTS, "num_moe_experts": int(hf.get("n_routed_experts", 8)), "moe_router_topk": topk,
            "moe_ffn_hidden_size": int(hf.get("moe_intermediate_size", 7688)),
            "moe_shared_expert_intermediate_size": int(hf.get("moe_shared_expert_intermediate_size", 7688)),
            "moe_router_topk_scaling_factor": float(hf.get("routed_scaling_factor", 1.0)),
            "moe_router_num_groups": groups if groups > 1 else None,
            "moe_router_group_topk": int(hf.get("topk_group") or 1) if groups > 1 else None}


def _moe_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    moe = spec_of(cfg).moe
    if moe is None:
        return {}
    if moe.groups > 1:
        top_two_groups(moe.topk, moe.group_topk or 1, "moe_router_topk", "moe_router_group_topk")
    return {"n_routed_experts": moe.experts, "num_experts_per_tok": moe.topk, "moe_intermediate_size": moe.ffn,
            "moe_shared_expert_intermediate_size": moe.shared_ffn, "routed_scaling_factor": moe.topk_scaling,
            "n_group": moe.groups, "topk_group": moe.group_topk or 1, "norm_topk_prob": moe.topk > 1}


#: Nemotron-H's config: the GPT base's size, vocabulary, dtype and tying rows, the hybrid
#: pattern and mixer rows, and its own spellings; every other key of the published
#: configs harmless with a reason (docs/families/nemotron_h.md) or refused by name.
NEMOTRON_H_CONFIG = GPT_CONFIG.extend(
    HYBRID_PATTERN,
    *MIXER_ROWS,
    Derived(("head_dim", "attention_head_dim"), _head_dim_to_nemo, _head_dim_to_hf),
    Check(("head_dim", "attention_head_dim"), _head_dim_checks),
    Field("layer_norm_epsilon", "layernorm_epsilon", 1e-5, to_nemo=float, to_hf=float),
    activation("relu2", "squared-relu", key="mlp_hidden_act"),
    Check(("attention_bias", "mlp_bias", "sliding_window"), _no_biases),
    Derived(MOE_KEYS, _moe_to_nemo, _moe_to_hf),
    drop=("rms_norm_eps", "hidden_act", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor"),
    # rms_norm_eps, norm_eps: not read (layer_norm_epsilon is); rope_theta, partial_rotary_factor: no rotary
    # embedding is applied; hidden_dropout: dropout; num_logits_to_keep: generation
    harmless=(*MIXER_HARMLESS, "rms_norm_eps", "norm_eps", "rope_theta", "partial_rotary_factor", "hidden_dropout",
              "num_logits_to_keep"),
    nemo_constants={**HYBRID_NEMO_CONSTANTS, "activation": "squared-relu"},
)

#: The MoE block as Nemotron-H's checkpoints name it: ``mixer.gate`` (router, with
#: ``e_score_correction_bias``), ``mixer.experts.<e>.up_proj`` / ``down_proj`` (non-gated),
#: ``mixer.shared_experts`` (as saved by the checkpoints and by transformers 5.24, which
#: writes one tensor per expert).
NEMOTRON_H_MOE = MoEBlock(block="mixer", router="gate", experts="experts.{e}", up="up_proj", down="down_proj",
                          shared="shared_experts", expert_bias="gate.e_score_correction_bias", gated=False)

#: ``--to megatron-bridge``: Megatron-Bridge's ``NemotronHBridge`` (main at ``067f987d``,
#: ``src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py`` lines 233-332) builds
#: ``hybrid/hybrid_provider.HybridModelProvider`` for Megatron-Core's ``HybridModel`` (newer than
#: the 0.16.1 pinned here, whose ``MambaModel`` computes the same stack): the base bridge's fields
#: plus ``mamba_head_dim``, ``mamba_num_heads``, ``n_groups`` → ``mamba_num_groups``,
#: ``ssm_state_size`` → ``mamba_state_dim``, the pattern as ``hybrid_layer_pattern`` (lines
#: 254-268; ``hybrid_provider.py`` lines 130-131, 181-196), ``position_embedding_type: none``,
#: ``squared_relu``, ``is_hybrid_model`` (lines 294-303), sigmoid routing with the expert bias
#: and its training knobs (lines 310-318), whatever the pattern. The provider's defaults are
#: RMSNorm, no gated unit, no linear bias (``hybrid_provider.py`` lines 116-152). Its layer names
#: (lines 404-435: ``decoder.layers.{i}.mixer.*``, ``decoder.final_norm``) are our dist keys,
#: every layer unstacked as in our ``.nemo``. The experts are written with
#: ``moe_grouped_gemm: false``, the ``SequentialMLP`` whose keys and per-expert ``_extra_state``
#: our ``.nemo`` holds and Megatron-Core loads (tests/test_nemotron_h_megatron.py); the bridge
#: sets ``true`` (line 315). ``TEGroupedMLP``'s tensor keys are interchangeable with
#: ``SequentialMLP``'s (Megatron-Core 0.16.1 ``transformer/moe/experts.py`` line 773); whether its
#: ``_extra_state`` items load from ours is not checked here. Read back, the class is
#: ``MegatronMambaModel``.
MEGATRON_BRIDGE = ProviderFamily(
    HYBRID_PROVIDER, NO_LINEAR_BIAS + (
        ("normalization", "RMSNorm"), ("gated_linear_unit", False), ("position_embedding_type", "none"),
        ("activation_func", SQUARED_RELU), ("moe_shared_expert_gate", False)),
    nemo=(("target", NEMO_MAMBA_TARGET),),
    extra=(("moe_router_load_balancing_type", "seq_aux_loss"), ("moe_aux_loss_coeff", 1e-4),
           ("moe_router_dtype", "fp32"), ("moe_token_dispatcher_type", "alltoall"), ("moe_grouped_gemm", False)),
    moe=True, routing=True, shared_experts=True, hybrid=True)

NEMOTRON_H = hybrid_family(
    "nemotron_h", architecture="NemotronHForCausalLM", model_type="nemotron_h", config=NEMOTRON_H_CONFIG,
    blocks=HybridBlocks(moe=NEMOTRON_H_MOE),
    description="Nemotron-H hybrid: Mamba-2, attention, squared-ReLU MLP, MoE layers (Megatron-Core MambaModel)",
    megatron_bridge=MEGATRON_BRIDGE,
    nemo2_targets=("nemo.collections.llm.gpt.model.ssm.MambaModel",), nemo2_configs=NEMO2_CONFIGS,
)

__all__ = ["NEMOTRON_H", "NEMOTRON_H_CONFIG", "NEMOTRON_H_MOE", "PATTERN"]
