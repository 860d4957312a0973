"""The NeMo 2 config classes of ``MambaModel`` that Nemotron-H reads: ``SSMConfig`` and its
subclasses (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/ssm.py``), each class's own defaults
over those it inherits; NeMo writes only the arguments a class was called with, so an absent field
is this default. ``HFNemotronHImporter.config`` (lines 553-585) calls a sized Nemotron-H class
with no arguments (chosen by the checkpoint's name), and the ``nemotronh_*`` /
``nemotron_nano_*_v2`` / ``mamba2_*`` recipes do the same (``run.Config(llm.NemotronHConfig8B)``,
``recipes/nemotronh_8b.py`` lines 65-81): such a folder's ``model.yaml`` names the class alone.

They are read as Megatron-Bridge's ``HybridModelProvider`` (the same ``TransformerConfig``
fields; NeMo 2's ``hybrid_override_pattern`` is its older spelling of the pattern):
``SSMConfig.configure_model`` (lines 215-243) builds Megatron-Core's ``MambaModel`` from
``hybrid_override_pattern``, the ``mamba_*`` sizes (Megatron-Core 0.16.1
``transformer_config.py`` lines 843-857: head size 64, state 128, 8 groups, heads
``2 × hidden / head size`` when None) and ``position_embedding_type: none`` — the stack
``NemotronHForCausalLM`` computes. NeMo 2 stores its weights under Megatron-Core's names, the
ones our ``.nemo`` holds (``HFNemotronHImporter.convert_state``, lines 503-540: the pre-norm of
each layer fused into its first linear — ``mixer.in_proj.layer_norm_weight``,
``mlp.linear_fc1.layer_norm_weight``, ``self_attention.linear_qkv.layer_norm_weight`` — q/k/v
merged per query group, ``decoder.final_norm``, an untied ``output_layer``), under ``module.``.

* ``SSMConfig`` (lines 157-213) leaves ``activation_func`` to ``TransformerConfig``'s GeLU; a
  stack without MLP or expert layers never runs it (:func:`unused_activation`); one with them is
  refused by name (Nemotron-H's MLP is a squared ReLU): ``NVIDIAMambaHybridConfig8B``.
* ``NemotronHConfigBase`` (lines 968-987) sets ``activation_func`` to ``relu(x)**2`` (a lambda:
  Megatron-Core's ``squared_relu``), eight query groups, head size 64, vocabulary 131072.
* The pure Mamba classes (``BaseMambaConfig*``, lines 853-930, and ``NVIDIAMambaConfig8B``,
  lines 933-947: every layer ``M``) are read as an all-``M`` ``NemotronHForCausalLM``, which
  computes the same Mamba-2 layers (tests/test_nemo2_gemma3_hybrid.py).
* Not math: the tokenizer fields, ``mapping_type``, ``first_last_layers_bf16`` (FP8 recipes),
  the fusion switches and ``use_mamba_mem_eff_path``.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import HYBRID_PROVIDER, SQUARED_RELU

_SSM = "nemo.collections.llm.gpt.model.ssm."
#: ``TransformerConfig``'s activation (Megatron-Core 0.16.1 ``transformer_config.py``), which
#: ``SSMConfig`` does not change.
_GELU = "torch.nn.functional.gelu"


def unused_activation(values: dict[str, Any]) -> dict[str, Any]:
    """``SSMConfig``'s GeLU where no layer runs it (no ``-`` or ``E`` in the pattern): the
    activation of a stack without MLPs is no part of its math; otherwise it stays, and a GeLU
    MLP is refused by name (Nemotron-H's is a squared ReLU). No pattern (``SSMConfig``'s None:
    layers allocated by ratios): refused by name."""
    pattern = values.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise UnsupportedError("a NeMo 2 MambaModel config without hybrid_override_pattern (SSMConfig's None: layers "
                               "allocated by hybrid_attention_ratio / hybrid_mlp_ratio) is not read")
    fn = str(values.get("activation_func") or "").rsplit(".", 1)[-1]
    if isinstance(pattern, str) and not set(pattern) & {"-", "E"} and fn == _GELU.rsplit(".", 1)[-1]:
        return {**values, "activation_func": SQUARED_RELU}
    return dict(values)


#: ``SSMConfig`` (lines 157-213).
SSM_CONFIG: dict[str, Any] = {
    "_target_": HYBRID_PROVIDER, "_read_": unused_activation,
    "share_embeddings_and_output_weights": False, "params_dtype": {"_target_": "torch.bfloat16", "_call_": False},
    "fp16": False, "bf16": True, "num_layers": 2, "mamba_num_groups": 8, "num_attention_heads": 1,
    "hybrid_attention_ratio": 0.0, "hybrid_mlp_ratio": 0.0, "hybrid_override_pattern": None, "seq_length": 8192,
    "position_embedding_type": "none", "rotary_percent": 1.0, "rotary_base": 10000,
    "seq_len_interpolation_factor": None, "make_vocab_size_divisible_by": 128, "gated_linear_unit": False,
    "normalization": "RMSNorm", "add_bias_linear": False, "layernorm_epsilon": 1e-5, "activation_func": _GELU,
    "mamba_head_dim": 64, "mamba_state_dim": 128, "mamba_num_heads": None, "is_hybrid_model": False}


def _base_mamba(layers: int, hidden: int) -> dict[str, Any]:
    """``BaseMambaConfig*`` (lines 853-930): state-spaces' Mamba-2 sizes, one group."""
    return {**SSM_CONFIG, "hybrid_override_pattern": "M" * layers, "num_layers": layers, "seq_length": 2048,
            "hidden_size": hidden, "mamba_num_groups": 1, "ffn_hidden_size": hidden, "make_vocab_size_divisible_by": 16}


