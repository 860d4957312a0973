"""LLaVA → NeVA .nemo → LLaVA on tiny random models: bit-identical tensors in the source's
own key spelling, config.json restored key for key, identical logits with an image in the
input, NeVA's key names (nemo-formats.md §4), the NeVA tokenizer patch, and the vision
tower stored by default (export rebuilds the whole checkpoint), only referenced with
``reference_vision_tower`` (NeMo's converter)."""

from __future__ import annotations

import dataclasses
import os
import tarfile

import pytest
from conftest import folder_factory
from tiny_models import read_json
import torch
from tiny_models import hf_tensors

from nemo_convert import FamilyOptions, NemoTarget, api
from tiny_multimodal import LLAVA_IMAGE_TOKEN, LLAVA_IMAGE_TOKENS, make_tiny_llava, rename_safetensors_keys

NEVA = "nemo.collections.multimodal.models.multimodal_llm.neva.neva_model.MegatronNevaModel"
PROJ = "embedding.word_embeddings.adapter_layer.mm_projector_adapter.mm_projector."
TOWER = "embedding.word_embeddings.vision_encoder.vision_model."
EMBED = {"embed_vision_tower": True}
#: the core passes the source's tensor names to the family (spelling detection)
CORE_SOURCE_OPTIONS = "from_source" in {f.name for f in dataclasses.fields(FamilyOptions)}
#: the core can keep a family's non-Megatron layer stacks per layer in the dist layout
CORE_DIST_UNSTACKED = "dist_unstacked" in {f.name for f in dataclasses.fields(NemoTarget)}

#: transformers 5 save_pretrained (the builder's output) → the other spellings real
#: checkpoints have (first matching prefix wins).
SPELLINGS = {
    "v5_save": [],
    "hub": [("vision_tower.", "vision_tower.vision_model.")],
    "module_layout": [("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                      ("vision_tower.", "model.vision_tower."),
                      ("multi_modal_projector.", "model.multi_modal_projector.")],
    "module_layout_v4_tower": [("language_model.model.", "model.language_model."),
                               ("language_model.lm_head.", "lm_head."),
                               ("vision_tower.", "model.vision_tower.vision_model."),
                               ("multi_modal_projector.", "model.multi_modal_projector.")],
}


@pytest.fixture
def tiny_llava(tmp_path):
    return folder_factory(tmp_path, make_tiny_llava, "llava")





def import_options(src: str, **extra) -> dict:
    """Import options; the key spelling is passed explicitly only while the core cannot
    show the family the source's tensor names."""
    opts = dict(extra)
    if not CORE_SOURCE_OPTIONS:
        from nemo_convert_llava.config import detect_hf_key_spelling

        opts["hf_key_spelling"] = detect_hf_key_spelling(hf_tensors(src))
    return opts


def llava_logits(folder: str) -> torch.Tensor:
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn((1, 3, 28, 28), generator=g)
    ids = torch.tensor([[1, 5, *[LLAVA_IMAGE_TOKEN] * LLAVA_IMAGE_TOKENS, 9, 33, 2, 77, 100]])
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pixels).logits


def nemo_config(nemo: str) -> dict:
    with api.open_checkpoint(nemo) as ck:
        return ck.config


def nemo_keys(nemo: str) -> set[str]:
    with api.open_checkpoint(nemo) as ck:
        return set(ck.source.keys())


def raw_dist_keys(nemo: str, tmp: str) -> set[str]:
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    with tarfile.open(nemo) as tar:
        tar.extractall(tmp, filter="data")
    src = DistCheckpointSource.from_dir(os.path.join(tmp, "model_weights"))
    try:
        return set(src.raw_keys())
    finally:
        src.close()


