"""Gemma 3's config facts beyond the family matrix: the two spellings of its RoPEs and layer
pattern read as transformers reads them, what a NeMo config without our record exports to,
and what the other families refuse of it."""

from __future__ import annotations

import copy
import json
import os

import pytest

from nemo_convert.errors import UnsupportedError
from nemo_convert.spec import first_difference, spec_of

HUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hub_configs", "gemma3")
ONE_B = "google__gemma-3-1b-it_saved-4.52.4.json"


def _hf(name: str = ONE_B) -> dict:
    with open(os.path.join(HUB, name)) as f:
        return json.load(f)


def _nemo(hf: dict) -> dict:
    from nemo_convert_gemma3.family import GEMMA3

    return GEMMA3.config_to_nemo(copy.deepcopy(hf))


def _transformers(hf: dict):
    from transformers import Gemma3TextConfig

    keep = {k: v for k, v in hf.items() if k not in ("architectures", "model_type", "transformers_version")}
    return Gemma3TextConfig(**keep)


@pytest.mark.parametrize("name", [ONE_B, "google__gemma-3-270m.json"])
def test_layer_kinds_and_ropes_are_transformers_own(name):
    """Our windows and RoPE bases per layer are the ones transformers 5 builds from the
    published file (``layer_types``, ``rope_parameters`` per layer kind)."""
    hf = _hf(name)
    spec = spec_of(_nemo(hf))
    ref = _transformers(hf)
    assert [("sliding" if w else "full") + "_attention" for w in spec.attention.window_pattern] == ref.layer_types
    assert spec.attention.window == ref.sliding_window == 512
    assert spec.rope.theta == ref.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert spec.rope.local_theta == ref.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert spec.rope.interpolation is None and ref.rope_parameters["full_attention"]["rope_type"] == "default"
    assert spec.attention.qk_norm and spec.block.post_norms and spec.norm.zero_centred and spec.embedding.scaled


def test_v5_spelling_is_the_same_model():
    """transformers 5's own ``to_dict`` of the 1B config (``rope_parameters`` per layer kind,
    ``layer_types``) imports to the same spec as the published v4 spelling."""
    hf = _hf()
    v5 = _transformers(hf).to_dict()
    v5 = {k: v for k, v in v5.items() if k not in ("transformers_version",)}
    assert "rope_local_base_freq" not in v5 and set(v5["rope_parameters"]) == {"full_attention", "sliding_attention"}
    assert first_difference(spec_of(_nemo(hf)), spec_of(_nemo(v5))) is None


