"""Nemotron-H (``NemotronHForCausalLM``) ⇄ Megatron-Core's hybrid ``MambaModel``: the
published configs translated key by key, tiny random checkpoints made from them
(``tests/tiny_hybrid.py``: the dense Nemotron-H-8B and the MoE Nemotron-3 Nano, shrunk in
size only) round-tripped bit-exactly through every layout, TP2×PP2 (and EP2), with
transformers' logits unchanged; what Megatron-Core's mixer cannot compute refused by name.
Megatron-Core itself loads the output in ``tests/test_nemotron_h_megatron.py``."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import torch
import yaml
from test_family_matrix import IDS, assert_same, logits
from test_megatron_dirs import bridge_round_trip
from tiny_hybrid import CONFIGS, MCORE_KEYS, make_nemotron_h, published
from tiny_models import read_json

from nemo_convert import api
from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.plugins.manager import get_registry

__all__ = ["IDS", "assert_same", "logits"]  # (the family matrix's: tests/test_nemotron_h_megatron.py imports them here)


def family():  # noqa: ANN201
    return get_registry().families["nemotron_h"].record


@pytest.fixture(scope="module")
def models(tmp_path_factory):  # noqa: ANN001, ANN201
    root = tmp_path_factory.mktemp("nemotron_h")
    return {name: make_nemotron_h(str(root / name), name) for name in CONFIGS}


# -- the published configs, key by key ---------------------------------------------------


def stored_keys(name: str, path: str) -> tuple[dict, dict[str, list[int]], set[str]]:
    """Megatron-Core's record for ``name`` (``tests/data/megatron_core_keys/``), and the dist
    checkpoint at ``path``: each tensor key's global shape, and the keys of its extra states."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    with open(MCORE_KEYS.format(name=name), encoding="utf-8") as f:
        record = json.load(f)
    ck = DistCheckpointSource.from_dir(path)
    try:
        return (record, {k: list(ck._raw[k][0]) for k in ck.raw_keys()},
                {k.split("/shard_")[0] for k in ck.extra_state_keys})
    finally:
        ck.close()


def test_published_configs_translate_every_key() -> None:
    """Both published configs import whole (every key translated, checked or harmless) into
    the fields Megatron-Core's MambaModel reads, and export gives them back unchanged."""
    dense = family().config_to_nemo(published("nemotron_h_8b"))
    assert dense["hybrid_override_pattern"] == "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    assert {k: dense[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                  "num_query_groups", "kv_channels", "mamba_num_heads", "mamba_head_dim",
                                  "mamba_state_dim", "mamba_num_groups", "layernorm_epsilon")} == dict(
        num_layers=52, hidden_size=4096, ffn_hidden_size=21504, num_attention_heads=32, num_query_groups=8,
        kv_channels=128, mamba_num_heads=128, mamba_head_dim=64, mamba_state_dim=128, mamba_num_groups=8,
        layernorm_epsilon=1e-5)
    assert (dense["activation"], dense["position_embedding_type"], dense["normalization"]) == (
        "squared-relu", "none", "rmsnorm")
    assert "num_moe_experts" not in dense and dense["precision"] == "bf16"
    moe = family().config_to_nemo(published("nemotron_3_nano"))
    assert moe["hybrid_override_pattern"].count("E") == 23 and moe["num_layers"] == 52
    assert {k: moe[k] for k in ("num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                                "moe_shared_expert_intermediate_size", "moe_router_topk_scaling_factor",
                                "moe_router_score_function", "moe_router_enable_expert_bias", "kv_channels",
                                "mamba_num_heads")} == dict(
        num_moe_experts=128, moe_router_topk=6, moe_ffn_hidden_size=1856, moe_shared_expert_intermediate_size=3712,
        moe_router_topk_scaling_factor=2.5, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        kv_channels=128, mamba_num_heads=64)
    for name, cfg in (("nemotron_h_8b", dense), ("nemotron_3_nano", moe)):
        cfg["nemo_convert"] = {"hf_config": published(name)}
        assert family().config_to_hf(cfg) == published(name)


