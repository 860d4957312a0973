"""YaRN in Megatron-Bridge directories and NeMo 2 folders: the MLA provider's YaRN fields are
written (``--to megatron-bridge``), read back (with and without our record) into the same HF
model, read with MLATransformerConfig's defaults where a section leaves them out, and
Megatron-Core loads the directory with transformers' logits beyond the original context."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml
from test_yarn import IDS, V5
from tiny_models import hf_tensors, read_json

from nemo_convert import api
from nemo_convert.plugins.manager import get_registry

#: DeepSeek-V3's YaRN as the tiny model has it (tests/test_yarn.py): the provider's fields.
PROVIDER_YARN = {"rope_type": "yarn", "rotary_scaling_factor": 4.0, "original_max_position_embeddings": 16,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.9, "mscale_all_dim": 0.6}


@pytest.fixture(scope="module")
def deepseek_yarn(tmp_path_factory: Any) -> str:
    from test_family_matrix import make_model

    return make_model(str(tmp_path_factory.mktemp("yarn") / "hf"), "deepseek_v3", **V5["deepseek_v3"])


def _run_config(out: str) -> tuple[str, dict[str, Any]]:
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    return path, yaml.safe_load(open(path))


@pytest.mark.slow  # transformers models and logits
def test_mla_yarn_to_megatron_bridge_and_back(deepseek_yarn: str, tmp_path: Any) -> None:
    from test_family_matrix import assert_same, logits

    out = str(tmp_path / "mb")
    api.import_hf(deepseek_yarn, out, to="megatron-bridge")
    path, doc = _run_config(out)
    assert {k: doc["model"].get(k) for k in PROVIDER_YARN} == PROVIDER_YARN
    assert doc["model"]["position_embedding_type"] == "rope"  # MLA's RoPE is rope_type's, not GPTModel's
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert_same(deepseek_yarn, back)  # the recorded source, v5 rope_parameters
    want = logits(deepseek_yarn, IDS)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))  # as Megatron-Bridge writes it
    bare = str(tmp_path / "bare")
    assert api.export_hf(out, bare).family == "deepseek_v3"
    a, b = hf_tensors(deepseek_yarn), hf_tensors(bare)
    assert set(b) <= set(a) and all(torch.equal(a[k], b[k]) for k in b)
    scaling = read_json(os.path.join(bare, "config.json"))["rope_scaling"]
    assert scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
                       "beta_slow": 1.0, "mscale": 0.9, "mscale_all_dim": 0.6}
    assert torch.equal(logits(bare, IDS), want)


def test_mla_provider_yarn_fields_default_to_mla_transformer_configs(deepseek_yarn: str, tmp_path: Any) -> None:
    """A section that leaves YaRN's fields out means MLATransformerConfig's defaults
    (megatron-core 0.16.1 transformer_config.py lines 2034–2059: rope_type yarn, factor 40,
    original 4096, beta 32 / 1, mscale 1, mscale_all_dim 0); ``rope_type: rope`` with
    MLA's softmax factor still on is refused by name."""
    from nemo_convert.errors import UnsupportedError

    out = str(tmp_path / "mb")
    api.import_hf(deepseek_yarn, out, to="megatron-bridge")
    path, doc = _run_config(out)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    with open(path, "w") as f:
        yaml.safe_dump({"model": {k: v for k, v in doc["model"].items() if k not in PROVIDER_YARN}}, f)
    with api.open_checkpoint(out) as ck:
        cfg = ck.config
    assert {k: cfg[k] for k in PROVIDER_YARN} == {
        "rope_type": "yarn", "rotary_scaling_factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
    with open(path, "w") as f:
        yaml.safe_dump({"model": {**doc["model"], "rope_type": "rope"}}, f)
    with pytest.raises(UnsupportedError, match="rope_type='rope' with rotary_scaling_factor=4.0 and "
                                               "mscale_all_dim=0.6 scales MLA's softmax"):
        api.inspect_checkpoint(out)


def test_megatron_lm_mla_yarn_args() -> None:
    """Megatron-LM's MLA arguments (core_v0.16.1 arguments.py: --rope-type, --rotary-scaling-factor,
    --mscale, --mscale-all-dim; none for the original context or the betas, which keep
    MLATransformerConfig's defaults): YaRN passes through, factor 1 is plain RoPE."""
    from test_megatron_dirs import megatron_lm_args

    from nemo_convert.formats.megatron.provider_read import args_to_nemo

    base = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=48, multi_latent_attention=True,
                moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, q_lora_rank=32,
                kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, qk_layernorm=True,
                moe_shared_expert_intermediate_size=48)
    yarn = args_to_nemo(vars(megatron_lm_args(**base, rope_type="yarn", rotary_scaling_factor=40.0, mscale=1.0,
                                              mscale_all_dim=1.0)), "x")
    assert {k: yarn[k] for k in PROVIDER_YARN} == {
        "rope_type": "yarn", "rotary_scaling_factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    plain = args_to_nemo(vars(megatron_lm_args(**base, rope_type=None, rotary_scaling_factor=1.0, mscale=1.0,
                                               mscale_all_dim=0.0)), "x")
    assert plain["rope_type"] == "rope" and plain["rotary_scaling_factor"] == 1.0