def test_linear_scaling_is_the_global_layers_only():
    """The 4B+ configs' ``rope_scaling: {factor: 8, rope_type: linear}`` scales the global
    RoPE (transformers merges it into ``full_attention``); the local one is untouched."""
    hf = {**_hf(), "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
    ref = _transformers(hf).rope_parameters
    assert ref["full_attention"]["factor"] == 8.0 and "factor" not in ref["sliding_attention"]
    cfg = _nemo(hf)
    assert (cfg["seq_len_interpolation_factor"], cfg["rotary_base"], cfg["rotary_base_local"]) == (8.0, 1e6, 1e4)


def test_defaults_are_gemma3textconfigs():
    """Without the keys: a 4096-key window, every sixth layer global, bases 1e6 / 1e4."""
    hf = _hf()
    for k in ("sliding_window", "sliding_window_pattern", "rope_theta", "rope_local_base_freq", "rope_scaling"):
        del hf[k]
    spec, ref = spec_of(_nemo(hf)), _transformers(hf)
    assert spec.attention.window == ref.sliding_window == 4096
    assert [("sliding" if w else "full") + "_attention" for w in spec.attention.window_pattern] == ref.layer_types
    assert (spec.rope.theta, spec.rope.local_theta) == (1e6, 1e4)


def test_the_unread_pattern_key_must_agree_without_layer_types():
    """``_sliding_window_pattern`` is what transformers writes back and never reads: beside
    ``layer_types`` it is a record; alone, a value other than the pattern applied is refused."""
    hf = _hf("google__gemma-3-270m.json")
    _nemo({**hf, "_sliding_window_pattern": 4})  # layer_types decide
    alone = {k: v for k, v in hf.items() if k != "layer_types"}
    _nemo(alone)  # 6, as applied
    with pytest.raises(UnsupportedError, match="_sliding_window_pattern=4 differs from the sliding_window_pattern=6"):
        _nemo({**alone, "_sliding_window_pattern": 4})


def test_a_nemo_config_without_our_record_exports_what_transformers_reads_back():
    """No source ``config.json`` recorded: the synthesised one (v4 keys that transformers 5
    reads) has the same RoPEs and layer kinds, and the gemma3 family claims the config."""
    from nemo_convert_gemma3.family import GEMMA3

    from nemo_convert.plugins.manager import get_registry

    cfg = _nemo({**_hf(), "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})
    cfg["nemo_convert"] = {"vocab_size": 262144, "sliding_window": 512, "post_norms": True,
                           "linear_biases": cfg["nemo_convert"]["linear_biases"]}
    out = GEMMA3.config_to_hf(cfg)
    assert out["architectures"] == ["Gemma3ForCausalLM"] and out["model_type"] == "gemma3_text"
    ref = _transformers(out)
    assert ref.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert ref.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert ref.layer_types[5] == "full_attention" and ref.layer_types.count("full_attention") == 4
    assert first_difference(spec_of(cfg), spec_of(_nemo(out))) is None
    families = get_registry().families
    assert families["gemma3"].record.claims_nemo_config(cfg)
    assert not families["gemma2"].record.claims_nemo_config(cfg)


@pytest.mark.parametrize("family, words", [("gemma2", "rotary_base_local=10000.0: Gemma2ForCausalLM computes None"),
                                           ("gemma", "rotary_base_local=10000.0: GemmaForCausalLM computes None"),
                                           ("qwen3", "activation=")])
def test_other_families_refuse_gemma3_by_name(family, words):
    """The local RoPE base is what Gemma and Gemma 2 lack: named in their refusal."""
    from nemo_convert.plugins.manager import get_registry

    cfg = _nemo(_hf())
    reason = get_registry().families[family].record.refuses_nemo_config(cfg)
    assert reason is not None and words in reason and "\n" not in reason, reason


def test_gemma3_refuses_a_config_without_the_local_base():
    """A Gemma 2-like config (one RoPE, q/k norms) is not what Gemma3ForCausalLM computes: its
    windowed layers would rotate with 1e4, so export refuses, naming the field."""
    from nemo_convert_gemma3.family import GEMMA3

    cfg = _nemo(_hf())
    cfg["nemo_convert"]["hf_config"] = _hf()
    del cfg["rotary_base_local"]
    reason = GEMMA3.refuses_nemo_config(cfg)
    assert reason is not None and "rotary_base_local=None" in reason, reason


def test_a_score_cap_is_refused_both_ways():
    """transformers 5.25 never applies ``attn_logit_softcapping`` to Gemma 3 (the family's
    docstring): a config setting one is refused on import, a NeMo config with one on export."""
    from nemo_convert_gemma3.family import GEMMA3

    with pytest.raises(UnsupportedError, match="attn_logit_softcapping=50.0: Gemma3ForCausalLM reads it but never"):
        _nemo({**_hf(), "attn_logit_softcapping": 50.0})
    cfg = _nemo(_hf())
    cfg["attn_logit_softcapping"] = 50.0
    reason = GEMMA3.refuses_nemo_config(cfg)
    assert reason is not None and "attn_logit_softcapping=50.0" in reason, reason


@pytest.mark.slow
def test_megatron_bridge_directory_is_refused_by_name(tmp_path):
    """No Gemma 3 provider is written yet: ``--to megatron-bridge`` says why, writes nothing."""
    from test_family_matrix import make_model

    from nemo_convert import api

    src = make_model(str(tmp_path / "hf"), "gemma3")
    with pytest.raises(UnsupportedError, match="'gemma3' cannot be written with --to megatron-bridge: "
                                               "Megatron-Bridge's Gemma3ModelProvider carries"):
        api.import_hf(src, str(tmp_path / "mb"), to="megatron-bridge")
    assert not os.path.exists(tmp_path / "mb")
