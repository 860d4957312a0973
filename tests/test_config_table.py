"""The config table (nemo_convert.families.config_table): both directions derived from one
set of rows, strictness by name, refusals, and the two transformers spellings."""

from __future__ import annotations

import pytest

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families import GPT_CONFIG, Check, ConfigTable, Derived, Field, rope, sliding_window

TABLE = ConfigTable(
    rows=(Field("width", "hidden_size", to_nemo=int, to_hf=int),
          Field("eps", "norm.eps", 1e-5, to_nemo=float, to_hf=float),
          Field("act", "activation", "silu", to_nemo=lambda _: "fast-swiglu", to_hf=lambda _: "silu",
                accept=lambda v: v == "silu"),
          Derived(("a", "b"), lambda hf: {"ab": [hf.get("a"), hf.get("b")]},
                  lambda c: {"a": c["ab"][0], "b": c["ab"][1]}),
          Check(("window_on", "window"), lambda hf: "window_on=True" if hf.get("window_on") else None)),
    nemo_constants={"mcore_gpt": True},
    harmless=("my_token_id",),
    hf_constants={"model_type": "toy"},
)


def test_both_directions_from_one_table():
    hf = {"width": 8, "eps": 1e-6, "a": 1, "b": 2, "model_type": "toy"}
    cfg = TABLE.to_nemo(hf, "toy")
    assert cfg == {"mcore_gpt": True, "hidden_size": 8, "norm": {"eps": 1e-6}, "activation": "fast-swiglu",
                   "ab": [1, 2]}
    assert TABLE.to_hf(cfg) == {"model_type": "toy", "width": 8, "eps": 1e-6, "act": "silu", "a": 1, "b": 2}


def test_recorded_source_is_restored_in_its_own_spelling():
    hf = {"width": 8, "a": 1, "b": 2, "window": 5, "my_token_id": 3}
    cfg = TABLE.to_nemo(hf, "toy")
    cfg["nemo_convert"] = {"hf_config": dict(hf)}
    cfg["hidden_size"] = 16  # NeMo's field wins where the table derives it …
    out = TABLE.to_hf(cfg)
    # … and nothing the source did not have is added (eps, act, the Derived keys are kept verbatim)
    assert out == {"width": 16, "a": 1, "b": 2, "window": 5, "my_token_id": 3}


def test_strict_unknown_key_fails_by_name_in_one_line():
    with pytest.raises(ConfigError) as ei:
        TABLE.to_nemo({"width": 8, "sliding_window": 4096}, "toy")
    assert str(ei.value).startswith("sliding_window=4096 is not understood by family toy")
    assert "--ignore-config-key sliding_window" in str(ei.value) and "\n" not in str(ei.value)


def test_harmless_keys_pass_and_refusals_name_the_value():
    TABLE.to_nemo({"width": 8, "architectures": ["X"], "transformers_version": "5", "use_cache": True,
                   "my_token_id": 1}, "toy")
    with pytest.raises(UnsupportedError, match="act='gelu' is not supported by family toy"):
        TABLE.to_nemo({"width": 8, "act": "gelu"}, "toy")
    with pytest.raises(UnsupportedError, match="window_on=True"):
        TABLE.to_nemo({"width": 8, "window_on": True}, "toy")
    with pytest.raises(ConfigError, match="lacks required field"):
        TABLE.to_nemo({}, "toy")
    with pytest.raises(ConfigError, match="lacks hidden_size"):
        TABLE.to_hf({"mcore_gpt": True})


def test_extend_replaces_rows_of_the_same_key():
    t = TABLE.extend(Field("eps", "norm.eps", 1e-6, to_nemo=float), harmless=("x",))
    assert t.to_nemo({"width": 1}, "toy")["norm"]["eps"] == 1e-6
    assert "x" in t.understood() and "x" not in TABLE.understood()
    assert "eps" not in TABLE.extend(drop=("eps",)).understood()


V4 = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
      "vocab_size": 128, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
      "rope_scaling": {"type": "linear", "factor": 2.0}}
