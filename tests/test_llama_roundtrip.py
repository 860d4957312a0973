"""HF → .nemo → HF on tiny random Llamas: bit-identical tensors, identical config and
logits, for every geometry and option the family supports."""

from __future__ import annotations

import json
import os

import pytest
import torch
from tiny_models import hf_tensors

from nemo_convert import api
from nemo_convert.tensors.safetensors_source import SafetensorsFile

VARIANTS = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "mqa": dict(num_attention_heads=4, num_key_value_heads=1),
    "head_dim": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24),
    "tied": dict(tie_word_embeddings=True),
    "llama3_rope": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
    "linear_rope": dict(rope_scaling={"type": "linear", "factor": 2.0}),
    "biases": dict(attention_bias=True, mlp_bias=True),
}



def logits(folder: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    ids = torch.tensor([[1, 5, 9, 33, 2, 77, 100, 3]])
    with torch.no_grad():
        return model(ids).logits


def assert_same_checkpoint(a: str, b: str) -> None:
    ta, tb = hf_tensors(a), hf_tensors(b)
    # A tied source may or may not store lm_head; transformers never needs it on export.
    assert set(tb) <= set(ta) and set(ta) - set(tb) <= {"lm_head.weight"}, (set(ta) ^ set(tb))
    for k in tb:
        assert ta[k].dtype == tb[k].dtype, k
        assert torch.equal(ta[k], tb[k]), k
    ca = json.load(open(os.path.join(a, "config.json")))
    cb = json.load(open(os.path.join(b, "config.json")))
    assert ca == cb


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_roundtrip_bit_exact_and_same_logits(tmp_path, tiny_llama, variant):
    src = tiny_llama(**VARIANTS[variant])
    nemo = str(tmp_path / "m.nemo")
    back = str(tmp_path / "back")
    api.import_hf(src, nemo)
    api.export_hf(nemo, back)
    assert_same_checkpoint(src, back)
    assert torch.equal(logits(src), logits(back))
    with open(os.path.join(back, "tokenizer.model"), "rb") as f1, open(os.path.join(src, "tokenizer.model"), "rb") as f2:
        assert f1.read() == f2.read()


@pytest.mark.parametrize("layout", ["dist", "legacy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layouts_and_dtypes(tmp_path, tiny_llama, layout, dtype):
    src = tiny_llama(dtype=dtype)
    nemo = str(tmp_path / "m.nemo")
    back = str(tmp_path / "back")
    rep = api.import_hf(src, nemo, layout=layout)
    assert rep.layout == layout
    api.export_hf(nemo, back)
    assert_same_checkpoint(src, back)
    assert torch.equal(logits(src, dtype), logits(back, dtype))


def test_unpacked_folder_form_roundtrips(tmp_path, tiny_llama):
    src = tiny_llama()
    out = str(tmp_path / "m_dir")
    api.import_hf(src, out, packed=False)
    assert os.path.isfile(os.path.join(out, "model_config.yaml"))
    api.export_hf(out, str(tmp_path / "back"))
    assert_same_checkpoint(src, str(tmp_path / "back"))


def test_dtype_cast_warns_and_casts(tmp_path, tiny_llama):
    src = tiny_llama(dtype=torch.float32)
    nemo = str(tmp_path / "m.nemo")
    rep = api.import_hf(src, nemo, dtype="bf16")
    assert any("loses precision" in w for w in rep.warnings)
    info = api.inspect_checkpoint(nemo)
    assert {t["dtype"] for t in info["tensors"]} == {"bfloat16"}
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    t_src, t_back = hf_tensors(src), hf_tensors(back)
    for k, v in t_back.items():
        assert torch.equal(v, t_src[k].to(torch.bfloat16)), k
    cfg = json.load(open(os.path.join(back, "config.json")))
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"


def test_sharded_export_and_sharded_import(tmp_path, tiny_llama):
    src = tiny_llama()
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    back = str(tmp_path / "back")
    api.export_hf(nemo, back, max_shard_bytes=100_000)
    shards = [f for f in os.listdir(back) if f.endswith(".safetensors")]
    assert len(shards) > 2
    index = json.load(open(os.path.join(back, "model.safetensors.index.json")))
    assert set(index["weight_map"].values()) == set(shards)
    assert_same_checkpoint(src, back)
    # the sharded folder is itself a valid import source
    nemo2 = str(tmp_path / "m2.nemo")
    api.import_hf(back, nemo2)
    back2 = str(tmp_path / "back2")
    api.export_hf(nemo2, back2)
    assert_same_checkpoint(src, back2)


def test_exported_shards_readable_by_safetensors_library(tmp_path, tiny_llama):
    from safetensors.torch import load_file

    src = tiny_llama(dtype=torch.bfloat16)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    for f in os.listdir(back):
        if f.endswith(".safetensors"):
            ours = SafetensorsFile(os.path.join(back, f))
            theirs = load_file(os.path.join(back, f))
            assert set(theirs) == set(ours.keys())
            for k, v in theirs.items():
                assert torch.equal(v, ours.load(k))
