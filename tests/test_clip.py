"""CLIP: HF CLIPModel → .nemo (MegatronCLIPModel) → HF on tiny random models: bit-identical
tensors, config.json restored key for key, identical logits, and NeMo key names exactly as
NeMo's converter writes them (nemo-formats.md §3)."""

from __future__ import annotations

import io
import os
import re
import tarfile

import pytest
from conftest import folder_factory
from tiny_models import read_json
import torch
from tiny_models import hf_tensors

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from tiny_multimodal import make_tiny_clip

NEMO_CLIP = "nemo.collections.multimodal.models.vision_language_foundation.clip.megatron_clip_models.MegatronCLIPModel"


@pytest.fixture
def tiny_clip(tmp_path):
    return folder_factory(tmp_path, make_tiny_clip, "clip")





def clip_logits(folder: str) -> torch.Tensor:
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(folder, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn((2, 3, 28, 28), generator=g)
    ids = torch.tensor([[0, 5, 9, 33, 2, 1, 1], [0, 77, 100, 3, 4, 5, 2]])
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pixels).logits_per_image


def legacy_state_dict(nemo: str) -> dict[str, torch.Tensor]:
    with tarfile.open(nemo) as tar:
        data = tar.extractfile("./model_weights.ckpt").read()  # type: ignore[union-attr]
    return torch.load(io.BytesIO(data), weights_only=True)


def _reference_suffixes() -> list[tuple[str, str]]:
    out = []
    for hf, nemo in [("layer_norm1", "self_attention.linear_qkv.layer_norm_"),
                     ("layer_norm2", "mlp.linear_fc1.layer_norm_")]:
        out += [(f".{hf}.{p}", f".{nemo}{p}") for p in ("weight", "bias")]
    for hf, nemo in [("self_attn.out_proj", "self_attention.linear_proj"), ("mlp.fc1", "mlp.linear_fc1"),
                     ("mlp.fc2", "mlp.linear_fc2"), ("pre_layrnorm", "ln_pre"), ("post_layernorm", "final_layernorm"),
                     ("final_layer_norm", "final_layernorm")]:
        out += [(f".{hf}.{p}", f".{nemo}.{p}") for p in ("weight", "bias")]
    return out + [(".embeddings.patch_embedding.weight", ".conv1.weight"),
                  (".embeddings.class_embedding", ".class_token"),
                  (".embeddings.token_embedding.weight", ".embedding.word_embeddings.weight")]


def reference_nemo_keys(hf_keys: list[str]) -> set[str]:
    """The NeMo keys of nemo-formats.md §3.2, derived literally from the HF keys: prefix
    rewrite, exact renames, suffix renames (first match wins), q/k/v fused into
    ``linear_qkv`` (k/v dropped), position_ids dropped; then ``model.`` (the .nemo adds it)."""
    out = set()
    for k in hf_keys:
        if k.endswith("position_ids") or ".k_proj." in k or ".v_proj." in k:
            continue
        k = k.replace("text_model.encoder.layers", "text_encoder.decoder.layers")
        k = k.replace("vision_model.encoder.layers", "vision_encoder.decoder.layers")
        k = re.sub(r"^vision_model\.", "vision_encoder.", k)
        k = re.sub(r"^text_model\.", "text_encoder.", k)
        k = {"text_projection.weight": "text_encoder.head.weight",
             "visual_projection.weight": "vision_encoder.head.weight"}.get(k, k)
        for old, new in _reference_suffixes():
            if k.endswith(old):
                k = k[: -len(old)] + new
                break
        k = {"vision_encoder.embeddings.position_embedding.weight": "vision_encoder.position_embeddings.weight",
             "text_encoder.embeddings.position_embedding.weight":
                 "text_encoder.embedding.position_embeddings.weight"}.get(k, k)
        k = k.replace(".self_attn.q_proj.", ".self_attention.linear_qkv.")
        out.add("model." + k)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_roundtrip_bit_exact_config_and_logits(tmp_path, tiny_clip, dtype):
    src = tiny_clip(dtype=dtype)
    nemo, back = str(tmp_path / "clip.nemo"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo)
    assert rep.family == "clip" and rep.layout == "legacy" and rep.dropped == []
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert read_json(os.path.join(src, "config.json")) == read_json(os.path.join(back, "config.json"))
    with open(os.path.join(src, "tokenizer_config.json"), "rb") as f1, \
            open(os.path.join(back, "tokenizer_config.json"), "rb") as f2:
        assert f1.read() == f2.read()
    assert torch.equal(clip_logits(src), clip_logits(back))


def test_nemo_keys_and_shapes_are_nemo_converters(tmp_path, tiny_clip):
    src = tiny_clip()
    nemo = str(tmp_path / "clip.nemo")
    api.import_hf(src, nemo)
    with tarfile.open(nemo) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert "./model_weights.ckpt" in names and not any("model_weights/" in n for n in names)
    sd = legacy_state_dict(nemo)
    hf = hf_tensors(src)
    assert set(sd) == reference_nemo_keys(list(hf))
    # 3 vision + 2 text layers, each 12 tensors; 7 vision + 6 text non-layer tensors; logit_scale
    assert len(sd) == 5 * 12 + 7 + 6 + 1
    assert sd["model.vision_encoder.class_token"].shape == (1, 1, 48)
    assert torch.equal(sd["model.vision_encoder.class_token"].flatten(),
                       hf["vision_model.embeddings.class_embedding"])
    assert sd["model.logit_scale"].shape == () and torch.equal(sd["model.logit_scale"], hf["logit_scale"])
    assert sd["model.vision_encoder.decoder.layers.2.self_attention.linear_qkv.weight"].shape == (3 * 48, 48)
    assert sd["model.text_encoder.decoder.layers.1.self_attention.linear_qkv.bias"].shape == (3 * 32,)


