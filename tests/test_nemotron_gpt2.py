"""The Nemotron and GPT-2 families on real configs: the ``config.json`` files under
``tests/data/hub_configs`` (strict both ways, restored key for key), NVIDIA's own NeMo
training configs under ``tests/data/nemo_configs`` (a NeMo-native ``.nemo`` exports to
the right class with the source's logits), GPT-2's refusals, and GPT-2B-001's
architecture: refused, because the one HF class that runs the rest of it needs a
``1 + γ`` that bfloat16 cannot store (measured here)."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import torch
import yaml
from test_family_matrix import logits, make_model

from nemo_convert import api
from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.plugins.manager import get_registry

DATA = os.path.join(os.path.dirname(__file__), "data")
TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"


def hub(family: str, name: str) -> dict:
    with open(os.path.join(DATA, "hub_configs", family, name)) as f:
        return json.load(f)


def launcher_model(name: str) -> dict:
    """The ``model:`` section of an NVIDIA training config (what its ``.nemo`` carries)."""
    with open(os.path.join(DATA, "nemo_configs", name)) as f:
        return yaml.safe_load(f)["model"]


# -- real config.json files: every key translated or harmless, restored key for key ----------------

@pytest.mark.parametrize("family, name", [("nemotron", "nemotron_4_4b_trtllm.json"),
                                          ("gpt2", "gpt2_saved_4.38.json"), ("gpt2", "gpt2_large_hub.json")])
def test_real_configs_translate_and_restore(family, name):
    fam = get_registry().family(family)
    src = hub(family, name)
    cfg = fam.config_to_nemo(copy.deepcopy(src))
    cfg["nemo_convert"] = {"hf_config": copy.deepcopy(src), "family": family}
    assert fam.config_to_hf(cfg) == src
    if family == "nemotron":  # Minitron-4B's shape: GQA 24 heads / 8 groups, head 128, half rotary
        assert (cfg["num_query_groups"], cfg["rotary_percentage"], cfg["activation"]) == (8, 0.5, "squared-relu")
        assert cfg["normalization"] == "layernorm1p" and cfg["layernorm_zero_centered_gamma"] is True
    else:
        assert cfg["activation"] == "gelu" and cfg["openai_gelu"] is True  # gelu_new: the tanh approximation
        assert cfg["ffn_hidden_size"] == 4 * cfg["hidden_size"] and cfg["share_embeddings_and_output_weights"]


def test_a_gptq_gpt2_is_refused_by_name():
    with pytest.raises(ConfigError, match="quantization_config=.* is not understood by family gpt2"):
        get_registry().family("gpt2").config_to_nemo(hub("gpt2", "gpt2_gptq.json"))


@pytest.mark.parametrize("family, changes, words", [
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
    ("gpt2", dict(reorder_and_upcast_attn=True), "reorder_and_upcast_attn=True"),
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention=True"),
    ("gpt2", dict(scale_attn_weights=False), "scale_attn_weights=False"),
    ("gpt2", dict(activation_function="relu"), "activation_function='relu'"),
    ("gpt2", dict(activation_function="quick_gelu"), "activation_function='quick_gelu'"),
    ("nemotron", dict(hidden_act="silu"), "hidden_act='silu'"),
    ("nemotron", dict(kv_channels=64), "kv_channels=64 while transformers runs head_dim=128"),
    ("nemotron", dict(layer_norm_eps=1e-6), "layer_norm_eps=1e-06 while transformers runs norm_eps=1e-05"),
    ("nemotron", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "'linear'"),
])
def test_features_the_other_side_cannot_compute_are_refused(family, changes, words):
    src = {**hub(family, "nemotron_4_4b_trtllm.json" if family == "nemotron" else "gpt2_saved_4.38.json"), **changes}
    with pytest.raises((UnsupportedError, ConfigError)) as ei:
        get_registry().family(family).config_to_nemo(src)
    assert words in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def test_gpt2_exact_gelu_is_the_erf_gelu_in_nemo():
    """``activation_function: gelu`` (erf) needs Megatron's unfused path: the import says so."""
    cfg = get_registry().family("gpt2").config_to_nemo({**hub("gpt2", "gpt2_saved_4.38.json"),
                                                        "activation_function": "gelu"})
    assert (cfg["activation"], cfg["openai_gelu"], cfg["bias_activation_fusion"]) == ("gelu", False, False)


# -- NeMo-native configs as NVIDIA wrote them ----------------------------------------------------------

