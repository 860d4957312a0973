"""Gemma 2's config facts beyond the family matrix: NeMo 1's spelling of the same model, the
alternating default windows, and what the other families refuse of it."""

from __future__ import annotations

import copy
import json
import os

import pytest

from nemo_convert.errors import UnsupportedError
from nemo_convert.spec import first_difference, spec_of

HUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hub_configs", "gemma2")


def _config(name: str = "google__gemma-2-27b.json") -> dict:
    from nemo_convert_gemma2.family import GEMMA2

    with open(os.path.join(HUB, name)) as f:
        return GEMMA2.config_to_nemo(json.load(f))


def test_nemo1_spelling_is_the_same_model():
    """NeMo 1's converter wrote ``name: megatron_gemma2`` and the three numbers under
    ``mcore_customization_config`` (no post-norm record of ours): the same spec."""
    ours = _config()
    assert ours["name"] == "megatron_gemma2"
    assert ours["mcore_customization_config"] == {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                                                  "query_pre_attn_scalar": 144}
    nemo1 = copy.deepcopy(ours)
    for k in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
        del nemo1[k]
    del nemo1["nemo_convert"]["post_norms"]
    assert first_difference(spec_of(ours), spec_of(nemo1)) is None
    nemo1["name"] = "megatron_gpt"
    assert first_difference(spec_of(ours), spec_of(nemo1))[0] == "nemo_convert.post_norms"


def test_gemma2_2b_windows_every_even_layer_by_default():
    """google/gemma-2-2b has no ``layer_types``: Gemma2Config's default alternates from a
    sliding layer 0 (configuration_gemma2.py lines 93-97)."""
    spec = spec_of(_config("google__gemma-2-2b.json"))
    assert spec.attention.window == 4096
    assert spec.attention.window_pattern == tuple(i % 2 == 0 for i in range(26))
    assert (spec.attention.logit_softcap, spec.final_logit_softcap, spec.block.post_norms) == (50.0, 30.0, True)


@pytest.mark.parametrize("family", ["gemma", "llama"])
def test_other_families_refuse_to_export_gemma2_by_name(family):
    from nemo_convert.plugins.manager import get_registry

    cfg = _config()
    record = get_registry().families[family].record
    reason = record.refuses_nemo_config(cfg)
    assert reason is not None and "\n" not in reason, reason
    with pytest.raises(UnsupportedError):
        record.config_to_hf(cfg)


def test_null_soft_caps_mean_none():
    """``attn_logit_softcapping: null`` is no cap in transformers (``if softcap is not None``),
    unlike an absent key (Gemma2Config's default 50)."""
    from nemo_convert_gemma2.family import GEMMA2

    with open(os.path.join(HUB, "google__gemma-2-9b.json")) as f:
        hf = json.load(f)
    hf["attn_logit_softcapping"] = None
    assert spec_of(GEMMA2.config_to_nemo(hf)).attention.logit_softcap is None
    del hf["attn_logit_softcapping"]
    assert spec_of(GEMMA2.config_to_nemo(hf)).attention.logit_softcap == 50.0


def _mb(tmp_path, **overrides):
    """A tiny Gemma 2 (the family matrix's: scalar 24, caps 1.5 / 3.0, window 4 on layer 0)
    written as a Megatron-Bridge directory: (HF folder, directory, run_config.yaml path)."""
    from test_family_matrix import make_model

    from nemo_convert import api

    src = make_model(str(tmp_path / "hf"), "gemma2", **overrides)
    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    return src, out, os.path.join(out, "iter_0000000", "run_config.yaml")


def _rewrite(path, model, drop_record=True):
    import yaml

    with open(path, "w") as f:
        yaml.safe_dump({"model": model}, f)
    record = os.path.join(os.path.dirname(path), "nemo_convert.json")
    if drop_record and os.path.exists(record):
        os.remove(record)


