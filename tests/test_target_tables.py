"""Every target's config is a table over the spec, written once: the Megatron-Bridge
provider written from a family's NeMo config reads back (Megatron-Bridge / Megatron-LM /
NeMo 2 readers share one table) into a config with the same spec; NeMo 2 configs are read
through that same table; the rules that used to be copied (Llama-3 RoPE defaults,
precision, windows) give one answer everywhere."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

from nemo_convert import hookimpl
from nemo_convert.api import import_hf, open_checkpoint
from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.megatron.megatron_config import nemo_to_provider
from nemo_convert.formats.megatron.provider_read import args_to_nemo, provider_to_nemo
from nemo_convert.formats.nemo2.nemo2 import nemo2_to_nemo1_config
from nemo_convert.plugins.manager import get_registry, registry_with
from nemo_convert.spec import LLAMA3_DEFAULTS, Llama3Scaling, first_difference, spec_of

PROVIDERS = get_registry().providers()
WRITABLE = [f for f in PROVIDERS.writable() if f != "nemotron"]  # the matrix's Nemotron has linear biases


def _family_config(family: str, **over) -> dict:
    """The family's own NeMo config for the family matrix's ``config.json`` (``over``: keys
    of that ``config.json`` replaced)."""
    import transformers
    from test_family_matrix import BASE, BASE_OF, FAMILIES

    if family not in FAMILIES:  # the hybrid family's configs: tests/tiny_hybrid.py (the published MoE pattern)
        from tiny_hybrid import shrunk

        return get_registry().family(family).config_to_nemo({**shrunk("nemotron_3_nano"), **over})
    cls_name, extra, _, _ = FAMILIES[family]
    hf = json.loads(getattr(transformers, cls_name)(**{**BASE_OF.get(family, BASE), **extra}).to_json_string())
    return get_registry().family(family).config_to_nemo({**hf, **over})


@pytest.mark.parametrize("family", WRITABLE)
def test_the_provider_reads_back_to_the_same_spec(family):
    cfg = _family_config(family)
    model = nemo_to_provider(cfg, family, providers=PROVIDERS, vocab_size=128, params_dtype=torch.bfloat16)
    back = provider_to_nemo(model, "run_config.yaml", PROVIDERS)
    assert first_difference(spec_of(cfg), spec_of(back)) is None
    assert get_registry().family_for_nemo_config(back).name == family  # and the claims find the family again


def test_llama3_scaling_is_one_rule_everywhere():
    """HF's llama3 block without its optional keys, Megatron-LM's --use-rope-scaling and the
    provider's rope_scaling all mean :data:`LLAMA3_DEFAULTS` with the factor given."""
    cfg = _family_config("llama", rope_scaling={"rope_type": "llama3", "factor": 32.0}, rope_parameters=None)
    want = Llama3Scaling(32.0, LLAMA3_DEFAULTS.low_freq_factor, LLAMA3_DEFAULTS.high_freq_factor,
                         LLAMA3_DEFAULTS.original_max_positions)
    assert spec_of(cfg).rope.scaling == want  # type: ignore[union-attr]
    model = nemo_to_provider(cfg, "llama", providers=PROVIDERS, vocab_size=128, params_dtype=torch.float32)
    assert (model["rope_scaling"], model["rope_scaling_factor"]) == (True, 32.0)
    assert spec_of(provider_to_nemo(model, "x", PROVIDERS)).rope.scaling == want  # type: ignore[union-attr]
    args = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "use_rope_scaling": True,
            "rope_scaling_factor": 32.0, "position_embedding_type": "rope", "swiglu": True,
            "normalization": "RMSNorm"}
    assert spec_of(args_to_nemo(args, "x")).rope.scaling == want  # type: ignore[union-attr]


@pytest.mark.parametrize("params_dtype, precision", [(torch.bfloat16, "bf16"), (torch.float16, 16),
                                                      (torch.float32, 32)])