TINY = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, encoder_seq_length=64,
            max_position_embeddings=64, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def _native(nemo: str, model: dict, **sizes) -> None:
    """Replace ``nemo``'s config by an NVIDIA config's model section (tiny sizes), as NeMo
    writes it: its target, no record of ours but the true vocabulary NeMo knows from its
    tokenizer (the archive has none, and no tokenizer artifact)."""
    path = os.path.join(nemo, "model_config.yaml")
    ours = yaml.safe_load(open(path))
    cfg = {**model, **TINY, **sizes, "target": TARGET, "precision": 32,
           "nemo_convert": {"vocab_size": ours["nemo_convert"]["vocab_size"]}}
    cfg.pop("optim", None), cfg.pop("data", None)
    cfg["tokenizer"] = {"library": "sentencepiece", "model": None}  # the training config names a cluster path
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)


@pytest.mark.slow
@pytest.mark.parametrize("config, hf_extra, sizes", [
    ("launcher_nemotron_8b.yaml", dict(num_key_value_heads=4, head_dim=16), dict(num_query_groups=None,
                                                                                kv_channels=None)),
    ("launcher_nemotron_4b.yaml", dict(num_key_value_heads=2, head_dim=32), dict(num_query_groups=2, kv_channels=32)),
    ("launcher_nemotron_340b.yaml", dict(num_key_value_heads=2, head_dim=16), dict(num_query_groups=2)),
])
def test_a_nemo_native_nemotron_exports_to_nemotron_for_causal_lm(tmp_path, config, hf_extra, sizes):
    src = make_model(str(tmp_path / "hf"), "nemotron", attention_bias=False, mlp_bias=False, **hf_extra)
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    _native(nemo, launcher_model(config), **sizes)
    back = str(tmp_path / "back")
    rep = api.export_hf(nemo, back)  # no --family: claimed from NVIDIA's own fields
    assert rep.family == "nemotron"
    out = json.load(open(os.path.join(back, "config.json")))
    assert out["architectures"] == ["NemotronForCausalLM"] and out["hidden_act"] == "relu2"
    assert out["partial_rotary_factor"] == 0.5 and out["norm_eps"] == 1e-5
    assert torch.equal(logits(src), logits(back))


@pytest.mark.slow
def test_a_nemo_native_gpt3_exports_to_gpt2_with_the_tanh_gelu(tmp_path):
    """NeMo's GPT defaults (``megatron_gpt_config.yaml``: ``gelu`` under
    ``bias_activation_fusion``, learned positions, LayerNorm, biases, tied) are GPT-2 with
    ``gelu_new``: Megatron's fused bias-GeLU kernel is the tanh approximation."""
    src = make_model(str(tmp_path / "hf"), "gpt2")
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    _native(nemo, launcher_model("nemo_megatron_gpt_config.yaml"))
    back = str(tmp_path / "back")
    assert api.export_hf(nemo, back).family == "gpt2"
    out = json.load(open(os.path.join(back, "config.json")))
    assert out["activation_function"] == "gelu_new" and out["n_inner"] == 96 and out["tie_word_embeddings"]
    assert torch.equal(logits(src), logits(back))
    # The same config without the fused kernel runs the erf GeLU: exported as such
    _native(nemo, {**launcher_model("nemo_megatron_gpt_config.yaml"), "bias_activation_fusion": False})
    erf = str(tmp_path / "erf")
    api.export_hf(nemo, erf)
    assert json.load(open(os.path.join(erf, "config.json")))["activation_function"] == "gelu"


def test_gpt_2b_001s_architecture_is_refused_with_what_would_be_needed(tmp_path):
    """GPT-2B-001 (``launcher_gpt3_2b.yaml``): a gated SwiGLU under zero-centred
    LayerNorms with biases and half rotary. No family computes it; the error says why
    each does not, and Nemotron's reason names what would be needed."""
    src = make_model(str(tmp_path / "hf"), "nemotron", attention_bias=False, mlp_bias=False)
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    _native(nemo, launcher_model("launcher_gpt3_2b.yaml"))
    out = str(tmp_path / "out")
    with pytest.raises(UnsupportedError) as ei:
        api.export_hf(nemo, out)
    msg = str(ei.value)
    assert "no installed model family computes this NeMo config" in msg
    assert "nemotron: activation='fast-swiglu' is a gated MLP under zero-centred LayerNorms (GPT-2B-001's" in msg
    assert "StableLmForCausalLM, would need 1 added to every LayerNorm weight" in msg
    assert "llama: rotary_percentage=0.5" in msg and not os.path.exists(out)
    with pytest.raises(UnsupportedError, match="GPT-2B-001's architecture"):
        api.export_hf(nemo, out, family="nemotron")