def test_gemma2_provider_windows_what_hf_windows_by_default():
    """Gemma2ModelProvider's layer spec windows ``layer_number % 2 == 1`` (1-based): the
    0-based even layers, Gemma2Config's default ``layer_types``."""
    from nemo_convert_gemma2.family import MEGATRON_BRIDGE, _alternating

    for n in (1, 2, 5, 26):
        want = tuple(t == "sliding_attention" for t in _alternating({"num_hidden_layers": n}))
        assert MEGATRON_BRIDGE.window_layers(n) == want
    assert MEGATRON_BRIDGE.window_layers(3) == (True, False, True)


def test_provider_fields_both_ways_and_refusals():
    """The score fields and the window pass to Gemma2ModelProvider and back exactly; a
    provider without them (Gemma's, a plain GPT) refuses the model by name, and a section of
    one that sets them is refused on reading."""
    import torch

    from nemo_convert.formats.megatron.megatron_config import nemo_to_provider
    from nemo_convert.formats.megatron.provider_read import provider_to_nemo
    from nemo_convert.plugins.manager import get_registry

    providers = get_registry().providers()
    cfg = _config("google__gemma-2-2b.json")
    model = nemo_to_provider(cfg, "gemma2", providers=providers, vocab_size=256000, params_dtype=torch.bfloat16)
    assert {k: model[k] for k in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                                  "window_size")} == {"query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
                                                       "final_logit_softcapping": 30.0, "window_size": [4095, 0]}
    assert "window_attn_skip_freq" not in model
    back = provider_to_nemo(model, "run_config.yaml", providers)
    assert back["nemo_convert"]["post_norms"] is True
    assert first_difference(spec_of(cfg), spec_of(back)) is None
    # no caps, no window: written as null (the class's defaults are 50, 30 and (4095, 0))
    none = {**cfg, "attn_logit_softcapping": None, "final_logit_softcapping": None, "window_size": None,
            "window_attn_skip_freq": None, "mcore_customization_config": {},
            "nemo_convert": {k: v for k, v in cfg["nemo_convert"].items() if k != "sliding_window"}}
    model = nemo_to_provider(none, "gemma2", providers=providers, vocab_size=256000, params_dtype=torch.bfloat16)
    assert {k: model[k] for k in ("attn_logit_softcapping", "final_logit_softcapping", "window_size")} == {
        "attn_logit_softcapping": None, "final_logit_softcapping": None, "window_size": None}
    back = provider_to_nemo(model, "run_config.yaml", providers)
    spec = spec_of(back)
    assert (spec.attention.logit_softcap, spec.final_logit_softcap, spec.attention.window) == (None, None, None)
    # 0 caps nothing in Gemma2ModelProvider (logit_softcapping: ``if not scale``)
    assert spec_of(provider_to_nemo({**model, "attn_logit_softcapping": 0}, "r", providers)).attention.logit_softcap \
        is None
    with pytest.raises(UnsupportedError, match="query_pre_attn_scalar=0 is not a positive number"):
        provider_to_nemo({**model, "query_pre_attn_scalar": 0}, "r", providers)
    # HF windowing the odd layers: the provider windows the even ones itself
    odd = {**cfg, "window_attn_skip_freq": [i % 2 for i in range(26)]}
    with pytest.raises(UnsupportedError, match=r"window_attn_skip_freq=\[0, 1, 0"):
        nemo_to_provider(odd, "gemma2", providers=providers, vocab_size=256000, params_dtype=torch.bfloat16)
    with pytest.raises(UnsupportedError, match=r"query_pre_attn_scalar=256.0, attn_logit_softcapping=50.0, "
                                               r"final_logit_softcapping=30.0, nemo_convert.post_norms=True"):
        nemo_to_provider(cfg, "gemma", providers=providers, vocab_size=256000, params_dtype=torch.bfloat16)
    gpt = nemo_to_provider(cfg | {"window_size": None, "window_attn_skip_freq": None, "query_pre_attn_scalar": None,
                                  "attn_logit_softcapping": None, "final_logit_softcapping": None,
                                  "mcore_customization_config": {}, "nemo_convert": {}, "name": "megatron_gpt"},
                           "gemma", providers=providers, vocab_size=256000, params_dtype=torch.bfloat16)
    for target in ("megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider",
                   "megatron.bridge.models.gpt_provider.GPTModelProvider"):
        with pytest.raises(UnsupportedError, match="attn_logit_softcapping=50.0 changes the model's math"):
            provider_to_nemo({**gpt, "_target_": target, "attn_logit_softcapping": 50.0}, "r", providers)


