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


GEMMA3_PROVIDER = "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider"


def _providers():
    from nemo_convert.plugins.manager import get_registry

    return get_registry().providers()


def _provider(cfg: dict, family: str = "gemma3") -> dict:
    import torch

    from nemo_convert.formats.megatron.megatron_config import nemo_to_provider

    return nemo_to_provider(cfg, family, providers=_providers(), vocab_size=262144, params_dtype=torch.bfloat16)


def _read(model: dict) -> dict:
    from nemo_convert.formats.megatron.provider_read import provider_to_nemo

    return provider_to_nemo(model, "run_config.yaml", _providers())


@pytest.mark.parametrize("name", [ONE_B, "google__gemma-3-270m.json"])
def test_provider_fields_of_the_published_configs(name):
    """Both published configs to Gemma3ModelProvider's fields as Gemma3Bridge derives them
    (``gemma3_bridge.py`` lines 66-72): ``window_size`` the int W, ``rotary_base`` (local,
    global), ``softmax_scale`` 1/sqrt(256), no factor, and ``interleaved_attn_pattern`` (5, 1)
    — the class's default —, whose local layers (1-based ``n`` with ``(n - 1) % 6 < 5``,
    ``gemma3_provider.py`` lines 349-357) are exactly transformers' sliding layers; and back to
    the same model."""
    import math

    from nemo_convert.formats.megatron.provider_flags import _local_flags

    hf = _hf(name)
    cfg = _nemo(hf)
    model = _provider(cfg)
    ref = _transformers(hf)
    assert model["_target_"] == GEMMA3_PROVIDER
    assert {k: model[k] for k in ("window_size", "rotary_base", "rope_scaling_factor", "softmax_scale",
                                  "interleaved_attn_pattern", "qk_layernorm")} == {
        "window_size": 512, "rotary_base": [1e4, 1e6], "rope_scaling_factor": 1.0, "softmax_scale": 1 / math.sqrt(256),
        "interleaved_attn_pattern": [5, 1], "qk_layernorm": True}
    assert model["softmax_scale"] == 0.0625
    for k in ("seq_len_interpolation_factor", "window_attn_skip_freq", "query_pre_attn_scalar",
              "attn_logit_softcapping", "final_logit_softcapping"):
        assert k not in model
    layers = len(ref.layer_types)
    local = _local_flags(model["interleaved_attn_pattern"], layers, "x")
    assert local == tuple((n - 1) % 6 < 5 for n in range(1, layers + 1))
    assert local == tuple(t == "sliding_attention" for t in ref.layer_types)
    back = _read(model)
    assert back["query_pre_attn_scalar"] == 256 and back["rotary_base_local"] == 1e4
    assert back["window_size"] == [511, 0] and back["nemo_convert"]["sliding_window"] == 512
    assert first_difference(spec_of(cfg), spec_of(back)) is None