def reference_logical_keys(hf_keys: list[str]) -> set[str]:
    """NeVA's names for a v5-saved LLaVA, from the table of nemo-formats.md §4.2 (without
    ``model.``), plus the HF tower under NeVA's vision-encoder prefix (§4.1)."""
    table = {"self_attn.o_proj.weight": "self_attention.linear_proj.weight",
             "mlp.down_proj.weight": "mlp.linear_fc2.weight",
             "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
             "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
             "self_attn.q_proj.weight": "self_attention.linear_qkv.weight",
             "mlp.gate_proj.weight": "mlp.linear_fc1.weight"}
    out = set()
    for k in hf_keys:
        if k.startswith("language_model.model.layers."):
            i, rest = k[len("language_model.model.layers."):].split(".", 1)
            if rest in table:
                out.add(f"decoder.layers.{i}.{table[rest]}")
        elif k.startswith("multi_modal_projector.linear_"):
            n, what = k[len("multi_modal_projector.linear_"):].split(".")
            out.add(f"{PROJ}{2 * (int(n) - 1)}.{what}")
        elif k.startswith("vision_tower."):
            out.add(TOWER + k[len("vision_tower."):])
        else:
            out.add({"language_model.model.embed_tokens.weight": "embedding.word_embeddings.weight",
                     "language_model.model.norm.weight": "decoder.final_layernorm.weight",
                     "language_model.lm_head.weight": "output_layer.weight"}[k])
    return out


def test_roundtrip_embedded_bit_exact_config_logits_tokenizer(tmp_path, tiny_llava):
    src = tiny_llava()
    nemo, back = str(tmp_path / "neva.nemo"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo, options=EMBED)  # nothing else needed for what transformers saves
    assert rep.family == "llava" and rep.layout == "dist" and rep.dropped == []
    # the tokenizer patch is reported, not silent
    assert any("vocabulary 300 → 308" in n and "<extra_id_7>" in n for n in rep.notes), rep.notes
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert read_json(os.path.join(src, "config.json")) == read_json(os.path.join(back, "config.json"))
    assert torch.equal(llava_logits(src), llava_logits(back))


def test_bf16_legacy_layout_and_tensor_parallel(tmp_path, tiny_llava):
    from nemo_convert.convert.nemo_write import Parallelism

    src = tiny_llava(dtype=torch.bfloat16)
    nemo, back = str(tmp_path / "neva.nemo"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo, layout="legacy", parallel=Parallelism(2, 2), options=import_options(src, **EMBED))
    assert rep.layout == "legacy"
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b)
    assert all(b[k].dtype == torch.bfloat16 and torch.equal(a[k], b[k]) for k in a)


def test_tokenizer_gets_exactly_the_eight_neva_tokens(tmp_path, tiny_llava):
    import sentencepiece as spm

    src = tiny_llava()
    nemo = str(tmp_path / "neva.nemo")
    api.import_hf(src, nemo, options=import_options(src))
    cfg = nemo_config(nemo)
    assert cfg["tokenizer"]["library"] == "sentencepiece"
    old = spm.SentencePieceProcessor(model_file=os.path.join(src, "tokenizer.model"))
    with api.open_checkpoint(nemo) as ck:
        patched = spm.SentencePieceProcessor(model_proto=ck.handle.artifact(cfg["tokenizer"]["model"]))
    n = old.get_piece_size()
    assert patched.get_piece_size() == n + 8
    for i in range(8):
        assert patched.piece_to_id(f"<extra_id_{i}>") == n + i
    assert [patched.id_to_piece(i) for i in range(n)] == [old.id_to_piece(i) for i in range(n)]
    assert patched.encode("a <extra_id_3> b") != old.encode("a <extra_id_3> b")


def test_nemo_names_match_neva(tmp_path, tiny_llava):
    src = tiny_llava()
    nemo = str(tmp_path / "neva.nemo")
    api.import_hf(src, nemo, options=import_options(src, **EMBED))
    hf = hf_tensors(src)
    assert nemo_keys(nemo) == reference_logical_keys(list(hf))
    raw = raw_dist_keys(nemo, str(tmp_path / "x"))
    # the language model is stacked (§1.6) under model.; the projector is not
    llm = {k for k in raw if not k.startswith("model." + TOWER)}
    expected = set()
    for k in reference_logical_keys(list(hf)):
        if k.startswith(TOWER):
            continue
        parts = k.split(".")
        if k.startswith("decoder.layers."):
            parts.pop(2)
        expected.add("model." + ".".join(parts))
    assert llm == expected
    assert "model." + PROJ + "0.weight" in raw and "model." + PROJ + "2.bias" in raw