@pytest.mark.parametrize("tower,prefix,hidden", [("vision", "vision_model", 48), ("text", "text_model", 32)])
def test_qkv_is_fused_per_head(tmp_path, tiny_clip, tower, prefix, hidden):
    """MHA in NeMo's order: per head h, [q_h; k_h; v_h] (weights and biases)."""
    src = tiny_clip()
    nemo = str(tmp_path / "clip.nemo")
    api.import_hf(src, nemo)
    sd, hf = legacy_state_dict(nemo), hf_tensors(src)
    heads, d = 4, hidden // 4
    for what in ("weight", "bias"):
        fused = sd[f"model.{tower}_encoder.decoder.layers.1.self_attention.linear_qkv.{what}"]
        q, k, v = (hf[f"{prefix}.encoder.layers.1.self_attn.{p}_proj.{what}"] for p in "qkv")
        for h in range(heads):
            block = fused[3 * h * d:3 * (h + 1) * d]
            assert torch.equal(block[:d], q[h * d:(h + 1) * d])
            assert torch.equal(block[d:2 * d], k[h * d:(h + 1) * d])
            assert torch.equal(block[2 * d:], v[h * d:(h + 1) * d])


def test_config_translation(tmp_path, tiny_clip):
    src = tiny_clip()
    nemo = str(tmp_path / "clip.nemo")
    api.import_hf(src, nemo)
    with api.open_checkpoint(nemo) as ck:
        cfg = ck.config
    assert cfg["target"] == NEMO_CLIP
    assert cfg["mcore_gpt"] is True and cfg["transformer_engine"] is True and cfg["output_dim"] == 24
    v, t = cfg["vision"], cfg["text"]
    assert (v["num_layers"], v["hidden_size"], v["ffn_hidden_size"], v["num_attention_heads"]) == (3, 48, 64, 4)
    assert (v["patch_dim"], v["img_h"], v["img_w"], v["class_token_length"]) == (14, 28, 28, 1)
    assert v["max_position_embeddings"] == 5 and v["position_embedding_type"] == "learned_absolute"
    assert (t["num_layers"], t["hidden_size"], t["ffn_hidden_size"], t["num_attention_heads"]) == (2, 32, 48, 4)
    assert t["encoder_seq_length"] == t["max_position_embeddings"] == 16
    assert v["activation"] == t["activation"] == "approx-gelu"
    assert v["normalization"] == t["normalization"] == "layernorm"
    assert cfg["nemo_convert"]["vocab_size"] == 300


def test_gelu_variant_and_unsupported_activation(tmp_path, tiny_clip):
    src = tiny_clip(text={"hidden_act": "gelu"}, vision={"hidden_act": "gelu"})
    nemo, back = str(tmp_path / "clip.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo)
    with api.open_checkpoint(nemo) as ck:
        assert ck.config["vision"]["activation"] == ck.config["text"]["activation"] == "gelu"
    api.export_hf(nemo, back)
    assert torch.equal(clip_logits(src), clip_logits(back))

    from nemo_convert_clip.config import clip_config_to_nemo

    with pytest.raises(UnsupportedError, match="hidden_act='relu'"):
        clip_config_to_nemo({"text_config": {"hidden_act": "relu"}})


def test_sparse_hub_config_takes_transformers_defaults():
    from nemo_convert_clip.config import clip_config_to_nemo

    cfg = clip_config_to_nemo({"architectures": ["CLIPModel"], "model_type": "clip",
                               "text_config": {"hidden_size": 768}, "vision_config": {"patch_size": 14}})
    assert cfg["output_dim"] == 512
    t, v = cfg["text"], cfg["vision"]
    assert (t["hidden_size"], t["num_layers"], t["max_position_embeddings"]) == (768, 12, 77)
    assert (v["hidden_size"], v["img_h"], v["max_position_embeddings"]) == (768, 224, 257)
    assert cfg["make_vocab_size_divisible_by"] == 128  # 49408 = 128 · 386: no padding


def test_position_ids_buffers_are_dropped_and_reported(tmp_path, tiny_clip):
    """Older CLIP checkpoints carry ``*.embeddings.position_ids``: not weights."""
    from safetensors.torch import load_file, save_file

    src = tiny_clip()
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    tensors["text_model.embeddings.position_ids"] = torch.arange(16).unsqueeze(0)
    tensors["vision_model.embeddings.position_ids"] = torch.arange(5).unsqueeze(0)
    save_file(tensors, path, metadata={"format": "pt"})
    nemo, back = str(tmp_path / "clip.nemo"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo)
    assert sorted(rep.dropped) == ["text_model.embeddings.position_ids", "vision_model.embeddings.position_ids"]
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) - set(b) == {"text_model.embeddings.position_ids", "vision_model.embeddings.position_ids"}
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_dist_layout_also_roundtrips(tmp_path, tiny_clip):
    """Not what NeMo writes for CLIP, but the towers stack separately and come back."""
    src = tiny_clip()
    nemo, back = str(tmp_path / "clip.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo, layout="dist")
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
