"""Every target's config is a table over the spec, written once: the Megatron-Bridge
provider written from a family's NeMo config reads back (Megatron-Bridge / Megatron-LM /
NeMo 2 readers share one table) into a config with the same spec; NeMo 2 configs are read
through that same table; the rules that used to be copied (Llama-3 RoPE defaults,
precision, windows) give one answer everywhere."""

from __future__ import annotations

import json

import pytest
import torch

from nemo_convert.formats.megatron.megatron_config import (PROVIDER_FAMILIES, args_to_nemo, nemo_to_provider,
                                                           provider_to_nemo)
from nemo_convert.formats.nemo2.nemo2 import nemo2_to_nemo1_config
from nemo_convert.plugins.manager import get_registry
from nemo_convert.spec import LLAMA3_DEFAULTS, Llama3Scaling, first_difference, spec_of

WRITABLE = sorted(f for f in PROVIDER_FAMILIES if f != "nemotron")  # the matrix's Nemotron has linear biases


def _family_config(family: str, **over) -> dict:
    """The family's own NeMo config for the family matrix's ``config.json`` (``over``: keys
    of that ``config.json`` replaced)."""
    import transformers
    from test_family_matrix import BASE, BASE_OF, FAMILIES

    cls_name, extra, _, _ = FAMILIES[family]
    hf = json.loads(getattr(transformers, cls_name)(**{**BASE_OF.get(family, BASE), **extra}).to_json_string())
    return get_registry().family(family).config_to_nemo({**hf, **over})


@pytest.mark.parametrize("family", WRITABLE)
def test_the_provider_reads_back_to_the_same_spec(family):
    cfg = _family_config(family)
    model = nemo_to_provider(cfg, family, vocab_size=128, params_dtype=torch.bfloat16)
    back = provider_to_nemo(model, "run_config.yaml")
    assert first_difference(spec_of(cfg), spec_of(back)) is None
    assert get_registry().family_for_nemo_config(back).name == family  # and the claims find the family again


def test_llama3_scaling_is_one_rule_everywhere():
    """HF's llama3 block without its optional keys, Megatron-LM's --use-rope-scaling and the
    provider's rope_scaling all mean :data:`LLAMA3_DEFAULTS` with the factor given."""
    cfg = _family_config("llama", rope_scaling={"rope_type": "llama3", "factor": 32.0}, rope_parameters=None)
    want = Llama3Scaling(32.0, LLAMA3_DEFAULTS.low_freq_factor, LLAMA3_DEFAULTS.high_freq_factor,
                         LLAMA3_DEFAULTS.original_max_positions)
    assert spec_of(cfg).rope.scaling == want  # type: ignore[union-attr]
    model = nemo_to_provider(cfg, "llama", vocab_size=128, params_dtype=torch.float32)
    assert (model["rope_scaling"], model["rope_scaling_factor"]) == (True, 32.0)
    assert spec_of(provider_to_nemo(model, "x")).rope.scaling == want  # type: ignore[union-attr]
    args = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "use_rope_scaling": True,
            "rope_scaling_factor": 32.0, "position_embedding_type": "rope", "swiglu": True,
            "normalization": "RMSNorm"}
    assert spec_of(args_to_nemo(args, "x")).rope.scaling == want  # type: ignore[union-attr]


@pytest.mark.parametrize("params_dtype, precision", [(torch.bfloat16, "bf16"), (torch.float16, 16),
                                                      (torch.float32, 32)])
def test_precision_is_one_rule_everywhere(params_dtype, precision):
    cfg = _family_config("llama")
    model = nemo_to_provider(cfg, "llama", vocab_size=128, params_dtype=params_dtype)
    assert provider_to_nemo(model, "x")["precision"] == precision
    nemo2 = nemo2_to_nemo1_config({"config": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                              "params_dtype": {"_target_": str(params_dtype), "_call_": False}}})
    assert nemo2["precision"] == precision


def test_nemo2_goes_through_the_provider_table():
    """A NeMo 2 Llama config is the provider fields it holds: reading it is reading them."""
    cfg = _family_config("llama")
    model = nemo_to_provider(cfg, "llama", vocab_size=128, params_dtype=torch.float32)
    fields = {k: v for k, v in model.items() if k != "_target_"}
    nemo2 = nemo2_to_nemo1_config({"_target_": "nemo.collections.llm.gpt.model.llama.LlamaModel",
                                   "config": {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaConfig",
                                              **fields}})
    assert first_difference(spec_of(cfg), spec_of(nemo2)) is None
    assert nemo2["nemo2_target"].endswith("LlamaModel") and "target" not in nemo2
    assert get_registry().family_for_nemo_config(nemo2).name == "llama"


def test_windows_are_one_convention():
    """HF sliding_window=W: Megatron-Core window_size [W-1, 0] written, read back as W keys."""
    cfg = _family_config("mistral")
    assert spec_of(cfg).attention.window == 4 and cfg["window_size"] == [3, 0]
    model = nemo_to_provider(cfg, "mistral", vocab_size=128, params_dtype=torch.float32)
    assert model["window_size"] == [3, 0]
    assert spec_of(provider_to_nemo(model, "x")).attention.window == 4
