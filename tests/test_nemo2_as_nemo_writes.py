"""NeMo 2 folders whose ``context/model.yaml`` holds what NeMo itself writes: the arguments the
config class was called with and nothing else (``IOMixin`` binds the call's arguments without
defaults, NeMo 8cfedd7 ``nemo/lightning/io/mixin.py`` lines 520-545). Each family's HF importer
(``Importer.config``, cited per family below) over a tiny model of ``test_family_matrix``, and a
sized preset with only its geometry overridden (as a recipe's ``config.num_layers=...`` writes),
export bit-exact with the source's transformers logits; a class no family declares is refused
by name. DeepSeek-V3's importer-written folder is ``test_yarn_dirs.py``'s
(``test_nemo2_deepseek_folder_reads_its_class_yarn``), GPT-OSS's refusal ``test_nemo2_gpt_oss_is_refused_by_name``."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest
import torch
import yaml
from test_family_matrix import logits, make_model
from tiny_models import hf_tensors

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter
from nemo_convert.formats.nemo2.nemo2 import nemo2_to_nemo1_config
from nemo_convert.plugins.manager import get_registry

_M = "nemo.collections.llm.gpt.model."
_DTYPES = dict(fp16=False, bf16=False, params_dtype={"_target_": "torch.float32", "_call_": False})


def _divisible(vocab: int) -> int:
    """NeMo's importers' ``make_vocab_size_divisible_by`` (the largest power of two ≤ 128 dividing it)."""
    base = 128
    while vocab % base:
        base //= 2
    return base


def _theta(hf: dict[str, Any]) -> Any:
    return hf["rope_theta"] if "rope_theta" in hf else (hf.get("rope_parameters") or {}).get("rope_theta")


def _llama(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFLlamaImporter.config`` (``llama.py`` lines 692-775)."""
    return dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                init_method_std=hf["initializer_range"], layernorm_epsilon=hf["rms_norm_eps"],
                num_query_groups=hf["num_key_value_heads"], seq_length=hf["max_position_embeddings"],
                rotary_base=_theta(hf), gated_linear_unit=True, make_vocab_size_divisible_by=_divisible(hf["vocab_size"]),
                share_embeddings_and_output_weights=hf.get("tie_word_embeddings", False), **_DTYPES,
                generation_config=None, vocab_size=hf["vocab_size"], kv_channels=hf.get("head_dim"))


