"""YaRN RoPE (``nemo_convert/families/yarn.py``): the published configs' YaRN imports, every
HF field lands in the Megatron-Core field that computes the same thing, the source spelling
comes back on export, a config with no record is synthesised into the same transformers
RoPE, and Megatron-Core's own YaRN functions, given the fields we write, compute
transformers' frequencies, attention factor and (MLA) softmax scale bit for bit.

Megatron-Core running whole models with YaRN beyond the original context:
``tests/test_yarn_megatron.py``.
"""

from __future__ import annotations

import copy
import json
import math
import os
from typing import Any

import pytest
import torch
import yaml
from tiny_models import randomize_, read_json

from nemo_convert import api
from nemo_convert.families.yarn import MLA_FIELDS, yarn_to_hf, yarn_to_nemo
from nemo_convert.spec import yarn_scaling
from nemo_convert.hf_config import read_rope

HUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hub_configs")
IDS = torch.randint(3, 128, (1, 48), generator=torch.Generator().manual_seed(7))

#: Published configs shrunk in size only (layers, widths, experts; vocabulary where no token
#: id needs it); every other key verbatim.
SHRINK: dict[str, dict[str, Any]] = {
    "deepseek_v3/DeepSeek-V3.json": dict(
        num_hidden_layers=4, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, n_routed_experts=16, vocab_size=256),
    "gpt_oss/gpt-oss-20b.json": dict(  # vocabulary kept: pad_token_id 199999, eos 200002
        num_hidden_layers=2, hidden_size=16, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_local_experts=4),
}
#: What each one's RoPE must become (module docstring of nemo_convert/families/yarn.py).
WANT: dict[str, dict[str, Any]] = {
    "deepseek_v3/DeepSeek-V3.json": {
        "rotary_base": 10000.0, "position_embedding_type": "rope", "rope_type": "yarn", "rotary_scaling_factor": 40.0,
        "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
        "mscale_all_dim": 1.0},
    "gpt_oss/gpt-oss-20b.json": {
        "rotary_base": 150000.0, "position_embedding_type": "yarn", "yarn_rotary_scaling_factor": 32.0,
        "yarn_original_max_position_embeddings": 4096, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
        "yarn_mscale": None, "yarn_mscale_all_dim": None, "yarn_correction_range_round_to_int": False},
}


def _shrunk(name: str) -> dict[str, Any]:
    cfg = read_json(os.path.join(HUB, name))
    cfg.update(SHRINK[name])
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][: cfg["num_hidden_layers"]]
    return cfg


def _family(cfg: dict[str, Any]) -> Any:
    return api.get_registry().families[cfg["model_type"]].record


@pytest.mark.parametrize("name", sorted(SHRINK))
def test_published_yarn_configs_translate(name: str) -> None:
    cfg = _shrunk(name)
    cfg.pop("quantization_config", None)  # the core dequantizes and drops it before the table (hf_to_nemo.py)
    nemo = _family(cfg).config_to_nemo(cfg)
    assert {k: nemo.get(k) for k in WANT[name]} == WANT[name]


def _tiny_model(cfg: dict[str, Any], folder: str) -> str:
    """Random bf16 weights for ``cfg`` (norms, routers, biases and DeepSeek's score
    correction too), saved with ``cfg`` itself as ``config.json``."""
    import transformers

    cls = {"deepseek_v3": transformers.DeepseekV3Config, "gpt_oss": transformers.GptOssConfig}[cfg["model_type"]]
    hf_cfg = cls(**{k: v for k, v in copy.deepcopy(cfg).items() if k != "quantization_config"})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    randomize_(model, seed=11)
    with torch.no_grad():
        for n, buf in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return folder


def _logits(folder: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.slow  # builds and runs transformers models (5-30 s)
@pytest.mark.parametrize("name", sorted(SHRINK))
def test_published_yarn_configs_round_trip(tmp_path: Any, name: str) -> None:
    """A tiny bf16 checkpoint under the published config (its v4 ``rope_scaling``, DeepSeek's
    ``type: yarn``; without fp8 weights or MTP layers): import, export, the same
    ``config.json`` key for key and transformers' logits over 48 tokens bit for bit."""
    cfg = _shrunk(name)
    cfg.pop("quantization_config", None)  # bf16 weights
    cfg["num_nextn_predict_layers"] = 0 if "num_nextn_predict_layers" in cfg else None  # no MTP tensors here
    cfg = {k: v for k, v in cfg.items() if v is not None}
    src = _tiny_model(cfg, str(tmp_path / "hf"))
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    api.import_hf(src, nemo, packed=False)
    written = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    assert {k: written.get(k) for k in WANT[name]} == WANT[name]
    api.export_hf(nemo, back)
    assert read_json(os.path.join(back, "config.json")) == cfg
    assert torch.equal(_logits(src), _logits(back))


#: Tiny v5-spelled YaRN models (the families' test-matrix shapes, original context 16).
V5 = {
    "deepseek_v3": dict(rope_scaling={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "mscale": 0.9, "mscale_all_dim": 0.6}),
    "gpt_oss": dict(head_dim=32, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                                  "beta_slow": 1.0, "truncate": False}),
}