def test_window_patterns_both_forms():
    """``interleaved_attn_pattern`` is a (local, global) pair where the flags repeat it from
    the first layer (the shortest period), else one layer kind per layer; both read back to
    the same flags; malformed ones are refused by name."""
    from nemo_convert.formats.megatron.provider_flags import _layer_kinds, _local_flags

    T, F = True, False
    for flags, want in (((T, F), [1, 1]), ((T,) * 4, [1, 0]), ((F,) * 3, [0, 1]), ((T, T, F, F) * 2, [2, 2]),
                        ((T, F, F), [1, 2]), ((T,) * 5 + (F,) + (T,) * 2, [5, 1]), ((T, T, T), [1, 0]),
                        ((F, T), ["full_attention", "sliding_attention"]),
                        ((T, F, T, T), ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"])):
        assert _layer_kinds(flags) == want, flags
        assert _local_flags(want, len(flags), "x") == flags
    for bad, words in ((["sliding_attention", "chunked_attention"], r"kinds \['chunked_attention'\]"),
                       (["sliding_attention"], "1 layer kinds for 2 layers"), ([0, 0], "is neither"),
                       ([True, 1], "is neither"), (5, "is neither"), (None, "is neither")):
        with pytest.raises(UnsupportedError, match=words):
            _local_flags(bad, 2, "x")


def test_provider_fields_both_ways_beyond_the_published_ones():
    """A scalar that is not an integer, an irregular window pattern, no window at all and a
    linear factor on the global layers pass to Gemma3ModelProvider and back."""
    cfg = _nemo(_hf())
    model = _provider({**cfg, "query_pre_attn_scalar": 24.5})
    assert abs(_read(model)["query_pre_attn_scalar"] - 24.5) < 1e-12
    flags = [int(i % 5 != 3) for i in range(26)]  # windowed except every fifth from the fourth
    model = _provider({**cfg, "window_attn_skip_freq": flags})
    assert model["interleaved_attn_pattern"] == ["sliding_attention" if f else "full_attention" for f in flags]
    back = _read(model)
    assert back["window_attn_skip_freq"] == flags and first_difference(
        spec_of({**cfg, "window_attn_skip_freq": flags}), spec_of(back)) is None
    none = {**cfg, "window_size": None, "window_attn_skip_freq": None,
            "nemo_convert": {k: v for k, v in cfg["nemo_convert"].items() if k != "sliding_window"}}
    model = _provider(none)
    assert (model["window_size"], model["interleaved_attn_pattern"]) == (None, [0, 1])  # over the class's 512, (5, 1)
    back = _read(model)
    assert spec_of(back).attention.window is None and spec_of(back).rope.local_theta == 1e4
    scaled = {**cfg, "seq_len_interpolation_factor": 8.0}
    model = _provider(scaled)
    assert model["rope_scaling_factor"] == 8.0 and "seq_len_interpolation_factor" not in model
    back = _read(model)
    assert back["seq_len_interpolation_factor"] == 8.0 and first_difference(spec_of(scaled), spec_of(back)) is None
    # absent from the section: Megatron-Core's 1/sqrt(kv_channels)
    assert _read({k: v for k, v in _provider(cfg).items() if k != "softmax_scale"} | {"softmax_scale": None})[
        "query_pre_attn_scalar"] == 256


def test_provider_refusals_by_name():
    """What Gemma3ModelProvider does not compute is refused when writing (a logit cap; one
    linear factor on every layer's RoPE); every other provider refuses the local RoPE base
    when writing and a ``rotary_base`` pair when reading; a Gemma3ModelProvider section whose
    fields the class reads otherwise than as our model is refused when reading."""
    cfg = _nemo(_hf())
    with pytest.raises(UnsupportedError, match="final_logit_softcapping=30.0"):
        _provider({**cfg, "final_logit_softcapping": 30.0})
    with pytest.raises(UnsupportedError, match="Gemma3ModelProvider scales the global layers' RoPE only"):
        _provider({**cfg, "rotary_base_local": None, "seq_len_interpolation_factor": 8.0})
    for family in ("gemma2", "gemma", "llama"):
        with pytest.raises(UnsupportedError, match="rotary_base_local=10000.0"):
            _provider(cfg, family)
    model = _provider(cfg)
    for target in ("megatron.bridge.models.gpt_provider.GPTModelProvider",
                   "megatron.bridge.models.gemma.gemma2_provider.Gemma2ModelProvider",
                   "megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider"):
        with pytest.raises(UnsupportedError, match=r"rotary_base=\[10000.0, 1000000.0\] \(a \(local, global\) pair"):
            _read({**model, "_target_": target})
    for over, words in (({"is_vision_language": True}, "is_vision_language=True changes the model's math"),
                        ({"window_size": [511, 0]}, r"window_size=\[511, 0\] is not the positive key count"),
                        ({"window_size": None}, "window_size=None is not the positive key count"),
                        ({"seq_len_interpolation_factor": 8.0}, "seq_len_interpolation_factor=8.0 is not read"),
                        ({"rope_scaling": True}, "rope_scaling=True is not read"),
                        ({"rotary_percent": 0.5}, "rotary_percent=0.5 is not read"),
                        ({"rotary_base": 10000.0}, "rotary_base=10000.0 is not a .local, global. pair"),
                        ({"softmax_scale": 0}, "softmax_scale=0 is not a positive number"),
                        ({"rope_scaling_factor": -1.0}, "rope_scaling_factor=-1.0 is not a positive number"),
                        ({"interleaved_attn_pattern": [5]}, "interleaved_attn_pattern=.5. is neither"),
                        ({"window_attn_skip_freq": [1, 0] * 13}, "window_attn_skip_freq=.* changes the model's math"),
                        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 changes the model's math")):
        with pytest.raises(UnsupportedError, match=words):
            _read({**model, **over})
    # Megatron-Bridge's flag is no mask and no window on a text run (gemma3.md): refused, while false
    # (the class default, line 87) reads as the section without it (control)
    assert _read({**model, "is_vision_language": False}) == _read({k: v for k, v in model.items()
                                                                   if k != "is_vision_language"})
    # the VLM's provider class (a tower, a projector; flag fixed true) and the removed size classes
    # that set the flag are refused by name, not read as a plain GPT
    for target in ("megatron.bridge.models.gemma_vl.gemma3_vl_provider.Gemma3VLModelProvider",
                   "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider4B"):
        with pytest.raises(UnsupportedError, match=f"model provider {target} is not supported"):
            _read({**model, "_target_": target})


def _mb(tmp_path, **overrides):
    """A tiny Gemma 3 written as a Megatron-Bridge directory: (HF folder, directory,
    run_config.yaml path, its model section)."""
    import yaml
    from test_family_matrix import make_model

    from nemo_convert import api

    src = make_model(str(tmp_path / "hf"), "gemma3", **overrides)
    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    with open(path) as f:
        return src, out, path, yaml.safe_load(f)["model"]


def _rewrite(path, model):
    import yaml

    with open(path, "w") as f:
        yaml.safe_dump({"model": model}, f)
    record = os.path.join(os.path.dirname(path), "nemo_convert.json")
    if os.path.exists(record):
        os.remove(record)


@pytest.mark.slow
def test_megatron_bridge_run_config_without_our_record_and_class_defaults(tmp_path):
    """Six layers, the sixth global (gemma-3's pattern): a model section with the
    geometry and what Gemma3Bridge sets (``gemma3_bridge.py`` lines 53-74: no
    ``interleaved_attn_pattern``, the class's (5, 1)) and no record of ours reads as the same
    model (transformers' logits, equal); with those fields left out too they are the class's
    (``gemma3_provider.py`` lines 58-98); a changed softmax scale, swapped RoPE bases, another
    factor or another pattern change the logits (negative controls)."""
    import torch
    from test_family_matrix import logits

    from nemo_convert import api

    src, out, path, model = _mb(tmp_path, num_hidden_layers=6, sliding_window_pattern=6)
    assert model["interleaved_attn_pattern"] == [5, 1] and model["window_size"] == 4
    keep = ["_target_", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
            "kv_channels", "vocab_size", "seq_length", "bf16", "params_dtype", "layernorm_epsilon"]
    bridge = ["window_size", "rotary_base", "softmax_scale", "rope_scaling_factor"]
    section = {k: model[k] for k in keep + bridge}
    _rewrite(path, section)
    assert api.inspect_checkpoint(out)["family"] == "gemma3"
    ref = logits(src)
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert torch.equal(logits(back), ref)
    with open(os.path.join(back, "config.json")) as f:
        hf = json.load(f)
    assert (hf["layer_types"], hf["sliding_window"], hf["query_pre_attn_scalar"], hf["rope_theta"],
            hf["rope_local_base_freq"], hf["rope_scaling"]) == (
        ["sliding_attention"] * 5 + ["full_attention"], 4, 24, 1000.0, 10.0, {"rope_type": "linear", "factor": 4.0})
    _rewrite(path, {k: model[k] for k in keep})
    cfg = api.open_checkpoint(out).config
    assert (cfg["rotary_base"], cfg["rotary_base_local"], cfg["query_pre_attn_scalar"], cfg["window_size"],
            cfg["window_attn_skip_freq"], cfg.get("seq_len_interpolation_factor"), cfg["qk_layernorm"]) == (
        1e6, 1e4, 256, [511, 0], [1, 1, 1, 1, 1, 0], None, True)
    for i, over in enumerate(({"softmax_scale": 0.125}, {"rotary_base": [1000.0, 10.0]}, {"rope_scaling_factor": 2.0},
                              {"interleaved_attn_pattern": [4, 2]})):
        _rewrite(path, {**section, **over})
        other = str(tmp_path / f"other{i}")
        api.export_hf(out, other)
        assert not torch.equal(logits(other), ref), over


@pytest.mark.slow
def test_megatron_bridge_untied_embeddings(tmp_path):
    """``share_embeddings_and_output_weights`` is not fixed for Gemma 3 (the base bridge maps
    ``tie_word_embeddings``; the class's default is true): an untied model is written with
    ``false`` and reads back, without our record, to the same logits."""
    import torch
    from test_family_matrix import logits

    from nemo_convert import api

    src, out, path, model = _mb(tmp_path, tie_word_embeddings=False)
    assert model["share_embeddings_and_output_weights"] is False
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    bare = str(tmp_path / "bare")
    api.export_hf(out, bare)
    assert torch.equal(logits(bare), logits(src))
    _rewrite(path, {k: v for k, v in model.items() if k != "share_embeddings_and_output_weights"})
    assert api.open_checkpoint(out).config["share_embeddings_and_output_weights"] is True  # the class's default