@pytest.mark.parametrize("name, change, words", [
    ("nemotron_h_8b", dict(conv_kernel=3), "conv_kernel=3"),
    ("nemotron_h_8b", dict(use_conv_bias=False), "use_conv_bias=False"),
    ("nemotron_h_8b", dict(mamba_hidden_act="gelu"), "mamba_hidden_act='gelu'"),
    ("nemotron_h_8b", dict(mamba_proj_bias=True), "mamba_proj_bias=True"),
    ("nemotron_h_8b", dict(use_bias=True), "use_bias=True"),
    ("nemotron_h_8b", dict(residual_in_fp32=True), "residual_in_fp32=True"),
    ("nemotron_h_8b", dict(layer_norm_epsilon=1e-6), "layer_norm_epsilon=1e-06"),
    ("nemotron_h_8b", dict(time_step_limit=[0.0, 0.1]), "time_step_limit=[0.0, 0.1]"),
    ("nemotron_h_8b", dict(attention_bias=True), "attention_bias=True"),
    ("nemotron_h_8b", dict(mlp_hidden_act="silu"), "mlp_hidden_act='silu'"),
    ("nemotron_h_8b", dict(attention_head_dim=64), "attention_head_dim=64 without head_dim"),
    ("nemotron_h_8b", dict(num_hidden_layers=51), "num_hidden_layers=51 but the layer pattern has 52"),
    ("nemotron_h_8b", dict(hybrid_override_pattern="M-M|M*"), "symbols must be M, *, -, E"),
    ("nemotron_3_nano", dict(moe_latent_size=1024), "moe_latent_size=1024"),
    ("nemotron_3_nano", dict(num_nextn_predict_layers=1), "num_nextn_predict_layers=1"),
    ("nemotron_3_nano", dict(norm_topk_prob=False), "norm_topk_prob=False with num_experts_per_tok=6"),
    ("nemotron_3_nano", dict(sliding_window=4096), "sliding_window=4096"),
    ("nemotron_3_nano", {"n_group": 8, "topk_group": 1}, "num_experts_per_tok=6 with topk_group=1: the HF class scores"),
    ("nemotron_3_nano", dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling="),
])
def test_what_megatron_core_does_not_compute_is_refused_by_name(name: str, change: dict, words: str) -> None:
    with pytest.raises((ConfigError, UnsupportedError)) as ei:
        family().config_to_nemo({**published(name), **change})
    assert words in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def test_expert_groups_translate_only_where_both_sides_score_them_alike() -> None:
    """``NemotronHTopkRouter`` scores a group by the sum of its two best experts, Megatron-Core
    by its best ``topk // group_topk``: 6 experts from 3 of 8 groups (2 each) translate, both
    ways; 6 from 1 group (Megatron-Core would sum 6) is refused by name, both ways."""
    cfg = family().config_to_nemo({**published("nemotron_3_nano"), "n_group": 8, "topk_group": 3})
    assert (cfg["moe_router_num_groups"], cfg["moe_router_group_topk"]) == (8, 3)
    cfg.pop("nemo_convert", None)
    hf = family().config_to_hf({**cfg, "nemo_convert": {"vocab_size": 131072}})
    assert (hf["n_group"], hf["topk_group"], hf["num_experts_per_tok"]) == (8, 3, 6)
    with pytest.raises(UnsupportedError, match="moe_router_topk=6 with moe_router_group_topk=1: the HF class"):
        family().config_to_hf({**cfg, "moe_router_group_topk": 1, "nemo_convert": {"vocab_size": 131072}})


def test_harmless_keys_are_init_or_inference_only() -> None:
    """The keys declared harmless change nothing Megatron-Core computes: with any value they
    translate to the same NeMo config."""
    base = family().config_to_nemo(published("nemotron_3_nano"))
    changed = family().config_to_nemo({**published("nemotron_3_nano"), "time_step_min": 0.01, "time_step_max": 0.2,
                                       "time_step_floor": 1e-3, "rescale_prenorm_residual": False, "chunk_size": 256,
                                       "expand": 4, "mamba_ssm_cache_dtype": "bfloat16", "rope_theta": 500000,
                                       "norm_eps": 1e-6, "rms_norm_eps": 1e-6, "use_mamba_kernels": False,
                                       "time_step_limit": [0.0, float("inf")]})
    assert changed == base


# -- tiny checkpoints: round trips -------------------------------------------------------

@pytest.mark.parametrize("layout", ["dist", "legacy"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_roundtrip_bit_exact(tmp_path, models, name, layout) -> None:  # noqa: ANN001
    src = models[name]
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    assert api.import_hf(src, nemo, layout=layout).family == "nemotron_h"
    api.export_hf(nemo, back)
    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))
    assert api.verify(src, nemo).ok


@pytest.mark.slow  # several conversions and transformers runs
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reshard_tp2_pp2_and_back(tmp_path, models, name) -> None:  # noqa: ANN001
    """Legacy rank files at TP2×PP2: the mixer's in_proj and conv1d split by sections,
    A_log / D / dt_bias by head, the gated norm by group; merged back bit-exactly."""
    src = models[name]
    nemo, ranks, back = str(tmp_path / "m.nemo"), str(tmp_path / "r"), str(tmp_path / "back")
    api.import_hf(src, nemo)
    api.reshard(nemo, ranks, tp=2, pp=2, layout="legacy", packed=False)
    assert sorted(os.listdir(ranks)) == sorted(["model_config.yaml", "tp_rank_00_pp_rank_000",
                                               "tp_rank_00_pp_rank_001", "tp_rank_01_pp_rank_000",
                                               "tp_rank_01_pp_rank_001"])
    api.export_hf(ranks, back)
    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))


