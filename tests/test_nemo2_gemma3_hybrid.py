"""NeMo 2 folders of Gemma 3 (``Gemma3Model``) and of hybrid stacks (``MambaModel`` with
``SSMConfig``'s classes), shaped as NeMo writes them: ``context/model.yaml`` holds the arguments
the config class was called with and nothing else (NeMo 8cfedd7 ``nemo/lightning/io/mixin.py``
lines 515-547), ``weights/`` a dist checkpoint under ``module.``.

* An importer's folder names a sized class alone (``HFGemma3Importer.config``, ``gemma3.py``
  lines 508-534, sets its other fields after the call, which is not recorded;
  ``HFNemotronHImporter.config``, ``ssm.py`` lines 553-585): read, it is the published
  checkpoint the importer chose the class for (gemma-3-1b, Nemotron-H-8B), key by key.
* A recipe's sized class with the geometry overridden (``config.num_layers=...``) over a tiny
  model exports bit-exact with the source's transformers logits; a wrong declared default
  (the negative control) changes the logits.
* A class no family declares is refused by name, and so are the declared classes whose model
  the family's HF class does not compute (a GeLU MLP, NeMo 2's Gemma 3 VLM).
* ``Gemma3Config4B`` / ``12B`` / ``27B`` set ``is_vision_language`` (an arbitrary mask the run
  feeds, causal for a text ``Gemma3Model``: ``plugins/nemo_convert_gemma3/nemo2.py``): read as
  the causal ``Gemma3ForCausalLM``, bit-exact over tiny geometry.
"""

from __future__ import annotations

import json
import math
import os
import tarfile
from typing import Any

import pytest
import torch
import yaml
from test_family_matrix import IDS, logits
from test_nemo2_as_nemo_writes import _M, assert_exports_as, write_nemo2
from tiny_hybrid import HERE as HYBRID_CONFIGS
from tiny_hybrid import make_nemotron_h
from tiny_models import hf_tensors

from nemo_convert import api
from nemo_convert.convert.common import kinds_for
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.sections import sectioned
from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter
from nemo_convert.formats.nemo2.nemo2 import nemo2_to_nemo1_config
from nemo_convert.plugins.manager import get_registry
from nemo_convert.verify import verify

_G3 = "gemma3."
_SSM = "ssm."
_FP32 = {"bf16": False, "params_dtype": {"_target_": "torch.float32", "_call_": False}}
HUB = os.path.join(os.path.dirname(__file__), "data", "hub_configs")


def _hf_of(model_cls: str, config: dict[str, Any], vocab: int) -> dict[str, Any]:
    """The HF config our export writes for a ``model.yaml`` of ``model_cls`` with ``config``
    (the vocabulary is the embedding's rows, which a folder's weights give)."""
    reg = get_registry()
    cfg = nemo2_to_nemo1_config({"_target_": _M + model_cls, "config": config}, reg.providers())
    cfg["vocab_size"] = vocab
    return reg.family_for_nemo_config(cfg).config_to_hf(cfg)