@pytest.mark.slow  # builds and runs transformers models (4-9 s)
@pytest.mark.parametrize("family", sorted(V5))
def test_v5_spelling_is_restored_and_a_config_without_record_is_synthesised(tmp_path: Any, family: str) -> None:
    from test_family_matrix import assert_same, logits, make_model

    src = make_model(str(tmp_path / "hf"), family, **V5[family])
    assert read_rope(read_json(os.path.join(src, "config.json"))).kind == "yarn"
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    api.import_hf(src, nemo, packed=False)
    api.export_hf(nemo, back)
    assert_same(src, back)  # rope_parameters as transformers v5 wrote it
    path = os.path.join(nemo, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    del cfg["nemo_convert"]["hf_config"], cfg["nemo_convert"]["family"]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    synth = str(tmp_path / "synth")
    assert api.export_hf(nemo, synth).family == family
    out = read_json(os.path.join(synth, "config.json"))
    assert out["rope_scaling"]["rope_type"] == "yarn"
    assert torch.equal(logits(src, IDS), logits(synth, IDS))


# -- the math, field by field ------------------------------------------------------------

#: (head dim rotated, base, max_position_embeddings, the HF YaRN block): the hub values and
#: the corners of transformers' defaults.
CASES = [
    (64, 10000.0, 163840, {"factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                           "mscale": 1.0, "mscale_all_dim": 1.0}),                    # DeepSeek-V3 / R1
    (64, 150000.0, 131072, {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False}),                     # gpt-oss
    (64, 10000.0, 163840, {"factor": 40, "original_max_position_embeddings": 4096, "mscale": 0.707,
                           "mscale_all_dim": 0.707}),                                  # DeepSeek-V2's mscales
    # moonshotai/Kimi-K2-Instruct-0905's block (ParagEkbote/hf-model-inspector@92931b2
    # model_inspection_report.md): beta_fast = beta_slow = 1, one correction dimension
    (64, 50000.0, 262144, {"factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                           "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    (32, 10000.0, 64, {"factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.9, "mscale_all_dim": 0.6}),
    (32, 50000.0, 64, {"factor": 4.0, "beta_fast": None, "beta_slow": 0}),              # `or 32` / `or 1`, orig = max
    (16, 10000.0, 64, {"factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.8}),  # mscale alone: ignored
    (16, 10000.0, 64, {"factor": 0.5, "original_max_position_embeddings": 16}),         # factor < 1: mscale 1
]


def _hf_yarn(dim: int, base: float, max_pos: int, block: dict[str, Any], mla: bool) -> tuple[torch.Tensor, float, Any]:
    """transformers' inverse frequencies, attention factor and (MLA) softmax scale."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": base, **block}
    if mla:
        cfg = transformers.DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                            q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16,
                                            qk_rope_head_dim=dim, v_head_dim=16, max_position_embeddings=max_pos,
                                            rope_parameters=rope)
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

        scaling: Any = DeepseekV3Attention(cfg, 0).scaling
    else:
        cfg = transformers.GptOssConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=dim,
                                        max_position_embeddings=max_pos, rope_parameters=rope)
        scaling = None
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    return inv, factor, scaling


def _as_hf(dim: int, base: float, max_pos: int, block: dict[str, Any], mla: bool) -> dict[str, Any]:
    hf = {"max_position_embeddings": max_pos, "rope_theta": base, "rope_scaling": {"rope_type": "yarn", **block}}
    return yarn_to_nemo(read_rope(hf), hf, mla=mla)


@pytest.mark.parametrize("mla", [True, False], ids=["mla", "gpt"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_synthesised_block_is_the_same_transformers_rope(case: int, mla: bool) -> None:
    """Export without a recorded source writes the ``rope_scaling`` block back from the
    Megatron-Core fields: transformers computes the same frequencies, attention factor and
    softmax scale from it as from the source, bit for bit."""
    dim, base, max_pos, block = CASES[case]
    if mla and block.get("truncate") is False:
        pytest.skip("refused for MLA")
    nemo = _as_hf(dim, base, max_pos, block, mla)
    scaling = yarn_scaling(nemo, mla=mla)  # the spec's reading of the NeMo fields
    assert scaling is not None
    back = {k: v for k, v in yarn_to_hf(scaling, mla=mla).items() if k != "rope_type"}
    want, got = _hf_yarn(dim, base, max_pos, block, mla), _hf_yarn(dim, base, max_pos, back, mla)
    assert torch.equal(want[0], got[0]) and want[1] == got[1] and want[2] == got[2]


@pytest.mark.slow  # imports Megatron-Core in this process (seconds)
@pytest.mark.parametrize("mla", [True, False], ids=["mla", "gpt"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_megatron_core_yarn_functions_give_transformers_values(monkeypatch: Any, case: int, mla: bool) -> None:
    """Megatron-Core 0.16.1's ``YarnRotaryEmbedding`` built as MLA (multi_latent_attention.py
    lines 136–148) or GPTModel (gpt_model.py lines 172–191) builds it from the fields we
    write: its frequencies and concentration factor are transformers' inverse frequencies
    and attention factor, bit for bit; MLA's softmax scale (line 126) is DeepSeek-V3's."""
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn_mod

    dim, base, max_pos, block = CASES[case]
    if mla and block.get("truncate") is False:
        pytest.skip("refused for MLA")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # it moves its buffers to the "GPU"
    nemo = _as_hf(dim, base, max_pos, block, mla)
    if mla:
        f = {k: nemo[v] for k, v in MLA_FIELDS.items()}
        emb = yarn_mod.YarnRotaryEmbedding(dim, rotary_base=base, scaling_factor=f["factor"],
                                           original_max_position_embeddings=f["original_max_position_embeddings"],
                                           beta_fast=f["beta_fast"], beta_slow=f["beta_slow"], mscale=f["mscale"],
                                           mscale_all_dim=f["mscale_all_dim"], use_cpu_initialization=True)
        mscale = yarn_mod._yarn_get_mscale(f["factor"], f["mscale_all_dim"])
        softmax: Any = mscale * mscale / math.sqrt(16 + dim)  # qk_head_dim 16 + qk_pos_emb_head_dim
    else:
        emb = yarn_mod.YarnRotaryEmbedding(
            dim, rotary_base=base, scaling_factor=nemo["yarn_rotary_scaling_factor"],
            original_max_position_embeddings=nemo["yarn_original_max_position_embeddings"],
            beta_fast=nemo["yarn_beta_fast"], beta_slow=nemo["yarn_beta_slow"], mscale=nemo["yarn_mscale"],
            mscale_all_dim=nemo["yarn_mscale_all_dim"],
            correction_range_round_to_int=nemo["yarn_correction_range_round_to_int"], use_cpu_initialization=True)
        softmax = None
    table, concentration = emb.get_emb(48)
    if not mla:  # GPTModel drops get_emb's factor; attention reads it from the config (attention.py 1102)
        config = type("Config", (), {k: v for k, v in nemo.items() if k.startswith("yarn_")})()
        concentration = yarn_mod._yarn_get_concentration_factor_from_config(config)
    inv, factor, scaling = _hf_yarn(dim, base, max_pos, block, mla)
    assert torch.equal(table[:, 0, 0, : dim // 2], torch.outer(torch.arange(48, dtype=torch.float32), inv))
    assert concentration == factor
    if mla:
        assert softmax == pytest.approx(scaling, rel=1e-15, abs=0)  # (qk)^-0.5·m·m vs m·m/sqrt(qk): rounding


def test_a_family_without_yarn_refuses_to_export_it() -> None:
    """A NeMo config with GPTModel's YaRN given to a family whose table has no YaRN (a
    Megatron-Bridge GPTModelProvider section read as Llama, say) is refused, not exported
    as plain RoPE."""
    from nemo_convert.errors import UnsupportedError

    llama = api.get_registry().families["llama"].record
    cfg = {"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "ffn_hidden_size": 8, "layernorm_epsilon": 1e-5,
           "nemo_convert": {"vocab_size": 8}, **_as_hf(8, 1e4, 64, {"factor": 4.0}, mla=False)}
    with pytest.raises(UnsupportedError, match="YaRN RoPE: this family's table does not translate it"):
        llama.config_to_hf(cfg)
