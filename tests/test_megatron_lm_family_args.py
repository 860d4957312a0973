"""Megatron-LM GPT runs of the families other than Llama, with ``args`` written by Megatron-LM's
own argument code (``tests/data/megatron_lm_args/<tag>+<mode>.common.pt``, ``make_args.py``
modes ``nemotron4``, ``qwen2``, ``mistral`` at core_v0.15.3, core_v0.16.1 and core_v0.19.0).

Each reads inertly, translates to the config of its family's tiny model (``test_family_matrix``'s
``make_model``) and is claimed by that family; as the ``common.pt`` of a Megatron-LM directory
it exports to the source's tensors, and transformers' logits of the export equal the source's.
Negative controls: the Nemotron run without its zero-centred gamma, or with another rotary
fraction, is not the model (refused by name, or other logits).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
import torch
from tiny_models import hf_tensors

from nemo_convert import api
from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.megatron.megatron_dir import _load_pickle_file
from nemo_convert.formats.megatron.provider_read import args_to_nemo
from nemo_convert.plugins.manager import get_registry

DATA = os.path.join(os.path.dirname(__file__), "data", "megatron_lm_args")
with open(os.path.join(DATA, "index.json")) as _f:
    INDEX: dict[str, Any] = json.load(_f)
#: make_args.py's mode → the family whose tiny model the run is.
MODES = {"nemotron4": "nemotron", "qwen2": "qwen2", "mistral": "mistral"}
RUNS = sorted(n for n in INDEX if n.partition("+")[2] in MODES)
#: What each run translates to: the tiny model's geometry (hidden 64, FFN 96, 2 layers, 4 heads
#: in 2 groups, 64 positions, untied, bf16) and the family's own fields.
SHARED = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4,
          "num_query_groups": 2, "max_position_embeddings": 64, "share_embeddings_and_output_weights": False,
          "precision": "bf16", "rotary_base": 10000.0}
WANT: dict[str, dict[str, Any]] = {
    "nemotron4": {"normalization": "layernorm", "layernorm_zero_centered_gamma": True, "activation": "squared-relu",
                  "rotary_percentage": 0.5, "kv_channels": 32, "bias": False, "qkv_bias": False,
                  "layernorm_epsilon": 1e-5},
    "qwen2": {"normalization": "rmsnorm", "layernorm_zero_centered_gamma": False, "activation": "fast-swiglu",
              "rotary_percentage": 1.0, "kv_channels": 16, "bias": False, "qkv_bias": True, "layernorm_epsilon": 1e-6},
    "mistral": {"normalization": "rmsnorm", "layernorm_zero_centered_gamma": False, "activation": "fast-swiglu",
                "rotary_percentage": 1.0, "kv_channels": 16, "bias": False, "qkv_bias": False,
                "layernorm_epsilon": 1e-6, "window_size": [3, 0]},
}


def _args(name: str) -> dict[str, Any]:
    args = _load_pickle_file(os.path.join(DATA, f"{name}.common.pt"), False)["args"]
    assert isinstance(args, dict)
    return args


def test_every_mode_is_written_at_three_releases() -> None:
    assert {n.partition("+")[2] for n in RUNS} == set(MODES)
    for mode in MODES:
        assert {n.partition("+")[0] for n in RUNS if n.endswith(f"+{mode}")} == {
            "core_v0.15.3", "core_v0.16.1", "core_v0.19.0"}
    # the zero-centred gamma as each release stores it (make_args.py: --apply-layernorm-1p)
    assert _args("core_v0.15.3+nemotron4")["apply_layernorm_1p"] is True
    assert "apply_layernorm_1p" not in _args("core_v0.16.1+nemotron4")
    assert _args("core_v0.16.1+nemotron4")["layernorm_zero_centered_gamma"] is True


@pytest.mark.parametrize("name", RUNS)
def test_family_runs_read_inertly_translate_and_are_claimed(name: str) -> None:
    args = _args(name)
    assert len(args) == INDEX[name]["attributes"] and args["model_type"] == "ModelType.encoder_or_decoder"
    assert args["params_dtype"] is torch.bfloat16
    mode = name.partition("+")[2]
    cfg = args_to_nemo(args, name, get_registry().providers())
    want = {**SHARED, **WANT[mode]}
    assert {k: cfg.get(k) for k in want} == want
    if mode != "mistral":
        assert not cfg.get("window_size")
    assert get_registry().family_for_nemo_config(cfg).name == MODES[mode]


@pytest.mark.parametrize("over, words", [
    ({"quick_geglu": True, "squared_relu": False}, "activation_func quick_gelu without GPT-OSS"),
    ({"swiglu": True}, "swiglu and squared_relu are both set"),
    ({"normalization": "RMSNorm"}, "layernorm_zero_centered_gamma without GemmaModelProvider"),
    ({"position_embedding_type": "learned_absolute"}, "position_embedding_type='learned_absolute'"),
    ({"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm=True"),
    ({"use_legacy_models": True, "openai_gelu": True}, "openai_gelu=True"),
    ({"qk_l2_norm": True}, "qk_l2_norm=True"),
    ({"use_mup": True}, "use_mup=True"),
    ({"moe_mlp_glu_interleave_size": 32}, "moe_mlp_glu_interleave_size=32"),
])
def test_family_run_variants_not_computed_are_refused_by_name(over: dict[str, Any], words: str) -> None:
    with pytest.raises(NemoConvertError, match=words):
        args_to_nemo({**_args("core_v0.16.1+nemotron4"), **over}, "x", get_registry().providers())


def test_openai_gelu_of_a_megatron_core_run_changes_nothing() -> None:
    """``--openai-gelu`` is read by Megatron-LM's legacy models only (run_section's docstring)."""
    args = _args("core_v0.19.0+qwen2")
    table = get_registry().providers()
    assert args_to_nemo({**args, "openai_gelu": True}, "x", table) == args_to_nemo(args, "x", table)


# ------------------------------------------------------------------ directories
@pytest.fixture(scope="module")
def family_bridge_dirs(tmp_path_factory: Any) -> dict[str, tuple[str, str]]:
    from test_family_matrix import make_model
    from test_megatron_dirs import PROVIDER_MODEL_OVERRIDES

    root = tmp_path_factory.mktemp("mlm_family_args")
    out: dict[str, tuple[str, str]] = {}
    for family in sorted(set(MODES.values())):
        src = make_model(str(root / family / "hf"), family, **PROVIDER_MODEL_OVERRIDES.get(family, {}))
        mb = str(root / family / "mb")
        api.import_hf(src, mb, to="megatron-bridge")
        out[family] = (src, mb)
    return out


def _megatron_lm_dir(mb: str, out: str, args: dict[str, Any] | None, fixture: str | None = None) -> str:
    """The Megatron-Bridge directory as Megatron-LM lays it out, ``common.pt`` a fixture's file
    or (``args``) the common state holding those args."""
    it = os.path.join(out, "iter_0000100")
    shutil.copytree(os.path.join(mb, "iter_0000000"), it)
    for name in ("run_config.yaml", "train_state.pt", "nemo_convert.json"):
        os.remove(os.path.join(it, name))
    shutil.rmtree(os.path.join(it, "tokenizer"), ignore_errors=True)
    if fixture is not None:
        shutil.copyfile(fixture, os.path.join(it, "common.pt"))
    else:
        import argparse

        torch.save({"args": argparse.Namespace(**(args or {})), "checkpoint_version": 3.0, "iteration": 100},
                   os.path.join(it, "common.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("100")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_family_run_directory_exports_bit_exact(family_bridge_dirs: dict[str, tuple[str, str]], tmp_path: Any,
                                                 cli: Any, name: str) -> None:
    from test_family_matrix import logits

    family = MODES[name.partition("+")[2]]
    src, mb = family_bridge_dirs[family]
    mlm = _megatron_lm_dir(mb, str(tmp_path / "mlm"), None, os.path.join(DATA, f"{name}.common.pt"))
    assert api.inspect_checkpoint(mlm)["family"] == family
    back = str(tmp_path / "back")
    code, _, err = cli("export", mlm, "-o", back, "-q")  # no --trust-pickle
    assert code == 0, err
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(logits(back), logits(src))


@pytest.mark.slow
@pytest.mark.parametrize("over, refused", [
    ({"apply_layernorm_1p": False}, "nemotron: layernorm_zero_centered_gamma=False: NemotronForCausalLM computes True"),
    ({"rotary_percent": 1.0}, None),
    ({"rotary_percent": 0.25}, None),
])
def test_nemotron_run_without_its_norms_or_rotary_fraction_is_not_the_model(
        family_bridge_dirs: dict[str, tuple[str, str]], tmp_path: Any, over: dict[str, Any], refused: str | None) -> None:
    """Negative controls: the same tensors under the core_v0.15.3 run's args less
    ``--apply-layernorm-1p`` are refused by name (no family computes plain LayerNorm with squared
    ReLU and half-rotary RoPE); with another ``--rotary-percent`` they export as a Nemotron whose
    logits differ (measured: max |Δ| 4.49 at 1.0, 4.02 at 0.25)."""
    from test_family_matrix import logits

    src, mb = family_bridge_dirs["nemotron"]
    args = {k: v for k, v in {**_args("core_v0.15.3+nemotron4"), **over}.items() if k != "model_type"}
    mlm = _megatron_lm_dir(mb, str(tmp_path / "mlm"), args)
    back = str(tmp_path / "back")
    if refused is not None:
        with pytest.raises(NemoConvertError, match=refused):
            api.export_hf(mlm, back)
        return
    api.export_hf(mlm, back)
    assert (logits(back) - logits(src)).abs().max() > 1.0