def test_rank_files_hold_megatrons_local_sections(tmp_path, models) -> None:  # noqa: ANN001
    """TP rank 1's in_proj is [z_1; x_1; B_1; C_1; dt_1] (each section's second half),
    its conv1d [x_1; B_1; C_1], A_log its heads: Megatron-Core's local module tensors
    (``mamba_mixer.py`` lines 249–292)."""
    from safetensors.torch import load_file

    src = models["nemotron_h_8b"]
    hf = load_file(os.path.join(src, "model.safetensors"))
    ranks = str(tmp_path / "r")
    api.import_hf(src, ranks, layout="legacy", parallel=api.Parallelism(tp=2), packed=False)
    rank1 = torch.load(os.path.join(ranks, "mp_rank_01", "model_weights.ckpt"), weights_only=True)
    got = rank1["model.decoder.layers.0.mixer.in_proj.weight"]
    w = hf["backbone.layers.0.mixer.in_proj.weight"]  # [z 64; x 64; B 32; C 32; dt 8]
    assert torch.equal(got, torch.cat([w[32:64], w[96:128], w[144:160], w[176:192], w[196:200]]))
    conv = hf["backbone.layers.0.mixer.conv1d.weight"]  # [x 64; B 32; C 32]
    assert torch.equal(rank1["model.decoder.layers.0.mixer.conv1d.weight"],
                       torch.cat([conv[32:64], conv[80:96], conv[112:128]]))
    assert torch.equal(rank1["model.decoder.layers.0.mixer.A_log"], hf["backbone.layers.0.mixer.A_log"][4:])
    assert torch.equal(rank1["model.decoder.layers.0.mixer.norm.weight"], hf["backbone.layers.0.mixer.norm.weight"][32:])
    assert torch.equal(rank1["model.decoder.layers.0.mixer.out_proj.weight"],
                       hf["backbone.layers.0.mixer.out_proj.weight"][:, 32:])


@pytest.mark.slow  # several conversions and transformers runs
def test_moe_rank_files_to_dist_at_ep2(tmp_path, models) -> None:  # noqa: ANN001
    """TP2×PP2 rank files straight from HF, then a dist checkpoint recording TP2×PP2×EP2
    (EP splits nothing in a dist checkpoint): both hold the source, tensor for tensor."""
    src = models["nemotron_3_nano"]
    ranks, dist = str(tmp_path / "ranks"), str(tmp_path / "dist")
    api.import_hf(src, ranks, layout="legacy", parallel=api.Parallelism(tp=2, pp=2), packed=False)
    assert api.verify(src, ranks).ok
    api.reshard(ranks, dist, tp=2, pp=2, ep=2, layout="dist", packed=False)
    with open(os.path.join(dist, "model_config.yaml")) as f:
        recorded = yaml.safe_load(f)
    assert [recorded[f"{k}_model_parallel_size"] for k in ("tensor", "pipeline", "expert")] == [2, 2, 2]
    assert api.verify(src, dist).ok


