"""Megatron-LM ``args`` of hybrid (Mamba / Nemotron-H) training runs, as real runs write them.

``tests/data/megatron_lm_args/<tag>+hybrid.common.pt`` and ``+hybrid-moe`` were written by
Megatron-LM's own ``parse_args`` + ``validate_args`` at core_v0.13.1 … core_v0.19.0 (:data:`TAGS`) for a tiny
Nemotron-H-like ``pretrain_mamba.py`` run (``make_args.py`` there: the sizes of
``tests/tiny_hybrid.py``'s ``nemotron_h_8b``, pattern ``M-*M-M``, and ``nemotron_3_nano``,
``MEM*EM`` with sigmoid-routed experts). Each reads inertly and translates to that tiny model's
config; as the ``common.pt`` of a Megatron-LM directory it exports to the HF source, bit-exact
(the weights: our Megatron-Bridge directory's, and in the slow test Megatron-Core's own
``dist_checkpointing.save`` of the ``MambaModel`` it built, whose logits equal transformers').
A wrong pattern or a Mamba size dropped from the command line fails.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch
from test_megatron_lm_args import DATA, INDEX, exports_to_source, megatron_lm_dir
from tiny_models import read_json

from nemo_convert import api
from nemo_convert.errors import NemoConvertError, UnsupportedError
from nemo_convert.formats.megatron.provider_read import args_to_nemo
from nemo_convert.formats.megatron.megatron_dir import _load_pickle_file
from nemo_convert.formats.megatron.megatron_lm_args import (
    HYBRID_SPECS,
    ratio_pattern,
    run_pattern,
)
from nemo_convert.plugins.manager import get_registry

HYBRID = sorted(n for n in INDEX if "+hybrid" in n)
#: fixture → the tiny model of tests/tiny_hybrid.py its command line describes
MODEL = {n: "nemotron_3_nano" if n.endswith("+hybrid-moe") else "nemotron_h_8b" for n in HYBRID}
#: What each tiny model's config is in NeMo's fields (tests/tiny_hybrid.py CONFIGS: head size
#: 128 from Nemotron-H-8B's attention_head_dim, 16 for the nano).
WANT: dict[str, dict[str, Any]] = {
    "nemotron_h_8b": {"num_layers": 6, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4,
                      "num_query_groups": 2, "kv_channels": 128, "hybrid_override_pattern": "M-*M-M",
                      "mamba_state_dim": 16, "mamba_head_dim": 8, "mamba_num_groups": 2, "mamba_num_heads": 8,
                      "activation": "squared-relu", "normalization": "rmsnorm", "position_embedding_type": "none",
                      "share_embeddings_and_output_weights": False, "bias": False, "precision": "bf16",
                      "layernorm_epsilon": 1e-5, "max_position_embeddings": 64},
}
WANT["nemotron_3_nano"] = {**WANT["nemotron_h_8b"], "kv_channels": 16, "hybrid_override_pattern": "MEM*EM",
                           "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
                           "moe_shared_expert_intermediate_size": 48, "moe_router_score_function": "sigmoid",
                           "moe_router_enable_expert_bias": True, "moe_router_topk_scaling_factor": 2.5}


def _read(name: str) -> dict[str, Any]:
    return _load_pickle_file(os.path.join(DATA, f"{name}.common.pt"), False)["args"]


#: The releases with the hybrid fixtures: every tag of tests/test_megatron_lm_args.py whose
#: Megatron-LM has --mamba-num-heads (from core_v0.13; core_v0.12.3 has no such argument, its
#: Mamba heads are always 2 x hidden / head size, not the tiny model's). The MoE run only from
#: core_v0.16: up to core_v0.15.3 validate_args asserts "Model Spec must be None when using MoEs"
#: (core_v0.15.3 arguments.py line 1027), and a hybrid run needs its --spec.
TAGS = ("core_v0.13.1", "core_v0.14.0", "core_v0.15.3", "core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0")
MOE_TAGS = ("core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0")


def test_fixtures_are_every_release_with_the_pattern_flag_of_each() -> None:
    assert sorted(HYBRID) == sorted([f"{t}+hybrid" for t in TAGS] + [f"{t}+hybrid-moe" for t in MOE_TAGS])
    for n in HYBRID:
        flags = INDEX[n]["flags"]
        newer = n.startswith(("core_v0.18", "core_v0.19"))  # megatron/core/models/hybrid/ exists
        assert ("--hybrid-layer-pattern" in flags) == newer and ("--hybrid-override-pattern" in flags) != newer
        assert tuple(flags[flags.index("--spec") + 1:][:2]) == HYBRID_SPECS[1 if newer else 0]
        assert len(INDEX[n]["commit"]) == 40 and INDEX[n]["commit"] == INDEX[n.split("+")[0]]["commit"]


@pytest.mark.parametrize("name", HYBRID)
def test_real_hybrid_args_read_inertly_and_translate(name: str) -> None:
    args = _read(name)
    assert isinstance(args, dict) and len(args) == INDEX[name]["attributes"]
    assert args["model_type"] == "ModelType.encoder_or_decoder" and args["params_dtype"] is torch.bfloat16
    cfg = args_to_nemo(args, name, get_registry().providers())
    want = WANT[MODEL[name]]
    assert {k: cfg.get(k) for k in want} == want
    assert cfg["target"].endswith("MegatronMambaModel")
    assert get_registry().family_for_nemo_config(cfg).name == "nemotron_h"  # the family's own claim
    with pytest.raises(UnsupportedError, match="no installed family declares a hybrid stack"):
        args_to_nemo(args, name)  # no provider table: no declaration to read it by


def test_the_same_config_as_the_megatron_bridge_directory(tmp_path: Any) -> None:
    """The args and the provider section of the same model read to the same NeMo config,
    apart from what only one of them holds (the vocabulary is the directory's; the args'
    ``init_method_std`` is the run's own)."""
    from tiny_hybrid import make_nemotron_h

    src = make_nemotron_h(str(tmp_path / "hf"), "nemotron_3_nano")
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    with api.open_checkpoint(mb) as ck:
        bridge = dict(ck.config)
    args = args_to_nemo(_read("core_v0.16.1+hybrid-moe"), "x", get_registry().providers())
    shared = sorted((set(bridge) & set(args)) - {"nemo_convert", "tensor_model_parallel_size",
                                                 "pipeline_model_parallel_size", "expert_model_parallel_size"})
    assert len(shared) > 30
    assert {k: args[k] for k in shared} == {k: bridge[k] for k in shared}


# ------------------------------------------------------------- Megatron-LM directory
@pytest.fixture(scope="module")
def bridge_dirs(tmp_path_factory: Any) -> dict[str, tuple[str, str]]:
    from tiny_hybrid import make_nemotron_h

    root = tmp_path_factory.mktemp("mlm_hybrid")
    out = {}
    for model in ("nemotron_h_8b", "nemotron_3_nano"):
        src = make_nemotron_h(str(root / model / "hf"), model)
        mb = str(root / model / "mb")
        api.import_hf(src, mb, to="megatron-bridge")
        out[model] = (src, mb)
    return out


@pytest.mark.slow  # makes transformers models
@pytest.mark.parametrize("name", HYBRID)
def test_megatron_lm_directory_with_real_hybrid_args_exports(bridge_dirs: dict[str, tuple[str, str]], tmp_path: Any,
                                                             cli: Any, name: str) -> None:
    src, mb = bridge_dirs[MODEL[name]]
    mlm = megatron_lm_dir(mb, str(tmp_path / "mlm"), os.path.join(DATA, f"{name}.common.pt"))
    cfg = exports_to_source(cli, src, mlm, str(tmp_path / "back"))
    assert cfg["architectures"] == ["NemotronHForCausalLM"]
    assert (cfg["hybrid_override_pattern"], cfg["ssm_state_size"], cfg["vocab_size"]) == (
        WANT[MODEL[name]]["hybrid_override_pattern"], 16, 256)


@pytest.mark.slow  # makes transformers models
@pytest.mark.parametrize("change, words", [
    # the same layer kinds in another order
    ({"hybrid_override_pattern": "M*-M-M"}, "source tensors not consumed: decoder.layers.1.mlp"),
    # --mamba-state-dim dropped (TransformerConfig's default 128); --mamba-num-heads dropped (2 x hidden / head size)
    ({"mamba_state_dim": 128}, r"in_proj.weight.B: shape \[32, 64\] .* does not fit the sections"),
    ({"mamba_num_heads": None}, r"in_proj.weight.z: shape \[64, 64\] .* does not fit the sections"),
])
def test_a_wrong_pattern_or_a_dropped_mamba_size_fails(bridge_dirs: dict[str, tuple[str, str]], tmp_path: Any,
                                                       change: dict[str, Any], words: str) -> None:
    """Negative controls: the directory's weights under args that do not describe them."""
    _, mb = bridge_dirs["nemotron_h_8b"]
    args = {**_read("core_v0.16.1+hybrid"), **change}
    mlm = megatron_lm_dir(mb, str(tmp_path / "mlm"), args)
    with pytest.raises(NemoConvertError, match=words):
        api.export_hf(mlm, str(tmp_path / "back"))
    assert not os.path.exists(tmp_path / "back")


# ------------------------------------------------------------- refusals and the pattern
def _cfg(**over: Any) -> dict[str, Any]:
    return args_to_nemo({**_read("core_v0.16.1+hybrid"), **over}, "x", get_registry().providers())


@pytest.mark.parametrize("over, words", [
    ({"spec": None}, r"is_hybrid_model=True marks a hybrid \(Mamba\) run, but spec=\[\]"),
    ({"spec": ["my.specs", "stack"]}, "is not Megatron-Core's Mamba / hybrid stack spec"),
    ({"transformer_impl": "inference_optimized"}, "transformer_impl='inference_optimized'"),
    ({"hybrid_override_pattern": "M-*M-M/M*"}, "multi-token-prediction pattern"),
    ({"mtp_hybrid_override_pattern": "M*"}, "multi-token-prediction pattern"),
    ({"hybrid_override_pattern": "M-*G-M"}, r"has 'G'"),
    ({"hybrid_override_pattern": "M-*M-MM"}, "num_layers=6 but hybrid_layer_pattern has 7 layers"),
    ({"hybrid_attention_ratio": 0.5}, "other layer counts than the ratios' allocation"),
    ({"position_embedding_type": "rope"}, "position_embedding_type='rope'"),
    ({"squared_relu": False, "swiglu": True}, "gated_linear_unit=True"),
    ({"squared_relu": False}, "activation_func='gelu'"),
    ({"fp32_residual_connection": True}, "fp32_residual_connection=True"),
    ({"squared_relu": False, "quick_geglu": True}, "gated_linear_unit=True"),
    ({"model_type": "ModelType(2)"}, r"model_type=ModelType\(2\)"),
])
def test_what_the_family_does_not_compute_is_refused_by_name(over: dict[str, Any], words: str) -> None:
    with pytest.raises(NemoConvertError, match=words):
        _cfg(**over)


def test_a_gpt_run_with_a_hybrid_marker_is_refused_and_plain_gpt_is_not_hybrid() -> None:
    gpt = _load_pickle_file(os.path.join(DATA, "core_v0.16.1.common.pt"), False)["args"]
    assert args_to_nemo(gpt, "x", get_registry().providers())["target"].endswith("MegatronGPTModel")
    with pytest.raises(UnsupportedError, match="is_hybrid_model=True marks a hybrid"):
        args_to_nemo({**gpt, "is_hybrid_model": True}, "x", get_registry().providers())


def test_core_v0_19_spellings() -> None:
    """The deprecated flag copied into the new one reads once; pipeline-stage bars are layout."""
    args = _read("core_v0.19.0+hybrid")
    assert _cfg(**{**args, "hybrid_override_pattern": "M-*M-M"})["hybrid_override_pattern"] == "M-*M-M"
    assert _cfg(**{**args, "hybrid_layer_pattern": "M-*|M-M"})["hybrid_override_pattern"] == "M-*M-M"
    with pytest.raises(UnsupportedError, match="differ"):
        _cfg(**{**args, "hybrid_override_pattern": "M*-M-M"})


#: Megatron-Core's allocations (core_v0.16.1 ``allocate_layers``; test_ratio_pattern_is_megatron_cores_allocation
#: checks them there): core_v0.16.1 examples/mamba/train.sh's 800M (48 layers) and 8B (56 layers) runs at its
#: ratios 0.08 / 0.5 — the very patterns core_v0.19.0's train.sh spells out (lines 10, 17) — and small cases.
RATIOS = {
    (48, 0.08, 0.5): "M-M-M--M-*M-M-M-M--*M-M-M-M-*M--M-M-M-*M-M--M-M-",
    (56, 0.08, 0.5): "M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M-",
    (9, 0.0, 0.0): "MMMMMMMMM",
    (6, 1 / 6, 1 / 3): "MM-*M-",
    (10, 0.3, 0.2): "MM*M-*M*M-",
}


def test_ratio_pattern_pinned() -> None:
    for (layers, a, m), want in RATIOS.items():
        assert ratio_pattern(layers, a, m) == want, (layers, a, m)
    args = {**_read("core_v0.16.1+hybrid"), "hybrid_override_pattern": None, "num_layers": 48,
            "hybrid_attention_ratio": 0.08, "hybrid_mlp_ratio": 0.5}
    assert run_pattern(args, "x") == RATIOS[(48, 0.08, 0.5)]
    with pytest.raises(UnsupportedError, match="at most 1"):
        ratio_pattern(4, 0.7, 0.5)


@pytest.mark.slow  # imports Megatron-Core
def test_ratio_pattern_is_megatron_cores_allocation() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    cases = [(n, a / 20, m / 20) for n in (1, 2, 3, 5, 6, 9, 10, 17, 48, 56, 118) for a in range(0, 21, 3)
             for m in range(0, 21 - a, 4)]
    cases += list(RATIOS)
    for n, a, m in cases:
        assert ratio_pattern(n, a, m) == "".join(allocate_layers(n, a, m)), (n, a, m)
    print(len(cases), "allocations equal")


# ------------------------------------------------------------- Megatron-Core's own save
@pytest.mark.slow  # Megatron-Core in subprocesses
@pytest.mark.parametrize("name, fixture, tp, ep", [("nemotron_h_8b", "core_v0.16.1+hybrid", 1, 1),
                                                   ("nemotron_3_nano", "core_v0.16.1+hybrid-moe", 1, 1),
                                                   ("nemotron_3_nano", "core_v0.16.1+hybrid-moe", 2, 1),
                                                   ("nemotron_3_nano", "core_v0.16.1+hybrid-moe", 1, 2)])
def test_megatron_lm_run_saved_by_megatron_core_exports_to_hf(tmp_path: Any, monkeypatch: Any, name: str,
                                                              fixture: str, tp: int, ep: int) -> None:
    """Megatron-Core 0.16.1 builds the ``MambaModel`` from our checkpoint (its logits equal
    transformers': tests/test_nemotron_h_megatron.py), then saves it as a Megatron-LM run does
    (``{'model': sharded_state_dict(), 'args': ...}`` through ``dist_checkpointing.save``, the
    args a real run's); that directory exports to the HF source (fp32: the bf16 source widened)."""
    pytest.importorskip("megatron.core")
    from test_nemotron_h_megatron import _ok, _run, exports_widened_source

    monkeypatch.setenv("NEMOTRON_H_MLM_ARGS", os.path.join(DATA, f"{fixture}.common.pt"))
    saved = str(tmp_path / "mlm")
    os.makedirs(saved)
    _ok(_run(tmp_path, name, tp=tp, ep=ep, save_to=saved))
    assert sorted(os.listdir(saved)) == ["iter_0000100", "latest_checkpointed_iteration.txt"]
    back = str(tmp_path / "back")
    api.export_hf(saved, back)
    exports_widened_source(str(tmp_path / "hf"), back)
    cfg = read_json(os.path.join(back, "config.json"))
    assert cfg["hybrid_override_pattern"] == WANT[name]["hybrid_override_pattern"]
    shutil.rmtree(back)