def _gemma(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFGemmaImporter.config`` (``gemma.py`` lines 189-221): no activation, no zero-centred
    gamma, no head size (GemmaConfig's 256)."""
    return dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                init_method_std=hf["initializer_range"], layernorm_epsilon=hf["rms_norm_eps"],
                num_query_groups=hf["num_key_value_heads"], rotary_base=_theta(hf), gated_linear_unit=True,
                make_vocab_size_divisible_by=_divisible(hf["vocab_size"]), share_embeddings_and_output_weights=True,
                **_DTYPES, generation_config=None)


def _mistral(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFMistralImporter.config`` (``mistral.py`` lines 181-219): the context is the window."""
    window = hf.get("sliding_window")
    return dict(seq_length=window, num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"],
                kv_channels=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
                num_attention_heads=hf["num_attention_heads"], init_method_std=hf["initializer_range"],
                layernorm_epsilon=hf["rms_norm_eps"], num_query_groups=hf["num_key_value_heads"],
                rotary_base=_theta(hf), gated_linear_unit=True,
                make_vocab_size_divisible_by=_divisible(hf["vocab_size"]),
                window_size=[window, 0] if window is not None else None, cp_comm_type="a2a" if window else None,
                share_embeddings_and_output_weights=False, **_DTYPES, generation_config=None)


def _qwen2(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFQwen2Importer.config`` (``qwen2.py`` lines 278-305)."""
    return dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                num_query_groups=hf["num_key_value_heads"], init_method_std=hf["initializer_range"],
                layernorm_epsilon=hf["rms_norm_eps"], gated_linear_unit=True, make_vocab_size_divisible_by=128,
                rotary_base=_theta(hf), share_embeddings_and_output_weights=False, vocab_size=hf["vocab_size"],
                seq_length=hf["max_position_embeddings"], **_DTYPES, generation_config=None)


def _qwen3(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFQwen3Importer.config`` (``qwen3.py`` lines 270-301): no head size (Qwen3Config's 128);
    the MoE class through ``partial(Qwen3MoEConfig, moe_ffn_hidden_size=...)``."""
    out = dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
               ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
               num_query_groups=hf["num_key_value_heads"], init_method_std=hf["initializer_range"],
               layernorm_epsilon=hf["rms_norm_eps"], vocab_size=hf["vocab_size"], make_vocab_size_divisible_by=1187,
               rotary_base=_theta(hf), share_embeddings_and_output_weights=hf.get("tie_word_embeddings", False),
               **_DTYPES, generation_config=None)
    if (hf.get("num_experts") or hf.get("num_local_experts")) is not None:  # transformers 5 saves the latter
        out["moe_ffn_hidden_size"] = hf["moe_intermediate_size"]
    return out


def _mixtral(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFMixtralImporter.config`` (``mixtral.py`` lines 207-250)."""
    return dict(bf16=False, activation_func={"_target_": "torch.nn.functional.silu", "_call_": False},
                num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"],
                kv_channels=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
                max_position_embeddings=hf["max_position_embeddings"], seq_length=hf["max_position_embeddings"],
                position_embedding_type="rope", rotary_base=_theta(hf), num_attention_heads=hf["num_attention_heads"],
                num_query_groups=hf["num_key_value_heads"], num_moe_experts=hf["num_local_experts"],
                moe_router_topk=hf["num_experts_per_tok"], moe_router_pre_softmax=False, normalization="RMSNorm",
                layernorm_epsilon=hf["rms_norm_eps"], init_method_std=hf["initializer_range"],
                gated_linear_unit=True, make_vocab_size_divisible_by=128, use_cpu_initialization=True,
                perform_initialization=False, params_dtype={"_target_": "torch.float32", "_call_": False},
                generation_config=None)


def _phi3(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFPhi3Importer.config`` (``phi3mini.py`` lines 125-152): no query groups (so MHA), no
    partial rotary factor, no window, no vocabulary size."""
    return dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                init_method_std=hf["initializer_range"], layernorm_epsilon=hf["rms_norm_eps"],
                rotary_base=_theta(hf), gated_linear_unit=True,
                make_vocab_size_divisible_by=_divisible(hf["vocab_size"]), share_embeddings_and_output_weights=False,
                **_DTYPES)


def _nemotron(hf: dict[str, Any]) -> dict[str, Any]:
    """``HFNemotronImporter.config`` (``nemotron.py`` lines 280-306)."""
    return dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                init_method_std=hf["initializer_range"], seq_length=hf["max_position_embeddings"],
                layernorm_epsilon=hf["norm_eps"], num_query_groups=hf["num_key_value_heads"],
                rotary_base=_theta(hf), rotary_percent=hf.get("partial_rotary_factor", 0.5),
                make_vocab_size_divisible_by=_divisible(hf["vocab_size"]), share_embeddings_and_output_weights=False,
                **_DTYPES, kv_channels=hf.get("head_dim"))


_NO_BIAS = dict(attention_bias=False, mlp_bias=False)
#: family → (HF overrides NeMo's importer can represent, model class, config class, importer arguments)
CASES: dict[str, tuple[dict[str, Any], str, str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "llama": (_NO_BIAS, "llama.LlamaModel", "llama.LlamaConfig", _llama),
    "gemma": ({"head_dim": 256}, "gemma.GemmaModel", "gemma.GemmaConfig", _gemma),  # NeMo reads 256 only
    "mistral": ({}, "mistral.MistralModel", "mistral.MistralConfig7B", _mistral),
    "qwen2": ({}, "qwen2.Qwen2Model", "qwen2.Qwen2Config", _qwen2),
    "qwen3": ({"head_dim": 128}, "qwen3.Qwen3Model", "qwen3.Qwen3Config", _qwen3),
    # NeMo's importer passes neither the expert count nor top-k: Qwen3MoEConfig's 128 and 8
    "qwen3_moe": ({"head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8}, "qwen3.Qwen3Model",
                  "qwen3.Qwen3MoEConfig", _qwen3),
    "mixtral": ({"sliding_window": None}, "mixtral.MixtralModel", "mixtral.MixtralConfig8x7B", _mixtral),
    # Phi-3-mini's vocabulary: a folder without a tokenizer exports no pad_token_id, and
    # transformers' Phi3Config defaults it to 32000
    "phi3": ({"num_key_value_heads": 4, "sliding_window": None, "partial_rotary_factor": 1.0, "vocab_size": 32064},
             "phi3mini.Phi3Model", "phi3mini.Phi3Config", _phi3),
    "nemotron": (_NO_BIAS, "nemotron.NemotronModel", "nemotron.NemotronConfig", _nemotron),
}


def write_nemo2(root: str, family: str, model_cls: str, config: dict[str, Any], **overrides: Any) -> tuple[str, str]:
    """A tiny HF model of ``family`` and the NeMo 2 folder of it with ``config`` as
    ``context/model.yaml``'s ``config`` (``config(hf)`` when callable)."""
    src = make_model(os.path.join(root, "hf"), family, **overrides)
    nemo = os.path.join(root, "m.nemo")
    api.import_hf(src, nemo)
    folder = os.path.join(root, "nemo2")
    with api.open_checkpoint(nemo) as ck:
        w = DistWeightsWriter(DirectorySink(folder), [ck.source.info(k) for k in ck.source.keys()],
                              prefix="module.", folder="weights")
        for k in ck.source.keys():
            w.write(k, ck.source.load(k))
        w.close()
    with open(os.path.join(src, "config.json")) as f:
        hf = json.load(f)
    body = config(hf) if callable(config) else config
    os.makedirs(os.path.join(folder, "context"), exist_ok=True)
    with open(os.path.join(folder, "context", "model.yaml"), "w") as f:
        yaml.safe_dump({"_target_": _M + model_cls, "config": body}, f)
    return src, folder


def assert_exports_as(src: str, folder: str, out: str) -> None:
    api.export_hf(folder, out)
    a, b = hf_tensors(src), hf_tensors(out)
    assert set(b) <= set(a) and set(a) - set(b) <= {"lm_head.weight"}, set(a) ^ set(b)
    for k in b:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert torch.equal(logits(src), logits(out))


@pytest.mark.slow  # converts twice and runs transformers twice
@pytest.mark.parametrize("family", sorted(CASES))
def test_importer_written_folder_exports_exactly(family: str, tmp_path: Any) -> None:
    overrides, model_cls, config_cls, args = CASES[family]
    src, folder = write_nemo2(str(tmp_path), family, model_cls,
                              lambda hf: {"_target_": _M + config_cls, **args(hf)}, **overrides)
    assert_exports_as(src, folder, str(tmp_path / "back"))


#: A recipe's sized preset with only the geometry overridden: family → (HF overrides that
#: match the preset's other defaults, model class, preset, what the recipe sets, a class no
#: family declares under that model class).
_GEOMETRY = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, num_query_groups=2)
_FP32 = {"params_dtype": {"_target_": "torch.float32", "_call_": False}, "bf16": False}
_LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
PRESETS: dict[str, tuple[dict[str, Any], str, str, dict[str, Any], str]] = {
    "llama": ({**_NO_BIAS, "rope_scaling": _LLAMA31_ROPE, "rms_norm_eps": 1e-5},
              "llama.LlamaModel", "llama.Llama31Config8B", _GEOMETRY, "llama.CodeLlamaConfig7B"),
    "gemma": ({"head_dim": 16, "num_key_value_heads": 1, "rope_theta": 10000.0, "rms_norm_eps": 1e-5},
              "gemma.GemmaModel", "gemma.GemmaConfig2B",
              dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, kv_channels=16),
              "gemma.CodeGemmaConfig2B"),
    "mistral": ({"sliding_window": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}, "mistral.MistralModel",
                "mistral.MistralConfig7B", {**_GEOMETRY, "kv_channels": 16, **_FP32}, "mixtral.MixtralConfig"),
    "qwen2": ({"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}, "qwen2.Qwen2Model", "qwen2.Qwen25Config500M",
              _GEOMETRY, "qwen3.Qwen3Config"),
    "qwen3": ({"head_dim": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
              "qwen3.Qwen3Model", "qwen3.Qwen3Config600M", _GEOMETRY, "qwen2.Qwen2Config"),
    "nemotron": ({**_NO_BIAS, "head_dim": 128, "partial_rotary_factor": 0.5, "norm_eps": 1e-5, "rope_theta": 10000.0},
                 "nemotron.NemotronModel", "nemotron.Nemotron3Config4B", _GEOMETRY, "llama.LlamaConfig"),
    "mixtral": ({"sliding_window": None, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "num_local_experts": 8,
                 "num_experts_per_tok": 2}, "mixtral.MixtralModel", "mixtral.MixtralConfig8x7B", {**_GEOMETRY, **_FP32},
                "mistral.MistralConfig7B"),
    "phi3": ({"vocab_size": 32064, "sliding_window": None, "partial_rotary_factor": 1.0, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0}, "phi3mini.Phi3Model", "phi3mini.Phi3ConfigMini", _GEOMETRY, "llama.LlamaConfig"),
    "qwen3_moe": ({"head_dim": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "num_experts": 128,
                   "num_experts_per_tok": 8, "moe_intermediate_size": 48}, "qwen3.Qwen3Model",
                  "qwen3.Qwen3Config30B_A3B", {**_GEOMETRY, "moe_ffn_hidden_size": 48}, "qwen2.Qwen2Config"),
}


@pytest.mark.slow  # converts twice and runs transformers twice
@pytest.mark.parametrize("family", sorted(PRESETS))
def test_sized_preset_with_geometry_overridden(family: str, tmp_path: Any) -> None:
    overrides, model_cls, preset, recipe, undeclared = PRESETS[family]
    src, folder = write_nemo2(str(tmp_path), family, model_cls, {"_target_": _M + preset, **recipe}, **overrides)
    assert_exports_as(src, folder, str(tmp_path / "back"))
    # negative control: the same folder under a class no family declares for that model is refused by name
    path = os.path.join(folder, "context", "model.yaml")
    with open(path) as f:
        model = yaml.safe_load(f)
    model["config"]["_target_"] = _M + undeclared
    with open(path, "w") as f:
        yaml.safe_dump(model, f)
    name = undeclared.rsplit(".", 1)[-1]
    with pytest.raises(UnsupportedError, match=rf"{name} under {model_cls.rsplit('.', 1)[-1]} is declared by no "
                                               rf"installed family.*declared: .*{preset.rsplit('.', 1)[-1]}"):
        api.export_hf(folder, str(tmp_path / "refused"))


def _read(model_cls: str, config: dict[str, Any]) -> dict[str, Any]:
    return nemo2_to_nemo1_config({"_target_": _M + model_cls, "config": config}, get_registry().providers())


def test_absent_fields_are_the_declared_class_defaults_and_written_ones_win() -> None:
    """GPTConfig / TransformerConfig under the class's declaration under the YAML: Gemma's absent
    head size is GemmaConfig's 256 (not hidden / heads); Llama's written ``kv_channels: null``
    is hidden / heads; a Llama 3.1 preset brings its llama3 RoPE scaling and a written field
    overrides the preset's."""
    geometry = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    gemma = _read("gemma.GemmaModel", {"_target_": _M + "gemma.GemmaConfig", **geometry})
    assert (gemma["kv_channels"], gemma["apply_embedding_scaling"], gemma["normalization"],
            gemma["activation"], gemma["share_embeddings_and_output_weights"]) == (256, True, "rmsnorm",
                                                                                 "geglu", True)
    llama = _read("llama.LlamaModel", {"_target_": _M + "llama.LlamaConfig", **geometry, "kv_channels": None})
    assert (llama["kv_channels"], llama["activation"], llama["bias"], llama["position_embedding_type"],
            llama["share_embeddings_and_output_weights"]) == (16, "fast-swiglu", False, "rope", False)
    preset = _read("llama.LlamaModel", {"_target_": _M + "llama.Llama31Config8B", "num_layers": 2})
    assert (preset["num_layers"], preset["hidden_size"], preset["num_query_groups"], preset["scale_factor"],
            preset["old_context_len"], preset["rotary_base"]) == (2, 4096, 8, 8.0, 8192, 500000)
    # negative control: the plain Llama3Config has no RoPE scaling
    assert not _read("llama.LlamaModel", {"_target_": _M + "llama.Llama3Config", **geometry}).get(
        "scale_positional_embedding")


def test_a_class_is_read_only_under_a_model_class_whose_families_declare_it() -> None:
    """Qwen3's config class under Qwen2Model: refused, naming the classes Qwen2Model's families
    declare; a config without ``_target_`` is refused too."""
    with pytest.raises(UnsupportedError, match=r"Qwen3Config under Qwen2Model is declared by no installed family"
                                               r".*declared: Qwen25Config14B, .*Qwen2Config,"):
        _read("qwen2.Qwen2Model", {"_target_": _M + "qwen3.Qwen3Config", "num_layers": 2})
    with pytest.raises(UnsupportedError, match=r"\(no _target_\) under LlamaModel is declared by no"):
        _read("llama.LlamaModel", {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4})


def test_every_declared_class_is_in_its_model_classes_module() -> None:
    """A family declares config classes of NeMo's module for its NeMo 2 model classes (the
    table is NeMo's, not invented), each with defaults that name no unknown provider class; a
    refusal by name may also name a NeMo class of another module (a model class it does not
    read, e.g. Gemma 3's VLM configs under ``nemo.collections.vlm``)."""
    for fam in get_registry().families.values():
        nemo = fam.record.nemo
        modules = {t.rsplit(".", 1)[0] for t in nemo.nemo2_targets}
        for cls, declared in nemo.nemo2_configs.items():
            assert cls.rsplit(".", 1)[0] in modules or (
                isinstance(declared, str) and cls.startswith("nemo.collections.")), (fam.record.name, cls)
            assert isinstance(declared, str) or str(declared.get("_target_", "megatron.bridge.")).startswith(
                "megatron.bridge."), (fam.record.name, cls)


def test_two_families_declaring_one_class_differently_is_an_error_naming_both() -> None:
    import copy
    from dataclasses import replace

    from nemo_convert.errors import PluginError
    from nemo_convert.plugins.manager import Provided

    reg = copy.copy(get_registry())
    llama = reg.families["llama"].record
    cls = _M + "llama.LlamaConfig"
    same = replace(llama, name="llama-again")
    reg.families = {**reg.families, "llama-again": Provided(same, "x", "x")}
    assert reg.providers().nemo2[_M + "llama.LlamaModel"][cls] == llama.nemo.nemo2_configs[cls]  # same: fine
    other = replace(llama, name="llama-other", nemo=replace(llama.nemo, nemo2_configs={
        cls: {**llama.nemo.nemo2_configs[cls], "gated_linear_unit": False}}))
    reg.families = {**reg.families, "llama-other": Provided(other, "x", "x")}
    with pytest.raises(PluginError, match="families 'llama' and 'llama-other' declare NeMo 2 config class "
                                          r"nemo\.collections\.llm\.gpt\.model\.llama\.LlamaConfig differently"):
        reg.providers()