@pytest.mark.slow
def test_megatron_core_runs_our_mla_yarn_directory(deepseek_yarn: str, tmp_path: Any) -> None:
    """Megatron-Core builds MLATransformerConfig from run_config.yaml's fields
    (tests/test_megatron_dirs_mcore.py's worker), loads the directory and gives
    transformers' logits over 48 tokens (original context 16)."""
    pytest.importorskip("megatron.core")
    from test_family_matrix import logits
    from test_family_megatron import _mtp_logits

    root = str(tmp_path)
    api.import_hf(deepseek_yarn, f"{root}/mb", to="megatron-bridge")
    torch.save({"ids": IDS, "logits": logits(deepseek_yarn, IDS), "mtp_logits": _mtp_logits(deepseek_yarn, IDS)},
               f"{root}/want.pt")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(here, "test_megatron_dirs_mcore.py"), root, "family"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "MCORE-WORKER OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print([ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE-FAMILY")][0])


def _write_deepseek_nemo2(folder: str, nemo: str, cls: str = "DeepSeekConfig") -> None:
    """A NeMo 2 folder as NeMo's ``HFDeepSeekImporter`` writes one (NeMo 8cfedd7
    ``nemo/collections/llm/gpt/model/deepseek.py`` lines 405–453: these arguments and no
    RoPE field, ``kv_channels`` = HF ``num_key_value_heads``), weights from ``nemo``."""
    from nemo_convert.formats.io.sink import DirectorySink
    from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter

    with api.open_checkpoint(nemo) as ck:
        cfg = ck.config
        w = DistWeightsWriter(DirectorySink(folder), [ck.source.info(k) for k in ck.source.keys()], prefix="module.",
                              folder="weights")
        for k in ck.source.keys():
            w.write(k, ck.source.load(k))
        w.close()
    model_yaml = {
        "_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekModel",
        "config": {"_target_": f"nemo.collections.llm.gpt.model.deepseek.{cls}", "num_layers": cfg["num_layers"],
                   "hidden_size": cfg["hidden_size"], "ffn_hidden_size": cfg["ffn_hidden_size"],
                   "num_attention_heads": cfg["num_attention_heads"], "kv_channels": cfg["num_attention_heads"],
                   "q_lora_rank": cfg["q_lora_rank"], "num_moe_experts": cfg["num_moe_experts"],
                   "moe_ffn_hidden_size": cfg["moe_ffn_hidden_size"],
                   "moe_shared_expert_intermediate_size": cfg["moe_shared_expert_intermediate_size"],
                   "moe_layer_freq": cfg["moe_layer_freq"], "moe_router_topk": cfg["moe_router_topk"],
                   "moe_router_num_groups": 1, "moe_router_group_topk": 1,
                   "moe_router_topk_scaling_factor": cfg["moe_router_topk_scaling_factor"],
                   "moe_aux_loss_coeff": 0.001, "kv_lora_rank": cfg["kv_lora_rank"], "qk_head_dim": cfg["qk_head_dim"],
                   "qk_pos_emb_head_dim": cfg["qk_pos_emb_head_dim"], "v_head_dim": cfg["v_head_dim"],
                   "make_vocab_size_divisible_by": 1280, "fp16": False, "bf16": False,
                   "params_dtype": {"_target_": "torch.float32", "_call_": False},
                   "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                   "mtp_num_layers": cfg.get("mtp_num_layers")}}
    os.makedirs(os.path.join(folder, "context"), exist_ok=True)
    with open(os.path.join(folder, "context", "model.yaml"), "w") as f:
        yaml.safe_dump(model_yaml, f)


@pytest.mark.slow  # transformers models and logits
def test_nemo2_deepseek_folder_reads_its_class_yarn(tmp_path: Any) -> None:
    """NeMo 2's DeepSeekConfig leaves YaRN to its class defaults (factor 40, original 4096,
    mscale and mscale_all_dim 1: DeepSeek-V3's): a NeMo 2 folder of a tiny DeepSeek-V3 with
    that YaRN exports to the same tensors and transformers' logits, with the YaRN block."""
    from test_family_matrix import logits, make_model

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    # NeMo 2's HFDeepSeekImporter passes no MTP layers (lines 405-453): a source without them
    src = make_model(str(tmp_path / "hf"), "deepseek_v3", rope_scaling=rope, num_nextn_predict_layers=0)
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    folder = str(tmp_path / "nemo2")
    _write_deepseek_nemo2(folder, nemo)
    assert api.inspect_checkpoint(folder)["family"] == "deepseek_v3"
    back = str(tmp_path / "back")
    api.export_hf(folder, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    out = read_json(os.path.join(back, "config.json"))
    assert out["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert torch.equal(logits(back, IDS), logits(src, IDS))


def test_nemo2_deepseek_classes(tmp_path: Any) -> None:
    """DeepSeekV3Config's defaults read like the hub model's config; DeepSeek-V2's classes
    (softmax routing) are refused by name."""
    from nemo_convert.errors import UnsupportedError
    from nemo_convert.formats.nemo2.nemo2 import nemo2_to_nemo1_config

    v3 = nemo2_to_nemo1_config({"_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekModel", "config": {
        "_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekV3Config"}}, get_registry().providers())
    assert {k: v3[k] for k in PROVIDER_YARN} == {
        "rope_type": "yarn", "rotary_scaling_factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    assert (v3["num_layers"], v3["num_moe_experts"], v3["moe_router_score_function"], v3["kv_channels"],
            v3["moe_layer_freq"][:4], v3["precision"]) == (61, 256, "sigmoid", 128, [0, 0, 0, 1], "bf16")
    with pytest.raises(UnsupportedError, match="NeMo 2 config class nemo.collections.llm.gpt.model.deepseek."
                                               "DeepSeekV2Config is declared by no installed family.*declared: .*"
                                               "DeepSeekConfig, DeepSeekV3Config"):
        nemo2_to_nemo1_config({"config": {"_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekV2Config"}},
                              get_registry().providers())


# -- GPT-OSS: GPTModelProvider with GPTModel's YaRN -----------------------------------------

#: GPTModel's YaRN as the tiny GPT-OSS has it (tests/test_yarn.py V5), the provider's fields.
GPT_YARN = {"position_embedding_type": "yarn", "yarn_rotary_scaling_factor": 4.0,
            "yarn_original_max_position_embeddings": 16, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
            "yarn_mscale": None, "yarn_mscale_all_dim": None, "yarn_correction_range_round_to_int": False}
#: GPTOSSBridge's fields (Megatron-Bridge v0.6.0 gpt_oss/gpt_oss_bridge.py lines 57-101) where
#: the tiny model differs from the hub's constants only by its clamp and window.
GPT_OSS_PROVIDER = {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "normalization": "RMSNorm",
                    "gated_linear_unit": True, "add_bias_linear": True, "softmax_type": "learnable",
                    "activation_func": {"_target_": "megatron.core.fusions.fused_bias_geglu.quick_gelu",
                                        "_call_": False},
                    "glu_linear_offset": 1.0, "activation_func_clamp_value": 0.5, "window_size": [7, 0],
                    "window_attn_skip_freq": [1, 0], "share_embeddings_and_output_weights": False,
                    "moe_router_pre_softmax": False, "moe_ffn_hidden_size": 48, "expert_tensor_parallel_size": 1,
                    "moe_router_load_balancing_type": "none"}


@pytest.fixture(scope="module")
def gpt_oss_yarn(tmp_path_factory: Any) -> str:
    from test_family_matrix import make_model

    return make_model(str(tmp_path_factory.mktemp("yarn") / "hf"), "gpt_oss", **V5["gpt_oss"])


@pytest.mark.slow  # transformers models and logits
def test_gpt_oss_yarn_to_megatron_bridge_and_back(gpt_oss_yarn: str, tmp_path: Any) -> None:
    """GPT-OSS written as GPTOSSBridge's GPTModelProvider with the model's own YaRN, clamp
    and window pattern; read back with our record (the source config.json) and without
    it (as Megatron-Bridge writes it): the same tensors and logits over 48 tokens; and with
    the bridge's own spellings (``window_attn_skip_freq: 2``, ``add_qkv_bias: false``,
    ``megatron.core.activations.quick_gelu``) the same model again."""
    from test_family_matrix import assert_same, logits

    out = str(tmp_path / "mb")
    api.import_hf(gpt_oss_yarn, out, to="megatron-bridge")
    path, doc = _run_config(out)
    want = {**GPT_OSS_PROVIDER, **GPT_YARN}
    assert {k: doc["model"].get(k) for k in want} == want
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert_same(gpt_oss_yarn, back)
    ref = logits(gpt_oss_yarn, IDS)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    for n, change in enumerate(({}, {"window_attn_skip_freq": 2, "add_qkv_bias": False, "activation_func": {
            "_target_": "megatron.core.activations.quick_gelu", "_call_": False}})):
        with open(path, "w") as f:
            yaml.safe_dump({**doc, "model": {**doc["model"], **change}}, f)
        bare = str(tmp_path / f"bare{n}")
        assert api.export_hf(out, bare).family == "gpt_oss"
        a, b = hf_tensors(gpt_oss_yarn), hf_tensors(bare)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
        cfg = read_json(os.path.join(bare, "config.json"))
        assert cfg["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                       "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
        assert cfg["layer_types"] == ["sliding_attention", "full_attention"] and cfg["sliding_window"] == 8
        assert torch.equal(logits(bare, IDS), ref)


def test_gpt_oss_provider_refusals(gpt_oss_yarn: str, tmp_path: Any) -> None:
    """What GPT-OSS's HF model does not compute is refused by name: the GLU without its +1
    or its clamp, the clamped GLU or quick-GELU without the sinks, YaRN without its factor."""
    from nemo_convert.errors import UnsupportedError

    out = str(tmp_path / "mb")
    api.import_hf(gpt_oss_yarn, out, to="megatron-bridge")
    path, doc = _run_config(out)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    for change, words in (({"glu_linear_offset": 0.0}, "glu_linear_offset=0.0"),
                          ({"activation_func_clamp_value": None}, "activation_func_clamp_value=None"),
                          ({"softmax_type": "vanilla"}, "glu_linear_offset=1.0 changes the model's math"),
                          ({"softmax_type": "vanilla", "glu_linear_offset": 0.0, "activation_func_clamp_value": None,
                            "window_attn_skip_freq": None}, "quick_gelu without GPT-OSS's attention sinks"),
                          ({"yarn_rotary_scaling_factor": None}, "yarn without yarn_rotary_scaling_factor")):
        with open(path, "w") as f:
            yaml.safe_dump({**doc, "model": {**doc["model"], **change}}, f)
        with pytest.raises(UnsupportedError, match=words):
            api.inspect_checkpoint(out)


@pytest.mark.slow
def test_megatron_core_runs_our_gpt_oss_yarn_directory(gpt_oss_yarn: str, tmp_path: Any) -> None:
    """Megatron-Core builds GPTModel (``position_embedding_type: yarn``, the ``yarn_*``
    fields set on the config as GPTModelProvider carries them, sinks, window pattern,
    clamped GLU) from run_config.yaml and gives transformers' logits over 48 tokens."""
    pytest.importorskip("megatron.core")
    from test_family_matrix import logits

    root = str(tmp_path)
    api.import_hf(gpt_oss_yarn, f"{root}/mb", to="megatron-bridge")
    torch.save({"ids": IDS, "logits": logits(gpt_oss_yarn, IDS)}, f"{root}/want.pt")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(here, "test_megatron_dirs_mcore.py"), root, "family"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "MCORE-WORKER OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print([ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE-FAMILY")][0])


def test_nemo2_gpt_oss_is_refused_by_name() -> None:
    from nemo_convert.errors import UnsupportedError
    from nemo_convert.formats.nemo2.nemo2 import nemo2_to_nemo1_config

    with pytest.raises(UnsupportedError, match="NeMo 2's GPTOSSConfig20B is not read: its YaRN is "
                                               "rotary_scaling_factor"):
        nemo2_to_nemo1_config({"_target_": "nemo.collections.llm.gpt.model.gpt_oss.GPTOSSModel", "config": {
            "_target_": "nemo.collections.llm.gpt.model.gpt_oss.GPTOSSConfig20B", "num_layers": 24}},
            get_registry().providers())
