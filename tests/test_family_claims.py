"""Which family reads a config, without families naming each other.

* A NeMo-native config (no record of its family) goes to the family whose own table
  represents it exactly and whose claim — a predicate on its *own* features — holds; the
  target's default family (Llama) only when none claims. Every in-tree family's own
  config, stripped of our record, comes back to that family.
* Two families claiming one config is an error asking for ``--family``, naming both.
* Two families listing one HF architecture or model type is an error when the registry is
  built, naming both plugins and distributions (as two records of one name are).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest

from nemo_convert import ModelFamily, NemoTarget, hookimpl
from nemo_convert.errors import PluginError, UnsupportedError
from nemo_convert.plugins.manager import DISABLE_ENV, get_registry, registry_with

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "mixtral", "qwen3_moe", "qwen2_moe",
                "deepseek_v2", "deepseek_v3", "gpt_oss", "nemotron", "gpt2", "glm4_moe")


class _Plugin:
    def __init__(self, *families: ModelFamily) -> None:
        self.families = list(families)

    @hookimpl
    def nemo_convert_model_families(self) -> list[ModelFamily]:
        return self.families


def _native_config(family: str) -> dict:
    """The family's own NeMo config for the family matrix's ``config.json``, as NeMo would
    hold it: no record of the family or the source (our section dropped whole)."""
    import transformers
    from test_family_matrix import BASE, BASE_OF, FAMILIES

    cls_name, extra, _, _ = FAMILIES[family]
    hf = json.loads(getattr(transformers, cls_name)(**{**BASE_OF.get(family, BASE), **extra}).to_json_string())
    fam = get_registry().family(family)
    cfg = fam.config_to_nemo(hf)
    cfg.pop("nemo_convert", None)
    return {**cfg, "target": fam.nemo.target}


@pytest.mark.parametrize("family", GPT_FAMILIES)
def test_a_native_config_comes_back_to_its_family(family):
    cfg = _native_config(family)
    if family == "phi3":  # NeMo 1 never wrote Phi-3: it fits, but only --family (or NeMo 2's class) picks it
        with pytest.raises(UnsupportedError, match=r"phi3: fits, but is never guessed \(pass --family phi3\)"):
            get_registry().family_for_nemo_config(cfg)
        return
    assert get_registry().family_for_nemo_config(cfg).name == family


def test_no_claim_names_another_familys_feature():
    """Each in-tree claim reads only its own family's features: none mentions another
    family's name or a field that only another family has (DeepSeek's MLA in Qwen3-MoE's,
    experts in Mistral's or Qwen2's, q/k norms or biases in Mixtral's)."""
    foreign = {"mistral": ("moe", "experts"), "qwen2": ("moe", "experts"), "qwen3": ("moe", "experts"),
               "mixtral": ("qk_norm", "qkv_bias", "qk_layernorm"), "qwen3_moe": ("mla", "multi_latent"),
               "gemma": ("window",), "qwen2_moe": ("qk_norm",)}
    reg = get_registry()
    for name in GPT_FAMILIES:
        claim = reg.family(name).claims_nemo_config
        if claim is None or claim.__name__ == "never":
            continue
        src = inspect.getsource(claim)
        line = next(ln for ln in src.splitlines() if "claims" in ln or "return" in ln or "lambda" in ln)
        for other in GPT_FAMILIES:
            if other != name:
                assert f"{other}" not in line.replace(name, ""), (name, other, line)
        for word in foreign.get(name, ()):
            assert word not in src, (name, word, src)


def test_two_claims_are_an_error_naming_both():
    """A second family claiming windows (another Mistral) makes a windowed config
    ambiguous: one line naming both, asking for --family."""
    mistral = get_registry().family("mistral")
    twin = dataclasses.replace(mistral, name="mistral_twin", hf_architectures=("TwinForCausalLM",),
                               hf_model_types=("twin",))
    reg = registry_with(("twin", _Plugin(twin)))
    cfg = _native_config("mistral")
    with pytest.raises(PluginError) as ei:
        reg.family_for_nemo_config(cfg)
    msg = str(ei.value)
    assert "mistral" in msg and "mistral_twin" in msg and "--family" in msg and "\n" not in msg
    assert reg.family_for_nemo_config({**cfg, "nemo_convert": {"family": "mistral"}}).name == "mistral"


def _toy(name: str, arch: str, mtype: str) -> ModelFamily:
    return ModelFamily(name=name, hf_architectures=(arch,), hf_model_types=(mtype,), nemo=NemoTarget("x.Y"),
                       mapping=lambda cfg: None, config_to_nemo=dict, config_to_hf=dict)


@pytest.mark.parametrize("kind, family", [
    ("architecture", _toy("my-llama", "LlamaForCausalLM", "my_llama")),
    ("model_type", _toy("my-llama", "MyLlamaForCausalLM", "llama")),
])
def test_an_hf_name_listed_twice_is_an_error_at_registry_build(kind, family):
    with pytest.raises(PluginError) as ei:
        registry_with(("my-plugin", _Plugin(family)))
    msg = str(ei.value)
    assert f"HF {kind}" in msg and "'llama'" in msg and "'my-llama'" in msg and "'my-plugin'" in msg
    assert "'nemo-convert'" in msg and DISABLE_ENV in msg and "\n" not in msg


def test_two_in_process_plugins_listing_one_architecture():
    a, b = _toy("a", "SameForCausalLM", "a"), _toy("b", "SameForCausalLM", "b")
    with pytest.raises(PluginError, match=r"'SameForCausalLM' is listed by two families: 'a' .* and 'b'"):
        registry_with(("pa", _Plugin(a)), ("pb", _Plugin(b)), entry_points=False)
    assert set(registry_with(("pa", _Plugin(a)), entry_points=False).families) == {"a"}


def test_a_nemo2_class_listed_by_two_families_goes_to_the_one_that_represents_it():
    """Qwen2 and Qwen2-MoE both list NeMo 2's Qwen2Model: a dense config is Qwen2's."""
    cfg = _native_config("qwen2")
    cfg.pop("target")
    cfg["nemo2_target"] = "nemo.collections.llm.gpt.model.qwen2.Qwen2Model"
    assert get_registry().family_for_nemo_config(cfg).name == "qwen2"
    moe = _native_config("qwen2_moe")
    moe.pop("target")
    moe["nemo2_target"] = "nemo.collections.llm.gpt.model.qwen2.Qwen2Model"
    assert get_registry().family_for_nemo_config(moe).name == "qwen2_moe"


def test_two_fitting_defaults_are_an_error_naming_both():
    """A second default family for MegatronGPTModel (another Llama, no claim) that also
    represents a plain config exactly: the choice is not guessed, one line names both."""
    llama = get_registry().family("llama")
    twin = dataclasses.replace(llama, name="llama_twin", hf_architectures=("TwinLlamaForCausalLM",),
                               hf_model_types=("twin_llama",))
    reg = registry_with(("twin", _Plugin(twin)))
    cfg = _native_config("llama")
    with pytest.raises(PluginError) as ei:
        reg.family_for_nemo_config(cfg)
    msg = str(ei.value)
    assert "llama" in msg and "llama_twin" in msg and "--family" in msg and "\n" not in msg
    # a claim still wins over the defaults: a windowed config is Mistral's
    assert reg.family_for_nemo_config(_native_config("mistral")).name == "mistral"