V5 = {**{k: v for k, v in V4.items() if k not in ("rope_theta", "torch_dtype", "rope_scaling")},
      "dtype": "bfloat16", "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}}


def test_v4_and_v5_spellings_translate_alike():
    table = GPT_CONFIG.extend(rope("linear"))
    a, b = table.to_nemo(V4, "t"), table.to_nemo(V5, "t")
    assert a == b
    assert a["rotary_base"] == 500000.0 and a["seq_len_interpolation_factor"] == 2.0 and a["precision"] == "bf16"
    assert table.to_hf({**a, "nemo_convert": {**a["nemo_convert"], "hf_config": V5}}) == V5
    assert table.to_hf({**a, "nemo_convert": {**a["nemo_convert"], "hf_config": V4}}) == V4
    synthesised = table.to_hf(a)
    assert synthesised["rope_theta"] == 500000.0 and synthesised["rope_scaling"]["factor"] == 2.0
    assert synthesised["torch_dtype"] == "bfloat16"


def test_rope_types_not_representable_are_refused():
    with pytest.raises(UnsupportedError, match="'yarn'"):
        GPT_CONFIG.to_nemo({**V5, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "t")
    with pytest.raises(UnsupportedError, match="'linear'"):
        GPT_CONFIG.to_nemo(V4, "t")  # the base accepts plain RoPE only


def test_sliding_window_is_w_minus_one_and_back():
    table = GPT_CONFIG.extend(sliding_window())
    cfg = table.to_nemo({**V5, "rope_parameters": {"rope_theta": 1.0}, "sliding_window": 4096}, "t")
    assert cfg["window_size"] == [4095, 0] and cfg["nemo_convert"]["sliding_window"] == 4096
    assert table.to_hf(cfg)["sliding_window"] == 4096
    del cfg["nemo_convert"]["sliding_window"]
    cfg["window_size"] = [4096, 0]  # NeMo's importer's convention
    assert table.to_hf(cfg)["sliding_window"] == 4096


def test_dense_first_experts_both_ways_and_refusals():
    """``first_k_dense_replace`` dense layers, then experts with shared ones (DeepSeek-style
    keys) ⇄ Megatron's per-layer ``moe_layer_freq`` and shared size; what the HF class cannot
    say is refused by name, each way."""
    from nemo_convert.families import dense_first_experts

    row = dense_first_experts(GLM)
    hf = {"num_hidden_layers": 4, "n_routed_experts": 8, "moe_intermediate_size": 16, "n_shared_experts": 2,
          "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4}
    cfg = row.to_nemo(hf)
    assert cfg == {"num_moe_experts": 8, "moe_ffn_hidden_size": 16, "moe_shared_expert_intermediate_size": 32,
                   "moe_layer_freq": [0, 1, 1, 1], "moe_router_num_groups": 4, "moe_router_group_topk": 2}
    nemo = {**cfg, "num_layers": 4, "hidden_size": 8, "num_attention_heads": 2, "moe_router_topk": 4}
    assert row.to_hf(nemo) == {k: hf[k] for k in row.hf_keys}
    # the class's defaults (GLM-4.5: one dense layer, one shared expert) when the keys are absent
    plain = row.to_nemo({"num_hidden_layers": 2, "n_routed_experts": 4, "moe_intermediate_size": 16})
    assert (plain["moe_layer_freq"], plain["moe_shared_expert_intermediate_size"]) == ([0, 1], 16)
    assert row.to_nemo({**hf, "first_k_dense_replace": 0})["moe_layer_freq"] == 1
    with pytest.raises(UnsupportedError, match="num_nextn_predict_layers=1 with first_k_dense_replace=4"):
        row.to_nemo({**hf, "first_k_dense_replace": 4, "num_nextn_predict_layers": 1})
    with pytest.raises(UnsupportedError, match=r"moe_layer_freq=\[0, 1, 0, 1\]: a dense layer after an MoE one"):
        row.to_hf({**nemo, "moe_layer_freq": [0, 1, 0, 1]})
    with pytest.raises(UnsupportedError, match="moe_shared_expert_intermediate_size=24 is not a multiple"):
        row.to_hf({**nemo, "moe_shared_expert_intermediate_size": 24})


#: ``Glm4MoeConfig``'s defaults (transformers 5.25.0 ``configuration_glm4_moe.py`` lines 102-110).
GLM = {"n_routed_experts": 128, "moe_intermediate_size": 1408, "n_shared_experts": 1, "first_k_dense_replace": 1,
       "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8}


def test_dense_first_experts_absent_and_null_keys():
    """An absent key is the class's default (every one of them: a config may say only the
    layers), an explicit null is none (no dense layer, no shared expert, one group); a null
    size is refused by name, and a declaration without a default for a key fails at once."""
    from nemo_convert.families import dense_first_experts

    row = dense_first_experts({**GLM, "n_group": 8, "topk_group": 4})
    cfg = row.to_nemo({"num_hidden_layers": 3})
    assert cfg == {"num_moe_experts": 128, "moe_ffn_hidden_size": 1408, "moe_shared_expert_intermediate_size": 1408,
                   "moe_layer_freq": [0, 1, 1], "moe_router_num_groups": 8, "moe_router_group_topk": 4}
    nulls = row.to_nemo({"num_hidden_layers": 3, "first_k_dense_replace": None, "n_shared_experts": None,
                         "n_group": None, "topk_group": None})
    assert (nulls["moe_layer_freq"], nulls["moe_shared_expert_intermediate_size"], nulls["moe_router_num_groups"],
            nulls["moe_router_group_topk"]) == (1, None, None, None)
    with pytest.raises(ConfigError, match="config.json moe_intermediate_size=None"):
        row.to_nemo({"num_hidden_layers": 3, "moe_intermediate_size": None})
    with pytest.raises(TypeError, match="no class default for n_group, topk_group, num_experts_per_tok"):
        dense_first_experts({k: GLM[k] for k in ("n_routed_experts", "moe_intermediate_size", "n_shared_experts",
                                                 "first_k_dense_replace")})


def test_dense_first_experts_groups_off_leaves_the_group_keys():
    """``groups=False`` (DeepSeek-V2, whose groups depend on ``topk_method``): the row neither
    reads nor writes ``n_group`` / ``topk_group``, and needs no top-k default."""
    from nemo_convert.families import dense_first_experts

    row = dense_first_experts({k: GLM[k] for k in ("n_routed_experts", "moe_intermediate_size", "n_shared_experts",
                                                   "first_k_dense_replace")}, groups=False)
    assert row.hf_keys == ("n_routed_experts", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace")
    cfg = row.to_nemo({"num_hidden_layers": 2, "n_group": 8, "topk_group": 3, "first_k_dense_replace": 0})
    assert cfg == {"num_moe_experts": 128, "moe_ffn_hidden_size": 1408, "moe_shared_expert_intermediate_size": 1408,
                   "moe_layer_freq": 1}
    nemo = {**cfg, "num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "moe_router_topk": 2,
            "moe_router_num_groups": 4, "moe_router_group_topk": 2}
    assert row.to_hf(nemo) == {"n_routed_experts": 128, "moe_intermediate_size": 1408, "n_shared_experts": 1,
                               "first_k_dense_replace": 0}


@pytest.mark.parametrize("topk, keep, ok", [(8, 4, True), (4, 2, True), (5, 2, True), (6, 2, False), (4, 4, False),
                                            (2, 2, False)])
def test_dense_first_experts_groups_need_the_top_two_sum(topk, keep, ok):
    """The HF classes score a group by the sum of its two best experts, Megatron-Core by its
    best ``topk // group_topk``: only a quotient of 2 is the same routing, each way (one
    group routes as none and is always accepted)."""
    from nemo_convert.families import dense_first_experts

    row = dense_first_experts(GLM)
    hf = {"num_hidden_layers": 2, "n_routed_experts": 16, "n_group": 4, "topk_group": keep, "num_experts_per_tok": topk}
    nemo = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "num_moe_experts": 16, "moe_ffn_hidden_size": 8,
            "moe_layer_freq": [0, 1], "moe_router_topk": topk, "moe_router_num_groups": 4, "moe_router_group_topk": keep}
    if ok:
        assert row.to_nemo(hf)["moe_router_group_topk"] == keep
        assert row.to_hf(nemo)["topk_group"] == keep
    else:
        with pytest.raises(UnsupportedError, match=f"num_experts_per_tok={topk} with topk_group={keep}: the HF class"):
            row.to_nemo(hf)
        with pytest.raises(UnsupportedError, match=f"moe_router_topk={topk} with moe_router_group_topk={keep}"):
            row.to_hf(nemo)
    assert row.to_nemo({**hf, "n_group": 1})["moe_router_num_groups"] is None