def test_a_nemo1_gemma2_is_refused_by_the_provider_by_name():
    """NeMo 1's Gemma 2 windows the 0-based odd layers (its layer spec); Gemma2ModelProvider's
    the even ones: that ``.nemo`` has no Megatron-Bridge directory, and says so."""
    import torch

    from nemo_convert.formats.megatron.megatron_config import nemo_to_provider
    from nemo_convert.plugins.manager import get_registry

    cfg = _config("google__gemma-2-2b.json")
    for k in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "window_attn_skip_freq"):
        del cfg[k]
    cfg["nemo_convert"] = {"vocab_size": 256000}
    cfg["window_size"] = [4096, 0]
    with pytest.raises(UnsupportedError, match=r"window_attn_skip_freq=\[0, 1, 0, 1"):
        nemo_to_provider(cfg, "gemma2", providers=get_registry().providers(), vocab_size=256000,
                         params_dtype=torch.bfloat16)


@pytest.mark.slow
def test_megatron_bridge_directory_without_our_record_and_class_defaults(tmp_path):
    """A Megatron-Bridge directory reduced to the geometry and the fields that differ from
    Gemma2ModelProvider's defaults reads as the same model (transformers' logits); with the
    Gemma 2 fields left out too, they are the class's (scalar 224, caps 50 / 30, window
    (4095, 0) on the odd 1-based layers); a changed scalar changes the logits (negative
    control)."""
    import yaml
    from test_family_matrix import logits

    from nemo_convert import api

    src, out, path = _mb(tmp_path)
    with open(path) as f:
        model = yaml.safe_load(f)["model"]
    keep = ["_target_", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
            "kv_channels", "vocab_size", "seq_length", "bf16", "params_dtype"]
    mine = ["query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "window_size"]
    _rewrite(path, {k: model[k] for k in keep + mine})
    assert api.inspect_checkpoint(out)["family"] == "gemma2"
    ref = logits(src)
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert torch_equal(logits(back), ref)
    with open(os.path.join(back, "config.json")) as f:
        hf = json.load(f)
    assert (hf["layer_types"], hf["sliding_window"], hf["query_pre_attn_scalar"]) == (
        ["sliding_attention", "full_attention"], 4, 24)
    _rewrite(path, {k: model[k] for k in keep})
    cfg = api.open_checkpoint(out).config
    assert (cfg["query_pre_attn_scalar"], cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"],
            cfg["window_size"], cfg["window_attn_skip_freq"]) == (224, 50.0, 30.0, [4095, 0], [1, 0])
    _rewrite(path, {**{k: model[k] for k in keep + mine}, "query_pre_attn_scalar": 32})
    other = str(tmp_path / "other")
    api.export_hf(out, other)
    assert not torch_equal(logits(other), ref)


@pytest.mark.slow
def test_megatron_bridge_refuses_windows_the_provider_does_not_compute(tmp_path):
    """A Gemma 2 whose ``layer_types`` window layer 1 (not 0) is refused by name, nothing
    written; every layer full (no window) is written as ``window_size: null`` and reads back.
    (No logits: transformers 5.25 loads no Gemma 2 whose ``sliding_window`` is null, and a
    model without a window exports one; docs/families/gemma2.md.)"""
    from test_family_matrix import make_model

    from nemo_convert import api

    src = make_model(str(tmp_path / "odd"), "gemma2", layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(UnsupportedError, match=r"window_attn_skip_freq=\[0, 1\]"):
        api.import_hf(src, str(tmp_path / "mb-odd"), to="megatron-bridge")
    assert not os.path.exists(tmp_path / "mb-odd")
    src, out, path = _mb(tmp_path, layer_types=["full_attention", "full_attention"], attn_logit_softcapping=None)
    import yaml

    with open(path) as f:
        model = yaml.safe_load(f)["model"]
    assert model["window_size"] is None and model["attn_logit_softcapping"] is None
    _rewrite(path, model)  # without our record: the same tensors, no window and no cap
    bare = str(tmp_path / "bare")
    api.export_hf(out, bare)
    from tiny_models import hf_tensors

    a, b = hf_tensors(src), hf_tensors(bare)
    assert sorted(a) == sorted(b) and all(torch_equal(a[k], b[k]) for k in a)
    with open(os.path.join(bare, "config.json")) as f:
        hf = json.load(f)
    # (transformers 5.25 loads no Gemma 2 without a sliding_window, whatever its layer_types say)
    assert (hf["layer_types"], hf["sliding_window"], hf["attn_logit_softcapping"]) == (
        ["full_attention", "full_attention"], None, None)


def test_a_nemo1_gemma2_is_read_as_nemo1_computes_it():
    """NeMo 1's converter wrote ``window_size: [sliding_window_size, 0]`` and no window
    pattern; its Gemma 2 attention windows the 0-based odd layers (NeMo ``8cfedd72``
    ``gemma2_modules.py`` lines 82-84), the other half from transformers. Export writes
    that pattern as ``layer_types``: the HF model computes what NeMo 1 did."""
    from nemo_convert_gemma2.family import GEMMA2

    cfg = _config("google__gemma-2-2b.json")
    for k in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "window_attn_skip_freq"):
        del cfg[k]
    cfg["nemo_convert"] = {"vocab_size": 256000}
    cfg["window_size"] = [4096, 0]
    spec = spec_of(cfg)
    assert spec.attention.window == 4096 and spec.block.post_norms
    assert spec.attention.window_pattern == tuple(i % 2 == 1 for i in range(26))
    hf = GEMMA2.config_to_hf(cfg)
    assert hf["layer_types"][:3] == ["full_attention", "sliding_attention", "full_attention"]
    assert (hf["sliding_window"], hf["query_pre_attn_scalar"], hf["final_logit_softcapping"]) == (4096, 256, 30.0)
    assert first_difference(spec, spec_of(GEMMA2.config_to_nemo(hf))) is None


@pytest.mark.slow
def test_a_nemo1_gemma2_folder_exports_without_family(tmp_path):
    """A ``.nemo`` in NeMo 1's spelling (no record of ours, ``name: megatron_gemma2``, the
    caps under ``mcore_customization_config``) is recognised as Gemma 2 and exports with the
    source's tensors; its window pattern is NeMo 1's (test above)."""
    import yaml
    from test_family_matrix import make_model
    from tiny_models import hf_tensors

    from nemo_convert import api

    src = make_model(str(tmp_path / "hf"), "gemma2")
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    path = os.path.join(nemo, "model_config.yaml")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    for k in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "window_attn_skip_freq"):
        del cfg[k]
    cfg["nemo_convert"] = {"vocab_size": cfg["nemo_convert"]["vocab_size"]}
    cfg["window_size"] = [4, 0]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    back = str(tmp_path / "back")
    assert api.export_hf(nemo, back).family == "gemma2"
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch_equal(a[k], b[k]) for k in a)
    with open(os.path.join(back, "config.json")) as f:
        hf = json.load(f)
    assert (hf["layer_types"], hf["sliding_window"], hf["attn_logit_softcapping"]) == (
        ["full_attention", "sliding_attention"], 4, 1.5)


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))