#: ``NemotronHConfigBase`` (lines 968-987).
NEMOTRON_H_BASE: dict[str, Any] = {
    **SSM_CONFIG, "seq_length": 8192, "mamba_num_groups": 8, "mamba_head_dim": 64,
    "num_query_groups": 8, "make_vocab_size_divisible_by": 128, "activation_func": SQUARED_RELU, "vocab_size": 131072,
    "is_hybrid_model": True}

_H_4B_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def _nemotron_h(pattern: str, layers: int, hidden: int, ffn: int, heads: int, **more: Any) -> dict[str, Any]:
    return {**NEMOTRON_H_BASE, "hybrid_override_pattern": pattern, "num_layers": layers, "hidden_size": hidden,
            "ffn_hidden_size": ffn, "num_attention_heads": heads, **more}


#: The classes: ``SSMConfig``, ``BaseMambaConfig130M`` … ``2_7B`` (lines 853-930),
#: ``NVIDIAMambaConfig8B`` (933-947), ``NVIDIAMambaHybridConfig8B`` (950-965),
#: ``NemotronHConfigBase`` and ``NemotronHConfig4B`` … ``56B`` (968-1043), ``NemotronNano9Bv2``
#: and ``NemotronNano12Bv2`` (1046-1073).
NEMO2_CONFIGS: dict[str, dict[str, Any] | str] = {
    _SSM + "SSMConfig": SSM_CONFIG,
    _SSM + "BaseMambaConfig130M": _base_mamba(24, 768),
    _SSM + "BaseMambaConfig370M": _base_mamba(48, 1024),
    _SSM + "BaseMambaConfig780M": _base_mamba(48, 1536),
    _SSM + "BaseMambaConfig1_3B": _base_mamba(48, 2048),
    _SSM + "BaseMambaConfig2_7B": _base_mamba(64, 2560),
    _SSM + "NVIDIAMambaConfig8B": {**SSM_CONFIG, "hybrid_override_pattern": "M" * 56, "num_attention_heads": 32,
                                   "num_layers": 56, "seq_length": 4096, "hidden_size": 4096, "mamba_num_groups": 8,
                                   "ffn_hidden_size": 4096, "make_vocab_size_divisible_by": 128},
    _SSM + "NVIDIAMambaHybridConfig8B": {
        **SSM_CONFIG, "hybrid_override_pattern": "M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M-",
        "num_layers": 56, "seq_length": 4096, "hidden_size": 4096, "mamba_num_groups": 8, "ffn_hidden_size": 16384,
        "num_attention_heads": 32, "num_query_groups": 8, "make_vocab_size_divisible_by": 128},
    _SSM + "NemotronHConfigBase": NEMOTRON_H_BASE,
    _SSM + "NemotronHConfig4B": _nemotron_h(_H_4B_8B, 52, 3072, 12288, 32, mamba_num_heads=112, kv_channels=128,
                                            mamba_state_dim=128),
    _SSM + "NemotronHConfig8B": _nemotron_h(_H_4B_8B, 52, 4096, 21504, 32, mamba_state_dim=128),
    _SSM + "NemotronHConfig47B": _nemotron_h(
        "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-",
        98, 8192, 30720, 64, mamba_state_dim=256),
    _SSM + "NemotronHConfig56B": _nemotron_h(
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
        "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", 118, 8192, 32768, 64, mamba_state_dim=256),
    _SSM + "NemotronNano9Bv2": _nemotron_h("M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", 56, 4480, 15680, 40,
                                           mamba_num_heads=128, kv_channels=128, mamba_state_dim=128, mamba_head_dim=80),
    _SSM + "NemotronNano12Bv2": _nemotron_h("M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-", 62, 5120,
                                            20480, 40, mamba_num_heads=128, kv_channels=128, mamba_state_dim=128,
                                            mamba_head_dim=80),
}
