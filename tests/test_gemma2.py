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


@pytest.mark.slow
def test_megatron_bridge_directory_is_refused_by_name(tmp_path):
    """No Gemma 2 provider is written yet: ``--to megatron-bridge`` says why, writes nothing."""
    from test_family_matrix import make_model

    from nemo_convert import api

    src = make_model(str(tmp_path / "hf"), "gemma2")
    with pytest.raises(UnsupportedError, match="'gemma2' cannot be written with --to megatron-bridge: "
                                               "Megatron-Bridge's Gemma2ModelProvider carries query_pre_attn_scalar"):
        api.import_hf(src, str(tmp_path / "mb"), to="megatron-bridge")
    assert not os.path.exists(tmp_path / "mb")


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