def test_embedded_tower_is_stored_per_layer_like_neva(tmp_path, tiny_llava):
    """NeVA saves its HF tower with make_sharded_tensors_for_checkpoint: one key per layer."""
    src = tiny_llava()
    nemo = str(tmp_path / "neva.nemo")
    api.import_hf(src, nemo, options=import_options(src, **EMBED))
    raw = raw_dist_keys(nemo, str(tmp_path / "x"))
    tower = {k for k in raw if k.startswith("model." + TOWER)}
    hf = [k for k in hf_tensors(src) if k.startswith("vision_tower.")]
    assert tower == {"model." + TOWER + k[len("vision_tower."):] for k in hf}


def test_neva_config(tmp_path, tiny_llava):
    src = tiny_llava()
    nemo = str(tmp_path / "neva.nemo")
    api.import_hf(src, nemo, options=import_options(src, **EMBED))
    cfg = nemo_config(nemo)
    assert cfg["target"] == NEVA and cfg["mcore_gpt"] is True
    assert (cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_query_groups"]) == (2, 64, 4, 2)
    mm = cfg["mm_cfg"]
    assert mm["mm_mlp_adapter_type"] == "mlp2x_gelu" and mm["use_im_start_end"] is False
    ve = mm["vision_encoder"]
    assert ve["from_hf"] is True and ve["from_pretrained"] == "openai/clip-vit-large-patch14"
    assert (ve["hidden_size"], ve["patch_dim"], ve["crop_size"]) == (32, 14, [28, 28])
    assert (ve["vision_select_layer"], ve["vision_select_feature"], ve["class_token_length"]) == (-2, "patch", 1)
    assert cfg["data"]["image_token_len"] == LLAVA_IMAGE_TOKENS
    assert cfg["data"]["conv_template"] == mm["llm"]["model_type"] == "v1"
    assert cfg["nemo_convert"]["embed_vision_tower"] is True
    assert cfg["nemo_convert"]["hf_key_spelling"]["vision_tower"] == "vision_tower."


def test_the_default_import_embeds_the_tower_and_exports_whole(tmp_path, tiny_llava):
    """No option: the tower is stored, so export rebuilds the source bit for bit."""
    src = tiny_llava(tokenizer=False)
    nemo, back = str(tmp_path / "neva.nemo"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo)
    assert not rep.dropped
    assert nemo_config(nemo)["nemo_convert"]["embed_vision_tower"] is True
    assert any(k.startswith(TOWER) for k in nemo_keys(nemo))
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert read_json(os.path.join(src, "config.json")) == read_json(os.path.join(back, "config.json"))


def test_both_tower_options_at_once_are_refused(tmp_path, tiny_llava):
    from nemo_convert.errors import ConfigError

    src = tiny_llava(tokenizer=False)
    with pytest.raises(ConfigError, match="contradict"):
        api.import_hf(src, str(tmp_path / "m.nemo"), options={"embed_vision_tower": True,
                                                               "reference_vision_tower": True})


def test_referenced_tower_is_dropped_and_export_refuses(tmp_path, tiny_llava):
    from nemo_convert_llava.config import VisionTowerNotEmbedded

    src = tiny_llava()
    nemo = str(tmp_path / "neva.nemo")
    rep = api.import_hf(src, nemo, options=import_options(src, reference_vision_tower=True))
    tower = sorted(k for k in hf_tensors(src) if k.startswith("vision_tower."))
    assert sorted(rep.dropped) == tower and len(tower) == 3 * 16 + 7
    keys = nemo_keys(nemo)
    assert not any("vision" in k for k in keys)
    assert keys == {k for k in reference_logical_keys(list(hf_tensors(src))) if not k.startswith(TOWER)}
    cfg = nemo_config(nemo)
    assert cfg["nemo_convert"]["embed_vision_tower"] is False
    assert cfg["mm_cfg"]["vision_encoder"]["from_pretrained"] == "openai/clip-vit-large-patch14"
    with pytest.raises(VisionTowerNotEmbedded, match="references its vision tower.*without --reference-vision-tower"):
        api.export_hf(nemo, str(tmp_path / "back"))
    assert not os.path.exists(tmp_path / "back")


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_key_spelling_roundtrips_in_its_own_spelling(tmp_path, tiny_llava, spelling):
    src = tiny_llava(tokenizer=False)
    reference = llava_logits(src)
    rename_safetensors_keys(src, SPELLINGS[spelling])
    nemo, back = str(tmp_path / "neva.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo, options=import_options(src, **EMBED))
    api.export_hf(nemo, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # transformers loads every spelling as the same model
    assert torch.equal(llava_logits(back), reference)


def test_spelling_detection():
    from nemo_convert_llava.config import HUB_SPELLING, detect_hf_key_spelling

    assert detect_hf_key_spelling(["language_model.model.norm.weight", "language_model.lm_head.weight",
                                   "vision_tower.vision_model.post_layernorm.weight",
                                   "multi_modal_projector.linear_1.weight"]) == HUB_SPELLING
    assert detect_hf_key_spelling(["model.language_model.norm.weight", "lm_head.weight",
                                   "model.vision_tower.vision_model.post_layernorm.weight",
                                   "model.multi_modal_projector.linear_1.weight"]) == {
        "language_model": "model.language_model.", "lm_head": "lm_head.",
        "vision_tower": "model.vision_tower.vision_model.", "projector": "model.multi_modal_projector."}
    assert detect_hf_key_spelling(["vision_tower.encoder.layers.0.mlp.fc1.weight"])["vision_tower"] == "vision_tower."


def test_sparse_hub_config_and_unsupported_variants():
    from nemo_convert.errors import ConfigError, UnsupportedError
    from nemo_convert_llava.config import llava_config_to_nemo

    # llava-hf/llava-1.5-7b-hf's config.json is this sparse: the rest are transformers defaults
    hub = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 32000,
           "projector_hidden_act": "gelu", "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
           "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
                           "model_type": "llama", "rms_norm_eps": 1e-05, "torch_dtype": "float16",
                           "vocab_size": 32064},
           "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                             "model_type": "clip_vision_model", "num_attention_heads": 16,
                             "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768},
           "torch_dtype": "float16", "transformers_version": "4.36.0.dev0"}
    cfg = llava_config_to_nemo(hub)
    assert (cfg["num_layers"], cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["encoder_seq_length"]) == (
        32, 4096, 11008, 4096)
    assert cfg["precision"] == 16 and cfg["make_vocab_size_divisible_by"] == 64
    ve = cfg["mm_cfg"]["vision_encoder"]
    assert ve["from_pretrained"] == "openai/clip-vit-large-patch14-336" and ve["crop_size"] == [336, 336]
    assert cfg["data"]["image_token_len"] == 576
    assert cfg["nemo_convert"]["hf_key_spelling"]["vision_tower"] == "vision_tower.vision_model."

    with pytest.raises(UnsupportedError, match="projector_hidden_act"):
        llava_config_to_nemo({**hub, "projector_hidden_act": "silu"})
    with pytest.raises(UnsupportedError, match="siglip"):
        llava_config_to_nemo({**hub, "vision_config": {"model_type": "siglip_vision_model"}})
    with pytest.raises(UnsupportedError, match="mistral"):
        llava_config_to_nemo({**hub, "text_config": {"model_type": "mistral"}})
    with pytest.raises(ConfigError, match="hf_key_spelling"):
        llava_config_to_nemo(hub, hf_key_spelling={"vision_tower": "tower."})


def test_composed_from_llama_and_clip_mappings():
    """The LM is the Llama mapping under a prefix; the tower is the CLIP vision tower's
    inventory (no copies)."""
    from nemo_convert_clip.family import clip_vision_tower_mapping
    from nemo_convert_llama.family import llama_mapping
    from nemo_convert_llava.config import llava_config_to_nemo
    from nemo_convert_llava.family import llava_mapping

    cfg = llava_config_to_nemo({"text_config": {"num_hidden_layers": 2}}, embed_vision_tower=True)
    parts = llava_mapping(cfg).parts()
    lm_hf = set(llama_mapping(cfg).hf_names())
    assert {n for p in parts[:1] for n in p.hf_names()} == {"language_model." + n for n in lm_hf}
    tower = {"vision_tower.vision_model." + n for n in clip_vision_tower_mapping().hf_names()}
    assert tower <= {n for p in parts for n in p.hf_names()}