def _published(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# -- Gemma 3 ------------------------------------------------------------------------------

#: The keys of gemma-3-1b's published config that the model computes with.
_GEMMA3_MATH = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "head_dim", "hidden_activation", "rms_norm_eps", "max_position_embeddings",
                "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                "rope_theta", "rope_local_base_freq", "rope_scaling", "attention_bias")


def test_gemma3_importer_folder_is_the_published_1b() -> None:
    """``HFGemma3Importer`` writes ``Gemma3Config1B`` with no arguments for gemma-3-1b: read, it
    is that checkpoint's config (every key it computes with, the sixth layer of each six global)."""
    hf = _hf_of("gemma3.Gemma3Model", {"_target_": _M + _G3 + "Gemma3Config1B"}, 262_144)
    pub = _published(os.path.join(HUB, "gemma3", "google__gemma-3-1b-it_saved-4.52.4.json"))
    assert {k: hf.get(k) for k in _GEMMA3_MATH} == {k: pub[k] for k in _GEMMA3_MATH}
    assert hf["tie_word_embeddings"] is True and hf["architectures"] == ["Gemma3ForCausalLM"]
    assert hf["layer_types"] == ["full_attention" if (i + 1) % pub["sliding_window_pattern"] == 0
                                 else "sliding_attention" for i in range(pub["num_hidden_layers"])]


def test_gemma3_importer_folder_is_the_published_4b() -> None:
    """``HFGemma3Importer`` writes ``Gemma3Config4B`` with no arguments for gemma-3-4b (34 layers,
    ``gemma3.py`` lines 521-522): read, it is the published checkpoint's language model
    (``text_config``), key by key, although the class sets ``is_vision_language`` (line 228: the
    mask a text run feeds is causal, ``nemo2.py``); the flag written either way reads the same."""
    pub = _published(os.path.join(HUB, "gemma3", "google__gemma-3-4b-it_printed-4.50.3.json"))["text_config"]
    for written in ({}, {"is_vision_language": True}, {"is_vision_language": False}):
        hf = _hf_of("gemma3.Gemma3Model", {"_target_": _M + _G3 + "Gemma3Config4B", **written}, 262_208)
        assert {k: hf.get(k) for k in _GEMMA3_MATH} == {k: pub[k] for k in _GEMMA3_MATH}, written
        assert hf["layer_types"] == ["full_attention" if (i + 1) % pub["sliding_window_pattern"] == 0
                                     else "sliding_attention" for i in range(pub["num_hidden_layers"])]


def test_gemma3_27b_scales_scores_by_its_own_scalar() -> None:
    """``Gemma3Config27B``'s ``softmax_scale`` 168**-0.5 (``gemma3.py`` line 264) is HF's
    ``query_pre_attn_scalar: 168``; the other sizes scale by the head size (no field)."""
    big = _hf_of("gemma3.Gemma3Model", {"_target_": _M + _G3 + "Gemma3Config27B"}, 262_208)
    assert (big["query_pre_attn_scalar"], big["head_dim"], big["sliding_window"], big["rope_scaling"]) == (
        168, 128, 1024, {"rope_type": "linear", "factor": 8.0})
    assert (big["num_hidden_layers"], big["hidden_size"], big["num_attention_heads"], big["num_key_value_heads"],
            big["intermediate_size"]) == (62, 5376, 32, 16, 21504)
    twelve = _hf_of("gemma3.Gemma3Model", {"_target_": _M + _G3 + "Gemma3Config12B"}, 262_208)
    assert (twelve["query_pre_attn_scalar"], twelve["head_dim"], twelve["num_hidden_layers"]) == (256, 256, 48)


_VLM = "nemo.collections.vlm.gemma3vl.model."


@pytest.mark.parametrize("config_cls", ["base.Gemma3VLConfig", "gemma3vl.Gemma3VLConfig4B",
                                        "gemma3vl.Gemma3VLConfig12B", "gemma3vl.Gemma3VLConfig27B"])
def test_gemma3_vlm_folder_refused_by_name(config_cls: str) -> None:
    """NeMo 2's Gemma 3 VLM (``Gemma3VLImporter.config`` writes ``Gemma3VLConfig`` with the
    language, vision and projector configs, ``vlm/gemma3vl/model/gemma3vl.py`` lines 160-190):
    its vision tower is not built, so the folder is refused by its class's name."""
    model = {"_target_": _VLM + "base.Gemma3VLModel",
             "config": {"_target_": _VLM + config_cls,
                        "language_transformer_config": {"_target_": _M + _G3 + "Gemma3Config4B"}}}
    with pytest.raises(UnsupportedError, match=f"NeMo 2's {config_cls.rsplit('.', 1)[-1]} is not read: a NeMo 2 "
                                               "Gemma 3 vision-language model"):
        nemo2_to_nemo1_config(model, get_registry().providers())


@pytest.mark.parametrize("config, words", [
    ({"_target_": _M + _G3 + "Gemma3Config", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
     "Gemma3Config without rope_scaling_factor"),
    ({"_target_": _M + _G3 + "Gemma3Config1B", "interleaved_attn_pattern": "5,1"}, "interleaved_attn_pattern='5,1'"),
    ({"_target_": _M + "gemma2.Gemma2Config"}, "Gemma2Config under Gemma3Model is declared by no installed family"),
])
def test_gemma3_refusals_by_name(config: dict[str, Any], words: str) -> None:
    with pytest.raises(UnsupportedError, match=words):
        _hf_of("gemma3.Gemma3Model", config, 256)


def test_gemma3_pattern_counts_its_period_only() -> None:
    """NeMo 2 windows layer ``n`` (1-based) unless ``n % sum(pattern) == 0``
    (``_is_local_attn_layer``, ``gemma3.py`` lines 344-349): ``(2, 2)`` is three windowed
    layers then one global, not Megatron-Bridge's two and two."""
    hf = _hf_of("gemma3.Gemma3Model", {"_target_": _M + _G3 + "Gemma3Config1B", "num_layers": 8,
                                       "interleaved_attn_pattern": [2, 2]}, 256)
    assert hf["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + [
        "full_attention"]


#: A tiny Gemma 3 whose non-geometry keys are ``Gemma3Config1B``'s (bases 1e6 / 1e4, no RoPE
#: scaling, scores by the head size), one windowed layer and one global.
_G3_1B_HF = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4, sliding_window_pattern=2,
                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
_G3_1B_RECIPE = {"_target_": _M + _G3 + "Gemma3Config1B", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96,
                 "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 16, "window_size": 4,
                 "interleaved_attn_pattern": [1, 1], "vocab_size": 128, "seq_length": 64, **_FP32}


@pytest.mark.slow  # converts twice and runs transformers three times
def test_gemma3_sized_class_with_geometry_overridden(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Gemma3Config1B`` with the geometry a recipe overrides: the export is the tiny source
    bit for bit with its logits. Negative control: the same folder with the class's
    ``rope_scaling_factor`` declared 8 (the 4B's) changes the logits."""
    src, folder = write_nemo2(str(tmp_path), "gemma3", "gemma3.Gemma3Model", _G3_1B_RECIPE, **_G3_1B_HF)
    assert_exports_as(src, folder, str(tmp_path / "back"))
    declared = get_registry().families["gemma3"].record.nemo.nemo2_configs[_M + _G3 + "Gemma3Config1B"]
    assert isinstance(declared, dict)
    monkeypatch.setitem(declared, "rope_scaling_factor", 8.0)
    api.export_hf(folder, str(tmp_path / "wrong"))
    assert not torch.allclose(logits(src), logits(str(tmp_path / "wrong")), atol=1e-3)


#: Tiny Gemma 3s whose non-geometry keys are ``Gemma3Config4B``'s (bases 1e6 / 1e4, a linear
#: factor 8 on the global layers, scores by the head size) and ``Gemma3Config27B``'s (the same,
#: scores by 168**-0.5), one windowed layer and one global.
_G3_4B_HF: dict[str, Any] = {
    "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4, "sliding_window_pattern": 2,
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}}
_G3_27B_HF = {**_G3_4B_HF, "query_pre_attn_scalar": 168}


@pytest.mark.slow  # converts three times and runs transformers three times
@pytest.mark.parametrize("size, hf, wrong", [
    ("4B", _G3_4B_HF, ("rope_scaling_factor", 1.0)),
    ("27B", _G3_27B_HF, ("softmax_scale", None)),
])
def test_gemma3_vision_language_classes_read_as_causal(size: str, hf: dict[str, Any], wrong: tuple[str, Any],
                                                       tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Gemma3Config4B`` / ``27B`` (``is_vision_language: True``) with a recipe's geometry over a
    tiny Gemma 3 with the class's other keys: the export is the source bit for bit, with its
    transformers logits (causal ``Gemma3ForCausalLM``). Negative control: the class declared
    without its own RoPE factor (4B) or score scale (27B) changes the logits."""
    config = {**_G3_1B_RECIPE, "_target_": _M + _G3 + "Gemma3Config" + size}
    src, folder = write_nemo2(str(tmp_path), "gemma3", "gemma3.Gemma3Model", config, **hf)
    back = str(tmp_path / "back")
    assert_exports_as(src, folder, back)
    # the source spells its RoPEs per layer kind (transformers 5), the export as transformers 4 did
    # (rope_theta, rope_local_base_freq, rope_scaling): verify reads both as the same RoPEs
    with open(os.path.join(back, "config.json"), encoding="utf-8") as f:
        assert {"rope_theta", "rope_local_base_freq", "rope_scaling"} <= set(json.load(f))
    import transformers

    report = verify(src, back)
    # and the keys only transformers 5 writes (_sliding_window_pattern, sliding_window_pattern,
    # use_bidirectional_attention, pad_token_id, ...) are read alike: one note, not differences. The
    # token ids the NeMo 2 folder does not record stay differences: the source's bos 1 / eos 2 are not
    # Gemma3TextConfig's defaults (2 / 1), which is what transformers reads in the export
    assert [(d.path, d.a) for d in report.config] == [("bos_token_id", 1), ("eos_token_id", 2),
                                                      ("transformers_version", transformers.__version__)]
    assert any("_sliding_window_pattern" in n and "use_bidirectional_attention" in n for n in report.notes)
    assert verify(src, folder).config == []  # the NeMo 2 folder itself (its config completed by the family)
    declared = get_registry().families["gemma3"].record.nemo.nemo2_configs[config["_target_"]]
    assert isinstance(declared, dict) and declared["is_vision_language"] is True
    monkeypatch.setitem(declared, *wrong)
    api.export_hf(folder, str(tmp_path / "wrong"))
    assert not torch.allclose(logits(src), logits(str(tmp_path / "wrong")), atol=1e-3)


@pytest.mark.slow  # converts twice and runs transformers twice
def test_gemma3_base_class_as_a_recipe_writes_it(tmp_path: Any) -> None:
    """``Gemma3Config`` with every field the model differs in written (a 4B-like linear factor on
    the global layers, small bases, a score scalar other than the head size) over the family
    matrix's tiny Gemma 3."""
    config = {"_target_": _M + _G3 + "Gemma3Config", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96,
              "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 32, "window_size": 4,
              "interleaved_attn_pattern": [1, 1], "rotary_base": [10.0, 1000.0], "rope_scaling_factor": 4.0,
              "softmax_scale": 1.0 / math.sqrt(24), "vocab_size": 128, "seq_length": 64, **_FP32}
    src, folder = write_nemo2(str(tmp_path), "gemma3", "gemma3.Gemma3Model", config)
    assert_exports_as(src, folder, str(tmp_path / "back"))


# -- hybrid stacks (MambaModel) ------------------------------------------------------------

_HYBRID_MATH = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                "layer_norm_epsilon", "mlp_hidden_act", "max_position_embeddings", "tie_word_embeddings",
                "hybrid_override_pattern")


def test_nemotron_h_importer_folder_is_the_published_8b() -> None:
    """``HFNemotronHImporter`` writes ``NemotronHConfig8B`` with no arguments for Nemotron-H-8B:
    read, it is that checkpoint's config, key by key (head size 128 from hidden / heads)."""
    hf = _hf_of("ssm.MambaModel", {"_target_": _M + _SSM + "NemotronHConfig8B"}, 131_072)
    pub = _published(os.path.join(HYBRID_CONFIGS, "Nemotron-H-8B-Base-8K.json"))
    assert {k: hf.get(k) for k in _HYBRID_MATH} == {k: pub[k] for k in _HYBRID_MATH}
    assert hf["head_dim"] == pub["attention_head_dim"] == 128


def test_every_declared_hybrid_class_counts_its_layers() -> None:
    """Each sized class's pattern has its ``num_layers`` symbols (ssm.py lines 853-1073)."""
    configs = get_registry().families["nemotron_h"].record.nemo.nemo2_configs
    sized = {k: v for k, v in configs.items() if isinstance(v, dict) and v.get("hybrid_override_pattern")}
    assert len(sized) == 13
    for cls, v in sized.items():
        assert len(v["hybrid_override_pattern"]) == v["num_layers"], cls


@pytest.mark.parametrize("config, words", [
    ({"_target_": _M + _SSM + "NVIDIAMambaHybridConfig8B"}, "activation_func='gelu'"),
    ({"_target_": _M + _SSM + "SSMConfig", "num_layers": 2, "hidden_size": 64},
     "MambaModel config without hybrid_override_pattern"),
    ({"_target_": _M + _SSM + "NemotronHConfigBase", "num_layers": 2, "hidden_size": 64},
     "MambaModel config without hybrid_override_pattern"),
    ({"_target_": _M + _SSM + "BaseMambaConfig130M", "hybrid_override_pattern": "M-" * 12},
     "activation_func='gelu'"),
    ({"_target_": _M + "llama.LlamaConfig"}, "LlamaConfig under MambaModel is declared by no installed family"),
])
def test_hybrid_refusals_by_name(config: dict[str, Any], words: str) -> None:
    with pytest.raises(UnsupportedError, match=words):
        _hf_of("ssm.MambaModel", config, 256)


def _recipe(hf: dict[str, Any]) -> dict[str, Any]:
    """What a recipe overrides to fit a tiny checkpoint: the geometry and the Mamba sizes."""
    return dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                num_query_groups=hf["num_key_value_heads"],
                kv_channels=hf.get("head_dim") or hf.get("attention_head_dim"),
                mamba_num_heads=hf["mamba_num_heads"], mamba_head_dim=hf["mamba_head_dim"],
                mamba_num_groups=hf["n_groups"], mamba_state_dim=hf["ssm_state_size"],
                hybrid_override_pattern=hf["hybrid_override_pattern"], vocab_size=hf["vocab_size"],
                seq_length=hf["max_position_embeddings"], **_FP32)


def _dist_keys(path: str, prefix: str) -> tuple[dict[str, list[int]], set[str]]:
    """A dist checkpoint's tensor keys with their global shapes and its ``_extra_state`` items,
    ``prefix`` taken off."""
    ck = DistCheckpointSource.from_dir(path)
    try:
        assert all(k.startswith(prefix) for k in ck.raw_keys())
        return ({k.removeprefix(prefix): list(ck._raw[k][0]) for k in ck.raw_keys()},
                {k.removeprefix(prefix) for k in ck.extra_state_keys})
    finally:
        ck.close()


def _hybrid_folder(root: str, config_cls: str, **changes: Any) -> tuple[str, str]:
    """A tiny Nemotron-H (``tests/tiny_hybrid.py``) and the NeMo 2 folder of it, ``weights/``
    under ``module.`` as Megatron-Core 0.16.1's ``MambaModel.sharded_state_dict`` keys it: every
    layer its own keys (``MambaStack``), the mixer's ``in_proj`` / ``conv1d`` one key per section
    (``in_proj.weight.z`` …), the modules' ``_extra_state`` items — the ``.nemo``'s
    ``model_weights/`` under NeMo 2's prefix (checked below)."""
    src = make_nemotron_h(os.path.join(root, "hf"), "nemotron_h_8b", **changes)
    nemo = os.path.join(root, "m.nemo")
    api.import_hf(src, nemo)
    folder = os.path.join(root, "nemo2")
    reg = get_registry()
    with api.open_checkpoint(nemo) as ck:
        target = reg.family_for_nemo_config(ck.config).nemo
        w = DistWeightsWriter(DirectorySink(folder), [ck.source.info(k) for k in ck.source.keys()],
                              prefix="module.", folder="weights", unstacked=target.dist_unstacked,
                              sections=sectioned(kinds_for(reg)(ck.config)), extra_states=target.dist_extra_states)
        for k in ck.source.keys():
            w.write(k, ck.source.load(k))
        w.close()
    untar = os.path.join(root, "untar")
    with tarfile.open(nemo) as tar:
        tar.extractall(untar, filter="data")
    assert _dist_keys(os.path.join(folder, "weights"), "module.") == _dist_keys(
        os.path.join(untar, "model_weights"), "model.")
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    os.makedirs(os.path.join(folder, "context"), exist_ok=True)
    with open(os.path.join(folder, "context", "model.yaml"), "w", encoding="utf-8") as f:
        yaml.safe_dump({"_target_": _M + "ssm.MambaModel",
                        "config": {"_target_": _M + _SSM + config_cls, **_recipe(hf)}}, f)
    return src, folder


def _logits(folder: str, **call: Any) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS, **call).logits


def _exports_as(src: str, folder: str, out: str, **call: Any) -> None:
    api.export_hf(folder, out)
    a, b = hf_tensors(src), hf_tensors(out)
    assert set(a) == set(b), set(a) ^ set(b)
    for k in b:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert torch.equal(_logits(src, **call), _logits(out, **call))


@pytest.mark.slow  # converts twice and runs transformers three times
def test_nemotron_h_sized_class_with_geometry_overridden(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``NemotronHConfig8B`` with a recipe's geometry over the tiny Nemotron-H-8B (Mamba,
    attention and MLP layers): bit-exact tensors and logits. Negative control: the class's
    ``layernorm_epsilon`` declared 1e-2 changes the logits."""
    src, folder = _hybrid_folder(str(tmp_path), "NemotronHConfig8B")
    _exports_as(src, folder, str(tmp_path / "back"))
    declared = get_registry().families["nemotron_h"].record.nemo.nemo2_configs[_M + _SSM + "NemotronHConfig8B"]
    assert isinstance(declared, dict)
    monkeypatch.setitem(declared, "layernorm_epsilon", 1e-2)
    api.export_hf(folder, str(tmp_path / "wrong"))
    assert not torch.allclose(logits(src), logits(str(tmp_path / "wrong")), atol=1e-3)


@pytest.mark.slow  # converts twice and runs transformers twice
def test_pure_mamba_class_reads_as_an_all_mamba_nemotron_h(tmp_path: Any) -> None:
    """``BaseMambaConfig130M`` (every layer ``M``; ``SSMConfig``'s GeLU never runs) over a tiny
    all-``M`` ``NemotronHForCausalLM``: bit-exact tensors and logits. transformers 5.25 runs such a
    stack only without its cache (``cache_utils.py`` line 1887 wants an attention layer), so the
    logits are compared with ``use_cache=False``."""
    src, folder = _hybrid_folder(str(tmp_path), "BaseMambaConfig130M", hybrid_override_pattern="MMMM",
                                 num_hidden_layers=4)
    _exports_as(src, folder, str(tmp_path / "back"), use_cache=False)


@pytest.mark.slow  # converts four times and runs transformers twice
def test_hybrid_folder_reshards_to_a_tp2_nemo(tmp_path: Any) -> None:
    """The NeMo 2 hybrid folder resharded to a TP=2 ``.nemo`` (the mixer's sections split per
    rank) exports to the source's logits."""
    src, folder = _hybrid_folder(str(tmp_path), "NemotronHConfig8B")
    nemo, back = str(tmp_path / "tp2.nemo"), str(tmp_path / "back")
    api.reshard(folder, nemo, tp=2, pp=1)
    api.export_hf(nemo, back)
    assert torch.equal(_logits(src), _logits(back))