def test_precision_is_one_rule_everywhere(params_dtype, precision):
    cfg = _family_config("llama")
    model = nemo_to_provider(cfg, "llama", providers=PROVIDERS, vocab_size=128, params_dtype=params_dtype)
    assert provider_to_nemo(model, "x", PROVIDERS)["precision"] == precision
    nemo2 = nemo2_to_nemo1_config({"config": {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaConfig",
                                              "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                              "params_dtype": {"_target_": str(params_dtype), "_call_": False}}},
                                  PROVIDERS)
    assert nemo2["precision"] == precision


def test_nemo2_goes_through_the_provider_table():
    """A NeMo 2 Llama config is the provider fields it holds: reading it is reading them."""
    cfg = _family_config("llama")
    model = nemo_to_provider(cfg, "llama", providers=PROVIDERS, vocab_size=128, params_dtype=torch.float32)
    fields = {k: v for k, v in model.items() if k != "_target_"}
    nemo2 = nemo2_to_nemo1_config({"_target_": "nemo.collections.llm.gpt.model.llama.LlamaModel",
                                   "config": {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaConfig",
                                              **fields}}, PROVIDERS)
    assert first_difference(spec_of(cfg), spec_of(nemo2)) is None
    assert nemo2["nemo2_target"].endswith("LlamaModel") and "target" not in nemo2
    assert get_registry().family_for_nemo_config(nemo2).name == "llama"


def test_windows_are_one_convention():
    """HF sliding_window=W: Megatron-Core window_size [W-1, 0] written, read back as W keys."""
    cfg = _family_config("mistral")
    assert spec_of(cfg).attention.window == 4 and cfg["window_size"] == [3, 0]
    model = nemo_to_provider(cfg, "mistral", providers=PROVIDERS, vocab_size=128, params_dtype=torch.float32)
    assert model["window_size"] == [3, 0]
    assert spec_of(provider_to_nemo(model, "x", PROVIDERS)).attention.window == 4


# -- the provider is the family's declaration ----------------------------------------------
class _FamilyPlugin:
    def __init__(self, family) -> None:
        self.family = family

    @hookimpl
    def nemo_convert_model_families(self):
        return [self.family]


@pytest.mark.slow
def test_a_plugin_family_declares_its_own_provider(tiny_llama, tmp_path):
    """An out-of-tree family with its own provider class is written and read back through
    its declaration alone (``ModelFamily.megatron_bridge``): no core table names it. The
    class's defaults are what an absent field means when the directory is read; without a
    declaration the family is refused by name."""
    import dataclasses

    from nemo_convert.formats.megatron.providers import DENSE, ProviderFamily

    llama = get_registry().family("llama")
    mine = ProviderFamily("my_bridge.models.my_llama.MyLlamaProvider", DENSE,
                          defaults=(("rotary_base", 500000.0),))
    fam = dataclasses.replace(llama, name="my_llama", hf_architectures=("MyLlamaForCausalLM",),
                              hf_model_types=("my_llama",), megatron_bridge=mine)
    reg = registry_with(("mine", _FamilyPlugin(fam)))
    assert reg.providers().of("my_llama") is mine and "my_llama" in reg.providers().writable()
    assert "my_llama" not in PROVIDERS.writable()
    src = tiny_llama()
    out = str(tmp_path / "mb")
    import_hf(src, out, family="my_llama", to="megatron-bridge", registry=reg)
    run_config = os.path.join(out, "iter_0000000", "run_config.yaml")
    model = yaml.safe_load(open(run_config))["model"]
    assert model["_target_"] == mine.target
    theta = json.load(open(os.path.join(src, "config.json"))).get("rope_theta", 10000.0)
    # the class default stands for an absent field: dropping rotary_base reads 500000
    yaml.safe_dump({**yaml.safe_load(open(run_config)), "model": {k: v for k, v in model.items()
                                                                   if k != "rotary_base"}}, open(run_config, "w"))
    with open_checkpoint(out, registry=reg) as ck:
        assert ck.config["rotary_base"] == 500000.0 != theta
    bare = registry_with(("mine", _FamilyPlugin(dataclasses.replace(fam, megatron_bridge=None))))
    with pytest.raises(UnsupportedError, match="'my_llama' has no confirmed Megatron-Bridge model provider"):
        import_hf(src, str(tmp_path / "mb2"), family="my_llama", to="megatron-bridge", registry=bare)
    assert not os.path.exists(tmp_path / "mb2")