def test_baking_one_plus_gamma_into_bfloat16_is_not_exact():
    """Why GPT-2B-001 is refused rather than exported to StableLM: NeMo's ``layernorm1p``
    computes ``(1 + γ)`` in fp32 inside the kernel, from γ stored in bf16; StableLM's
    ``nn.LayerNorm`` would need ``1 + γ`` stored, and bf16 rounds it (7 mantissa bits near
    1: steps of 2^-7). Zero-centred γ are small, so most of them change. In fp32 storage
    the bake is exact (what the kernel computes), but that is a cast the checkpoint did
    not ask for."""
    g = torch.Generator().manual_seed(0)
    gamma = (torch.randn(4096, generator=g) * 0.05).to(torch.bfloat16)  # γ - 1 of a trained norm: small
    exact = 1.0 + gamma.float()  # what the zero-centred kernel multiplies by
    baked = (1.0 + gamma.float()).to(torch.bfloat16)
    changed = (baked.float() != exact).float().mean().item()
    assert changed > 0.9, changed
    assert torch.equal((1.0 + gamma.float()).float(), exact)  # fp32 storage: exact
    x = torch.randn(8, 4096, generator=g)
    ref = torch.nn.functional.layer_norm(x, (4096,), exact, None, 1e-5)
    got = torch.nn.functional.layer_norm(x, (4096,), baked.float(), None, 1e-5)
    assert (ref - got).abs().max().item() > 1e-3  # visible in the normalised activations


# -- the checkpoints themselves -----------------------------------------------------------------------

def test_nemotron_norms_are_copied_as_stored(tmp_path):
    """HF stores γ - 1 and so does NeMo's ``layernorm1p``: no offset either way."""
    from tiny_models import hf_tensors

    src = make_model(str(tmp_path / "hf"), "nemotron")
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    hf = hf_tensors(src)
    with api.open_checkpoint(nemo) as ck:
        got = ck.source.load("decoder.layers.1.mlp.linear_fc1.layer_norm_weight")
        assert torch.equal(got, hf["model.layers.1.post_attention_layernorm.weight"])
        got = ck.source.load("decoder.layers.0.self_attention.linear_qkv.layer_norm_bias")
        assert torch.equal(got, hf["model.layers.0.input_layernorm.bias"])
        assert torch.equal(ck.source.load("decoder.layers.0.mlp.linear_fc1.weight"), hf["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.slow
def test_a_gpt2_with_an_untied_head_round_trips(tmp_path):
    src = make_model(str(tmp_path / "hf"), "gpt2", tie_word_embeddings=False)
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo)
    api.export_hf(nemo, back)
    from test_family_matrix import assert_same

    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))


def test_gpt2_refuses_grouped_query_attention_on_export(tmp_path):
    src = make_model(str(tmp_path / "hf"), "gpt2")
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    path = os.path.join(nemo, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    cfg["num_query_groups"] = 2
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    with pytest.raises(UnsupportedError, match="num_query_groups=2: GPT2LMHeadModel computes 4"):
        api.export_hf(nemo, str(tmp_path / "out"))
    shutil.rmtree(nemo)


@pytest.mark.slow
def test_the_hubs_unprefixed_gpt2_layout_imports_and_exports_alike(tmp_path):
    """``openai-community/gpt2``'s own files: names without ``transformer.``, the causal-mask
    buffers ``h.N.attn.bias`` / ``attn.masked_bias`` beside the weights, no ``lm_head``.
    Import reads the spelling from the names, drops the buffers (reported) and writes the
    same NeMo tensors as the prefixed layout; export writes the hub's spelling back, which
    transformers loads with the source's logits."""
    from safetensors.torch import load_file, save_file
    from tiny_models import hf_tensors

    src = make_model(str(tmp_path / "hf"), "gpt2")
    hub_dir = str(tmp_path / "hub")
    os.makedirs(hub_dir)
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(os.path.join(src, "model.safetensors")).items()
               if k != "lm_head.weight"}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, os.path.join(hub_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), hub_dir)
    assert torch.equal(logits(src), logits(hub_dir))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    api.import_hf(src, a, packed=False)
    rep = api.import_hf(hub_dir, b, packed=False)
    assert sorted(rep.dropped) == sorted(f"h.{i}.attn.{n}" for i in range(2) for n in ("bias", "masked_bias"))
    with api.open_checkpoint(a) as ca, api.open_checkpoint(b) as cb:
        assert cb.config["nemo_convert"]["hf_names"] == "unprefixed" and "hf_names" not in ca.config["nemo_convert"]
        assert sorted(ca.source.keys()) == sorted(cb.source.keys())
        assert all(torch.equal(ca.source.load(k), cb.source.load(k)) for k in ca.source.keys())
    back = str(tmp_path / "back")
    api.export_hf(b, back)
    out = hf_tensors(back)
    assert set(out) == {k for k in tensors if ".attn.bias" not in k and "masked_bias" not in k}
    assert all(torch.equal(out[k], tensors[k]) for k in out)
    assert torch.equal(logits(back), logits(src))