def test_dist_keys_are_megatron_cores_per_layer_sections(tmp_path, models) -> None:  # noqa: ANN001
    """Every layer keyed by its index (``MambaStack.sharded_state_dict``), the mixer's
    in_proj and conv1d as section keys with TP-global shapes, the extra states Megatron-Core
    asks for (checked against its own sharded_state_dict in test_nemotron_h_megatron.py)."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    nemo = str(tmp_path / "m")
    api.import_hf(models["nemotron_3_nano"], nemo, packed=False)
    ck = DistCheckpointSource.from_dir(os.path.join(nemo, "model_weights"))
    try:
        raw = {k: v[0] for k, v in ck._raw.items()}
        assert {k: raw[f"model.decoder.layers.0.mixer.{k}"] for k in (
            "in_proj.weight.z", "in_proj.weight.x", "in_proj.weight.B", "in_proj.weight.C", "in_proj.weight.dt",
            "conv1d.weight.x", "conv1d.weight.B", "conv1d.bias.C", "A_log", "norm.weight",
            "in_proj.layer_norm_weight")} == {
            "in_proj.weight.z": (64, 64), "in_proj.weight.x": (64, 64), "in_proj.weight.B": (32, 64),
            "in_proj.weight.C": (32, 64), "in_proj.weight.dt": (8, 64), "conv1d.weight.x": (64, 1, 4),
            "conv1d.weight.B": (32, 1, 4), "conv1d.bias.C": (32,), "A_log": (8,), "norm.weight": (64,),
            "in_proj.layer_norm_weight": (64,)}
        assert "model.decoder.layers.0.mixer.in_proj.weight" not in raw
        assert raw["model.decoder.layers.1.mlp.experts.experts.linear_fc1.weight"] == (4, 32, 64)
        assert raw["model.decoder.final_norm.weight"] == (64,)
        extra = set(ck.extra_state_keys)
        assert {"model.decoder.layers.0.mixer.in_proj._extra_state/shard_0_1",
                "model.decoder.layers.0.mixer.out_proj._extra_state/shard_0_1",
                "model.decoder.layers.1.mlp.experts.experts.linear_fc2._extra_state/shard_3_4",
                "model.decoder.layers.3.self_attention.linear_qkv._extra_state/shard_0_1",
                "model.output_layer._extra_state/shard_0_1"} <= extra
    finally:
        ck.close()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dist_checkpoint_holds_exactly_what_megatron_cores_mamba_model_asks_for(tmp_path, models, name) -> None:  # noqa: ANN001
    """Our dist checkpoint's tensor keys and global shapes are exactly those Megatron-Core
    0.16.1's ``MambaModel.sharded_state_dict()`` asks for, and it holds every extra state it
    asks for: the record in ``tests/data/megatron_core_keys/`` that the slow
    ``tests/test_nemotron_h_megatron.py`` takes from Megatron-Core itself (and re-checks
    there). The extra states beyond it are the ``core_attention`` ones of Transformer
    Engine's spec, which the CPU test's local spec does not build."""
    nemo = str(tmp_path / "m")
    api.import_hf(models[name], nemo, packed=False, layout="dist")
    record, ours, extra = stored_keys(name, os.path.join(nemo, "model_weights"))
    assert record["megatron_core"] == "0.16.1"
    theirs = record["tensors"]
    assert ours == theirs, (sorted(set(ours) ^ set(theirs)),
                            {k: (ours[k], theirs[k]) for k in set(ours) & set(theirs) if ours[k] != theirs[k]})
    assert set(record["extra_states"]) <= extra, sorted(set(record["extra_states"]) - extra)
    assert all(k.endswith(".core_attention._extra_state") for k in extra - set(record["extra_states"]))


def test_transformers5_spelling_imports_alike_and_is_restored(tmp_path) -> None:  # noqa: ANN001
    """What transformers 5.24 saves — ``layers_block_type`` instead of the pattern, no
    ``num_hidden_layers``, ``time_step_limit: [0.0, {"__float__": "Infinity"}]`` — imports
    to the same NeMo config and comes back in its own spelling."""
    src = make_nemotron_h(str(tmp_path / "hf"), "nemotron_3_nano", keep_saved_config=True)
    saved = read_json(os.path.join(src, "config.json"))
    assert "layers_block_type" in saved and "hybrid_override_pattern" not in saved
    assert saved["time_step_limit"][1] == {"__float__": "Infinity"}
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo)
    cfg = api.open_checkpoint(nemo).config
    assert cfg["hybrid_override_pattern"] == "MEM*EM" and cfg["num_layers"] == 6
    api.export_hf(nemo, back)
    assert_same(src, back)


def test_tp_that_splits_a_group_is_refused_before_writing(tmp_path, models) -> None:  # noqa: ANN001
    out = str(tmp_path / "m")
    with pytest.raises(UnsupportedError) as ei:  # 2 groups, 8 mamba heads, 4 attention heads: TP 4 splits a group
        api.import_hf(models["nemotron_h_8b"], out, layout="legacy", parallel=api.Parallelism(tp=4))
    assert "section 'B'" in str(ei.value) and "does not split into 4" in str(ei.value)
    assert not os.path.exists(out)


#: What the directory's ``model:`` section says of each tiny model (the published configs'
#: kinds: the dense 8B's pattern without experts, Nemotron-3 Nano's with its E layers).
PROVIDER_FIELDS = {
    "nemotron_h_8b": {"_target_": "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider",
                      "hybrid_layer_pattern": "M-*M-M", "num_layers": 6, "mamba_num_heads": 8, "mamba_head_dim": 8,
                      "mamba_num_groups": 2, "mamba_state_dim": 16, "is_hybrid_model": True,
                      "position_embedding_type": "none", "normalization": "RMSNorm", "gated_linear_unit": False,
                      "add_bias_linear": False,
                      "activation_func": {"_target_": "megatron.core.activations.squared_relu", "_call_": False},
                      "num_moe_experts": None},
    "nemotron_3_nano": {"hybrid_layer_pattern": "MEM*EM", "num_moe_experts": 4, "moe_router_topk": 2,
                        "moe_ffn_hidden_size": 32, "moe_shared_expert_intermediate_size": 48,
                        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                        "moe_router_topk_scaling_factor": 2.5, "moe_shared_expert_gate": False,
                        "moe_grouped_gemm": False, "moe_layer_freq": None, "position_embedding_type": "none"},
}


@pytest.mark.parametrize("name", ["nemotron_h_8b", "nemotron_3_nano"])
def test_published_configs_through_the_provider(name: str) -> None:
    """The published configs (full size) → NeMo → ``HybridModelProvider`` → NeMo (no record):
    the provider holds their pattern and sizes, the read-back config is Nemotron-H's again and
    synthesises every key the published config.json has the same (what it leaves out is the
    class's default or harmless)."""
    from nemo_convert.formats.megatron.megatron_config import nemo_to_provider
    from nemo_convert.formats.megatron.provider_read import provider_to_nemo

    hf = published(name)
    providers = get_registry().providers()
    model = nemo_to_provider(family().config_to_nemo(hf), "nemotron_h", providers=providers,
                             vocab_size=hf["vocab_size"], params_dtype=torch.bfloat16)
    assert (model["hybrid_layer_pattern"], model["num_layers"], model["mamba_num_heads"], model["mamba_head_dim"],
            model["mamba_num_groups"], model["mamba_state_dim"], model["kv_channels"]) == (
        hf["hybrid_override_pattern"], hf["num_hidden_layers"], hf["mamba_num_heads"], hf["mamba_head_dim"],
        hf["n_groups"], hf["ssm_state_size"], 128)
    back = provider_to_nemo(model, "run_config.yaml", providers)
    back["nemo_convert"] = {"vocab_size": hf["vocab_size"]}
    assert get_registry().family_for_nemo_config(back).name == "nemotron_h"
    again = family().config_to_hf(back)
    assert {k: v for k, v in again.items() if k in hf} == {k: hf[k] for k in again if k in hf}
    assert again["head_dim"] == hf.get("head_dim", hf.get("attention_head_dim"))


def _run_config(out: str) -> tuple[str, dict]:
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    with open(path, encoding="utf-8") as f:
        return path, yaml.safe_load(f)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_megatron_bridge_directory_and_back(tmp_path, models, name) -> None:
    """HF → Megatron-Bridge directory (``HybridModelProvider``, as ``NemotronHBridge`` builds
    it) → export: the source's tensors bit for bit and transformers' logits; then the same
    directory without our record (as Megatron-Bridge writes it): the family from the provider
    alone, the same tensors, logits and layer pattern."""
    model, bare, ref = bridge_round_trip(models[name], tmp_path, "nemotron_h", every_tensor=True)
    assert {k: model.get(k) for k in PROVIDER_FIELDS[name]} == PROVIDER_FIELDS[name]
    assert read_json(os.path.join(bare, "config.json"))["hybrid_override_pattern"] == model["hybrid_layer_pattern"]
    assert torch.equal(logits(bare), ref)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_megatron_bridge_directory_holds_megatron_cores_keys(tmp_path, models, name) -> None:
    """The directory's tensor keys and global shapes are Megatron-Core 0.16.1's
    ``MambaModel.sharded_state_dict()`` (the record the slow Megatron-Core test takes) without
    the ``.nemo``'s ``model.`` prefix: every layer unstacked, the mixer's section keys, and
    the output layer's ``_extra_state``, as in our ``.nemo``."""
    out = str(tmp_path / "mb")
    api.import_hf(models[name], out, to="megatron-bridge")
    record, ours, extra = stored_keys(name, os.path.join(out, "iter_0000000"))
    theirs = {k.removeprefix("model."): v for k, v in record["tensors"].items()}
    assert ours == theirs, sorted(set(ours) ^ set(theirs))
    assert {k.removeprefix("model.") for k in record["extra_states"]} <= extra
    assert "output_layer._extra_state" in extra


def test_megatron_bridge_directory_as_the_bridge_writes_a_dense_pattern(tmp_path, models) -> None:
    """``NemotronHBridge`` sets sigmoid routing, the expert bias, ``mtp_num_layers: 0`` and
    grouped GEMM whatever the pattern: without experts there is no router, and the dense
    model reads the same; the older spelling ``hybrid_override_pattern`` too."""
    src = models["nemotron_h_8b"]
    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    path, doc = _run_config(out)
    model = {**doc["model"], "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
             "moe_router_dtype": "fp32", "mtp_num_layers": 0, "moe_grouped_gemm": True,
             "hybrid_override_pattern": doc["model"]["hybrid_layer_pattern"]}
    del model["hybrid_layer_pattern"], model["num_layers"]  # HybridModelProvider counts the pattern
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump({"model": model}, f)
    bare = str(tmp_path / "bare")
    assert api.inspect_checkpoint(out)["family"] == "nemotron_h"
    api.export_hf(out, bare)
    assert torch.equal(logits(bare), logits(src))


@pytest.mark.slow  # several conversions and transformers runs
def test_nemo_to_megatron_bridge_directory_and_back_to_nemo(tmp_path, models) -> None:
    """A ``.nemo`` (TP2 rank files) resharded to a Megatron-Bridge directory holds the same
    keys as one written from HF; the directory resharded to a dist ``.nemo`` exports the
    source bit for bit."""
    src = models["nemotron_3_nano"]
    nemo, direct, mb = str(tmp_path / "m.nemo"), str(tmp_path / "direct"), str(tmp_path / "mb")
    api.import_hf(src, nemo, layout="legacy", parallel=api.Parallelism(tp=2))
    api.import_hf(src, direct, to="megatron-bridge")
    api.reshard(nemo, mb, to="megatron-bridge")
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    keys = []
    for d in (direct, mb):
        ck = DistCheckpointSource.from_dir(os.path.join(d, "iter_0000000"))
        try:
            keys.append(({k: ck._raw[k][0] for k in ck.raw_keys()}, set(ck.extra_state_keys)))
        finally:
            ck.close()
    assert keys[0] == keys[1]
    again, back = str(tmp_path / "again.nemo"), str(tmp_path / "back")
    api.reshard(mb, again, layout="dist")
    api.export_hf(again, back)
    assert_same(src, back)
    assert torch.equal(logits(back), logits(src))


@pytest.mark.parametrize("change, words", [
    ({"hybrid_layer_pattern": "M-*M-M/*"}, "hybrid_layer_pattern='M-*M-M/*' has '/'"),
    ({"hybrid_override_pattern": "M-*M-M"}, "hybrid_layer_pattern and hybrid_override_pattern are both set"),
    ({"hybrid_layer_pattern": None}, "a hybrid provider without hybrid_layer_pattern"),
    ({"hybrid_attention_ratio": 0.5}, "hybrid_attention_ratio=0.5 changes the model's math"),
    ({"mtp_num_layers": 1}, "mtp_num_layers=1"),
    ({"mtp_hybrid_override_pattern": "*E"}, "mtp_hybrid_override_pattern='*E'"),
    ({"num_layers": 5}, "num_layers=5 but hybrid_layer_pattern has 6 layers"),
    ({"position_embedding_type": "learned_absolute"}, "position_embedding_type='learned_absolute'"),
    ({"moe_latent_size": 16}, "moe_latent_size=16"),
    ({"fp32_residual_connection": True}, "fp32_residual_connection=True"),
    ({"num_moe_experts": None}, "hybrid_layer_pattern='MEM*EM' with num_moe_experts=None: E layers and experts"),
    ({"hybrid_layer_pattern": "MMM*MM"}, "hybrid_layer_pattern='MMM*MM' with num_moe_experts=4"),
    ({"activation_func": "torch.nn.functional.gelu"}, "activation_func='gelu', but HybridModelProvider is read only"),
    ({"add_bias_linear": True}, "add_bias_linear=True, but HybridModelProvider"),
])
def test_megatron_bridge_directory_refusals_by_name(tmp_path, models, change, words) -> None:
    """A hybrid section the NeMo config cannot carry is refused by name when read."""
    out = str(tmp_path / "mb")
    api.import_hf(models["nemotron_3_nano"], out, to="megatron-bridge")
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    path, doc = _run_config(out)
    model = {k: v for k, v in {**doc["model"], **change}.items() if v is not None}
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump({"model": model}, f)
    with pytest.raises(UnsupportedError) as ei:
        api.inspect_checkpoint(out)
    assert words in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def test_megatron_bridge_hybrid_provider_needs_a_declaring_family(tmp_path, models, monkeypatch) -> None:
    """Without a family that declares ``HybridModelProvider``, neither side guesses: writing
    is refused by the family's name, reading by the class's."""
    from nemo_convert.formats.megatron.providers import ProviderTable
    from nemo_convert.plugins.manager import Registry

    out = str(tmp_path / "mb")
    api.import_hf(models["nemotron_h_8b"], out, to="megatron-bridge")
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    declared = Registry.providers
    monkeypatch.setattr(Registry, "providers", lambda self: ProviderTable(
        {k: v for k, v in declared(self).families.items() if k != "nemotron_h"}))
    with pytest.raises(UnsupportedError, match="HybridModelProvider is declared by no installed family"):
        api.inspect_checkpoint(out)
    with pytest.raises(UnsupportedError, match="'nemotron_h' has no confirmed Megatron-Bridge model provider"):
        api.import_hf(models["nemotron_h_8b"], str(tmp_path / "again"), to="megatron-bridge")


@pytest.mark.slow  # several conversions and transformers runs
def test_a_tampered_section_order_changes_the_logits(tmp_path, models) -> None:  # noqa: ANN001
    """The logits tell section orders apart (the negative control of the Megatron-Core
    test's ordering): a source with z and x exchanged in in_proj is another model."""
    from safetensors.torch import load_file, save_file

    src = models["nemotron_h_8b"]
    bad = str(tmp_path / "bad")
    shutil.copytree(src, bad)
    path = os.path.join(bad, "model.safetensors")
    t = load_file(path)
    w = t["backbone.layers.0.mixer.in_proj.weight"]
    t["backbone.layers.0.mixer.in_proj.weight"] = torch.cat([w[64:128], w[:64], w[128:]]).contiguous()
    save_file(t, path, metadata={"format": "pt"})
    assert (logits(bad) - logits(src)).abs().max() > 1e-2


def test_nemo_config_without_source_is_synthesised(tmp_path, models) -> None:  # noqa: ANN001
    """A NeMo-native config (no recorded source): config.json from the NeMo fields alone,
    which transformers loads into the same model."""
    src = models["nemotron_3_nano"]
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    cfg = copy.deepcopy(api.open_checkpoint(nemo).config)
    del cfg["nemo_convert"]["hf_config"]
    hf = family().config_to_hf(cfg)
    assert hf["hybrid_override_pattern"] == "MEM*EM" and hf["num_hidden_layers"] == 6
    assert (hf["n_routed_experts"], hf["num_experts_per_tok"], hf["mlp_hidden_act"]) == (4, 2, "relu2")
    from transformers import NemotronHConfig

    again = NemotronHConfig.from_dict(json.loads(json.dumps(hf)))
    assert again.layers_block_type == ["linear_attention", "moe", "linear_attention", "full_attention", "moe",
                                       "linear_attention"]
    assert family().config_to_nemo(hf)["mamba_num_heads"] == cfg["mamba_num_heads"]


@pytest.mark.parametrize("name", ["nemotron_h_8b", "nemotron_3_nano"])
def test_a_native_config_comes_back_to_nemotron_h(name: str) -> None:
    """A ``.nemo`` NeMo wrote (our record dropped whole) goes to nemotron_h by its NeMo class
    (``MegatronMambaModel``) alone: the family claims no features, so it is that class's
    default family, and its table represents the config exactly."""
    cfg = family().config_to_nemo(published(name))
    cfg.pop("nemo_convert", None)
    cfg["target"] = family().nemo.target
    assert family().refuses_nemo_config(cfg) is None
    assert get_registry().family_for_nemo_config(cfg).name == "nemotron_h"


@pytest.mark.parametrize("change, words", [
    ({"activation": "gelu"}, "activation='gelu': the family's HF class computes 'squared-relu'"),
    ({"normalization": "layernorm"}, "normalization='layernorm'"),
    ({"gated_linear_unit": True}, "gated_linear_unit=True"),
    ({"add_bias_linear": True}, "add_bias_linear=True"),
])
def test_a_nemo_config_the_hf_class_does_not_compute_is_refused(change: dict, words: str) -> None:
    """A ``MegatronMambaModel`` config with another MLP function, norm, gating or linear biases
    (what ``MegatronMambaModel`` passes to Megatron-Core) is not Nemotron-H's model: refused by
    name, with or without our record; ``bias`` and ``position_embedding_type`` are overridden by
    ``MegatronMambaModel`` itself and change nothing."""
    cfg = family().config_to_nemo(published("nemotron_3_nano"))
    assert family().refuses_nemo_config(cfg) is None
    assert family().refuses_nemo_config({**cfg, "bias": True, "position_embedding_type": "rope"}) is None
    for c in (cfg, {k: v for k, v in cfg.items() if k != "nemo_convert"}):
        reason = family().refuses_nemo_config({**c, **change})
        assert reason is not None and words in reason, reason
    if "normalization" not in change:  # a Mamba-only stack has no MLP, no attention: nothing to differ
        mamba_only = {**cfg, "hybrid_override_pattern": "M" * cfg["num_layers"], **change}
        assert family().refuses_nemo_config(mamba_only) is None


def test_a_nemo_config_without_the_mixer_sizes_means_megatron_cores_defaults() -> None:
    """NeMo 1's own Mamba config (``megatron_mamba_config.yaml``) gives ``mamba_ssm_ngroups``
    and no head counts: Megatron-Core then runs ``expand × hidden / 64`` heads of 64 with a
    state of 128; the mapping's sections follow."""
    from nemo_convert.families.hybrid import mamba_dims, mamba_sections

    cfg = {"hidden_size": 4096, "mamba_ssm_ngroups": 8, "num_layers": 3, "hybrid_override_pattern": "M*-",
           "normalization": "RMSNorm"}  # megatron_mamba_config.yaml line 72 (without it NeMo runs LayerNorm)
    assert mamba_dims(cfg) == (128, 64, 8, 128)
    in_proj, conv = mamba_sections(cfg)
    assert in_proj.sizes == (8192, 8192, 1024, 1024, 128) and conv.sizes == (8192, 1024, 1024)
    assert family().config_to_hf({**cfg, "num_attention_heads": 32, "ffn_hidden_size": 21504, "layernorm_epsilon": 1e-5,
                                  "activation": "squared-relu", "nemo_convert": {"vocab_size": 256}})["mamba_num_heads"] == 128
