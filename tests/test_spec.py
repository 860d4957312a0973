"""The typed model spec (``nemo_convert/spec/``): the one reading of a NeMo config, NeMo's
defaults, our side channels, and the comparison that export's architecture check and the
family choice use.

The spec of every family's own NeMo config (written by its HF table from the family
matrix's ``config.json``) says what that family computes; the comparison covers every
field of the spec except the ones :data:`~nemo_convert.spec.NOT_COMPARED` names."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest

from nemo_convert.errors import ConfigError
from nemo_convert.plugins.manager import get_registry
from nemo_convert.spec import (LLAMA3_DEFAULTS, MLA, NOT_COMPARED, Llama3Scaling, ModelSpec, MoE, YarnScaling,
                               dtype_name_of_flags, dtype_name_of_precision, first_difference,
                               precision_of_dtype_name, provenance_of, spec_of, window_pattern)
from nemo_convert.spec import model as spec_model

BASE = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}


# ------------------------------------------------------------------ NeMo's defaults, once
def test_nemo_defaults_apply_to_an_absent_field():
    s = spec_of(BASE)
    assert s.positions == "learned_absolute" and s.rope is None
    assert (s.norm.kind, s.norm.zero_centred, s.norm.eps) == ("layernorm", False, 1e-5)
    assert (s.mlp.gated, s.mlp.activation) == (False, "gelu_tanh")  # gelu under NeMo's default fusion
    assert (s.geometry.query_groups, s.geometry.head_dim) == (4, 16)  # nulls: heads, hidden / heads
    assert s.attention.window is None and s.moe is None and s.mtp_layers == 0 and s.precision == "float32"


def test_kv_channels_and_groups_given():
    g = spec_of({**BASE, "kv_channels": 32, "num_query_groups": 2}).geometry
    assert (g.head_dim, g.query_groups) == (32, 2)


@pytest.mark.parametrize("edit, words", [
    ({"num_layers": None}, "lacks num_layers"),
    ({"num_layers": "x"}, "num_layers='x', not an integer"),
    ({"hidden_size": True}, "hidden_size=True, not an integer"),
    ({"layernorm_epsilon": "tiny"}, "layernorm_epsilon='tiny', not a number"),
])
def test_a_config_that_is_not_one_is_a_config_error(edit, words):
    cfg = {**BASE, **edit}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ConfigError, match=words):
        spec_of(cfg)


# ------------------------------------------------------------------ our side channels, once
@pytest.mark.parametrize("fields, want", [
    ({}, (False, False, False)),
    ({"bias": True}, (True, True, True)),
    ({"qkv_bias": True}, (True, False, False)),
    ({"nemo_convert": {"linear_biases": {"attention": True, "mlp": False}}, "bias": False}, (True, True, False)),
    ({"nemo_convert": {"linear_biases": {"qkv": True, "proj": False, "mlp": False}}}, (True, False, False)),
    ({"nemo_convert": {"linear_biases": {"attention": False, "mlp": True}}, "qkv_bias": True}, (False, False, True)),
])
def test_linear_biases(fields, want):
    s = spec_of({**BASE, **fields})
    assert (s.attention.qkv_bias, s.attention.proj_bias, s.mlp.bias) == want


@pytest.mark.parametrize("fields, want", [
    ({"window_size": [3, 0], "nemo_convert": {"sliding_window": 4}}, (4, 0)),  # ours: [W-1, 0] and the record
    ({"window_size": [4096, 0]}, (4096, 0)),  # NeMo's importer: [W, 0] read as W keys
    ({"window_size": [-1, 0]}, (None, 0)),  # no window
    ({"window_size": [7, 2]}, (7, 2)),  # not causal: kept, and compared
    ({}, (None, 0)),
])
def test_window_conventions(fields, want):
    a = spec_of({**BASE, **fields}).attention
    assert (a.window, a.window_lookahead) == want


def test_window_pattern_int_and_list():
    """Megatron-Core's ``window_attn_skip_freq``: an int N windows layer n (1-based) unless
    n % N == 0; a list is per layer."""
    assert window_pattern(2, 4) == (True, False, True, False)
    assert window_pattern([1, 0], 2) == (True, False)
    assert window_pattern(None, 3) is None
    with pytest.raises(ConfigError):
        window_pattern("x", 2)


def test_rope_scalings_and_llama3_defaults():
    llama3 = spec_of({**BASE, "position_embedding_type": "rope", "scale_positional_embedding": True,
                      "scale_factor": 32.0}).rope
    assert llama3 is not None and llama3.scaling == dataclasses.replace(LLAMA3_DEFAULTS, factor=32.0)
    both = spec_of({**BASE, "position_embedding_type": "rope", "scale_positional_embedding": True,
                    "seq_len_interpolation_factor": 2.0}).rope
    assert both is not None and both.interpolation == 2.0 and isinstance(both.scaling, Llama3Scaling)
    gpt_yarn = spec_of({**BASE, "position_embedding_type": "yarn", "yarn_rotary_scaling_factor": 32.0,
                        "yarn_original_max_position_embeddings": 4096, "yarn_correction_range_round_to_int": False})
    assert gpt_yarn.rope is not None and gpt_yarn.rope.scaling == YarnScaling(32.0, 4096, None, None, None, None, False)
    mla = {**BASE, "position_embedding_type": "rope", "multi_latent_attention": True, "kv_lora_rank": 16}
    assert spec_of(mla).rope.scaling is None  # type: ignore[union-attr]  # our MLA configs: no rope_type = plain
    mla_yarn = spec_of({**mla, "rope_type": "yarn", "rotary_scaling_factor": 40.0}).rope
    assert mla_yarn is not None and mla_yarn.scaling == YarnScaling(40.0, None, None, None, 1.0, 0.0, True)


def test_experts_and_provenance():
    cfg = {**BASE, "ffn_hidden_size": 96, "num_moe_experts": 4, "moe_layer_freq": [0, 1],
           "nemo_convert": {"hf_experts": "fused", "hf_mtp": {"absent": 1}, "family": "x", "hf_config": {"a": 1},
                            "ignored_config_keys": ["k"]}}
    s = spec_of(cfg)
    assert s.moe == MoE(experts=4, topk=2, ffn=96, layer_pattern=(False, True))
    p = provenance_of(cfg)
    assert (p.hf_experts, p.mtp_absent, p.mtp_dropped, p.family, p.hf_config, p.ignored_config_keys) == (
        "fused", 1, 0, "x", {"a": 1}, ("k",))
    assert provenance_of({}).hf_experts == "per_expert"


def test_precision_spellings():
    assert [dtype_name_of_precision(p) for p in ("bf16", "bf16-mixed", 16, "16-mixed", 32, "32-true", None)] == [
        "bfloat16", "bfloat16", "float16", "float16", "float32", "float32", "float32"]
    assert [precision_of_dtype_name(n) for n in ("bfloat16", "float16", "float32", "torch.bfloat16")] == [
        "bf16", 16, 32, 32]
    assert dtype_name_of_flags(True, False, None) == "bfloat16"
    assert dtype_name_of_flags(False, False, "torch.float16") == "float16"
    assert dtype_name_of_flags(None, None, None) == "float32"


# ------------------------------------------------------------------ the comparison covers the spec
def _full_spec() -> ModelSpec:
    """A spec whose optional records are all present (every leaf field reachable)."""
    cfg = {**BASE, "ffn_hidden_size": 96, "position_embedding_type": "rope", "scale_positional_embedding": True,
           "seq_len_interpolation_factor": 2.0, "multi_latent_attention": True, "kv_lora_rank": 8, "q_lora_rank": 8,
           "qk_head_dim": 8, "qk_pos_emb_head_dim": 4, "v_head_dim": 8, "num_moe_experts": 4,
           "moe_router_num_groups": 2, "moe_router_group_topk": 1, "window_size": [3, 0],
           "window_attn_skip_freq": [1, 0], "activation_func_clamp_value": 7.0, "mtp_num_layers": 1,
           "nemo_convert": {"vocab_size": 128}, "max_position_embeddings": 64}
    return spec_of(cfg)


def _leaves(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = prefix + f.name
        if dataclasses.is_dataclass(value):
            out += _leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return (*value, True)
    return 1 if value is None else None


def _replace_path(obj: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(obj, **{head: value})
    return dataclasses.replace(obj, **{head: _replace_path(getattr(obj, head), rest, value)})


def test_every_spec_field_is_compared_or_named_as_not():
    """Changing any one leaf of a spec is a difference, unless :data:`NOT_COMPARED` names it:
    the architecture comparison is spec equality on the architecture."""
    spec = _full_spec()
    leaves = _leaves(spec)
    assert len(leaves) > 50
    for path, value in leaves:
        other = _replace_path(spec, path, _changed(value))
        diff = first_difference(spec, other)
        if path in NOT_COMPARED:
            assert diff is None, path
        else:
            assert diff is not None, f"{path} is neither compared nor in NOT_COMPARED"
    assert set(NOT_COMPARED) <= {p for p, _ in leaves}


def test_the_records_are_frozen_and_typed():
    spec = _full_spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.geometry.layers = 3  # type: ignore[misc]
    for cls in (ModelSpec, MLA, MoE, YarnScaling, Llama3Scaling):
        hints = typing.get_type_hints(cls, vars(spec_model))
        assert all(hints[f.name] is not Any for f in dataclasses.fields(cls)), cls


# ------------------------------------------------------------------ every family's own config
SPEC_OF_FAMILY: dict[str, dict[str, Any]] = {
    "llama": {"attention.qkv_bias": True, "attention.proj_bias": True, "mlp.bias": True, "mlp.activation": "silu"},
    "mistral": {"attention.window": 4, "attention.qkv_bias": False},
    "qwen2": {"attention.qkv_bias": True, "attention.proj_bias": False, "mlp.bias": False},
    "qwen3": {"attention.qk_norm": True, "geometry.head_dim": 32},
    "gemma": {"norm.zero_centred": True, "mlp.activation": "gelu_tanh", "embedding.scaled": True,
              "embedding.tied": True},
    "phi3": {"attention.window": 4, "rope.fraction": 0.5},
    "mixtral": {"moe.experts": 4, "moe.ffn": 96, "attention.window": 4, "moe.pre_softmax": False},
    "qwen3_moe": {"moe.ffn": 48, "attention.qk_norm": True},
    "qwen2_moe": {"moe.shared_ffn": 80, "moe.shared_gate": True, "attention.qkv_bias": True},
    "deepseek_v2": {"moe.layer_pattern": (False, True, True, True), "moe.score_function": "softmax",
                    "moe.pre_softmax": True, "moe.expert_bias": False, "moe.topk_scaling": 1.5, "moe.groups": 4,
                    "moe.group_topk": 2, "moe.shared_ffn": 96, "attention.mla.q_lora_rank": None, "mtp_layers": 0},
    "deepseek_v3": {"moe.layer_pattern": (False, True, True, True), "moe.score_function": "sigmoid",
                    "moe.expert_bias": True, "moe.topk_scaling": 2.5, "attention.mla.q_lora_rank": 32,
                    "mtp_layers": 1},
    "gpt_oss": {"attention.softmax": "learnable", "attention.window": 8, "attention.window_pattern": (True, False),
                "mlp.glu_offset": 1.0, "mlp.clamp": 0.5, "mlp.activation": "quick_gelu", "rope.theta": 150000.0},
    "nemotron": {"norm.kind": "layernorm", "norm.zero_centred": True, "mlp.activation": "squared_relu",
                 "mlp.gated": False, "rope.fraction": 0.5},
    "gpt2": {"positions": "learned_absolute", "rope": None, "mlp.activation": "gelu_tanh", "embedding.tied": True},
}


def _get(spec: Any, path: str) -> Any:
    for part in path.split("."):
        spec = getattr(spec, part)
    return spec


@pytest.mark.parametrize("family", sorted(SPEC_OF_FAMILY))
def test_each_familys_config_reads_as_what_it_computes(family):
    """The family matrix's ``config.json`` through the family's own table: the spec of the
    NeMo config it writes, and the family's check accepts that config (it computes it)."""
    import transformers
    from test_family_matrix import BASE as HF_BASE
    from test_family_matrix import BASE_OF, FAMILIES

    cls_name, extra, _, _ = FAMILIES[family]
    hf = json.loads(getattr(transformers, cls_name)(**{**BASE_OF.get(family, HF_BASE), **extra}).to_json_string())
    fam = get_registry().family(family)
    cfg = fam.config_to_nemo(hf)
    spec = spec_of(cfg)
    for path, want in SPEC_OF_FAMILY[family].items():
        assert _get(spec, path) == want, (family, path)
    assert fam.refuses_nemo_config is not None and fam.refuses_nemo_config(cfg) is None
