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
from typing import Any

import pytest
import torch
from test_megatron_lm_args import exports_to_source, megatron_lm_dir

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


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_family_run_directory_exports_bit_exact(family_bridge_dirs: dict[str, tuple[str, str]], tmp_path: Any,
                                                 cli: Any, name: str) -> None:
    from test_family_matrix import logits

    family = MODES[name.partition("+")[2]]
    src, mb = family_bridge_dirs[family]
    mlm = megatron_lm_dir(mb, str(tmp_path / "mlm"), os.path.join(DATA, f"{name}.common.pt"))
    assert api.inspect_checkpoint(mlm)["family"] == family
    back = str(tmp_path / "back")
    exports_to_source(cli, src, mlm, back)
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
    mlm = megatron_lm_dir(mb, str(tmp_path / "mlm"), args)
    back = str(tmp_path / "back")
    if refused is not None:
        with pytest.raises(NemoConvertError, match=refused):
            api.export_hf(mlm, back)
        return
    api.export_hf(mlm, back)
    assert (logits(back) - logits(src)).abs().max() > 1.0


# ------------------------------------------------------------------ a run Megatron-Core saved
def _mcore_worker(root: str, name: str) -> None:  # runs in a subprocess (Megatron's global state)
    """Megatron-Core 0.16.1 builds the ``GPTModel`` of run ``name``'s args as
    ``core_transformer_config_from_args`` does (core_v0.16.1 ``arguments.py`` lines 1306-1370:
    every ``TransformerConfig`` field the args have, by name; the MLP of the activation
    switches; ``num_query_groups`` with ``--group-query-attention``) and ``gpt_builders.py``
    (lines 99-108: the vocabulary, positions, tying, RoPE type, fraction and base), with random
    weights; saves ``{'model', 'args', …}`` with ``dist_checkpointing.save`` as a Megatron-LM
    training checkpoint, and its logits. CPU shims: fp32 and no fused kernels; the local spec's
    torch norm refuses zero-centred gamma (``torch_norm.py`` line 27), so the model is built
    without it and, once saved, runs with 1 + w in memory — what Transformer Engine's
    zero-centred norm computes from the stored w."""
    import argparse
    import contextlib
    import dataclasses
    import warnings

    warnings.simplefilter("ignore")
    import torch.distributed as dist
    import torch.nn.functional as fn
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.activations import squared_relu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    with open(os.path.join(DATA, f"{name}.common.pt"), "rb") as f:
        args: argparse.Namespace = torch.load(f, weights_only=False)["args"]
    args.bf16, args.params_dtype = False, torch.float32  # this run's command line: fp32 (CPU)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in vars(args).items() if k in fields}
    kw.update(num_query_groups=args.num_query_groups if args.group_query_attention else None,
              num_moe_experts=args.num_experts)
    if args.swiglu:
        kw.update(activation_func=fn.silu, gated_linear_unit=True)
    if args.squared_relu:
        kw.update(activation_func=squared_relu)
    zero_centred = bool(kw.pop("layernorm_zero_centered_gamma", False))
    kw.update(params_dtype=torch.float32, pipeline_dtype=torch.float32, use_cpu_initialization=True,
              bias_activation_fusion=False, masked_softmax_fusion=False, bias_dropout_fusion=False,
              persist_layer_norm=False, gradient_accumulation_fusion=False, apply_rope_fusion=False,
              attention_softmax_in_fp32=True, deallocate_pipeline_outputs=True)
    cfg = TransformerConfig(**kw)
    model = GPTModel(cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=args.normalization,
                                                                         qk_layernorm=args.qk_layernorm),
                     vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
                     position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                     rotary_base=args.rotary_base,
                     share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                     parallel_output=False).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ckpt = f"{root}/mlm/iter_0000100"
    os.makedirs(ckpt)
    dist_checkpointing.save({"model": model.sharded_state_dict(), "args": args, "checkpoint_version": 3.0,
                             "iteration": 100}, ckpt)
    with open(f"{root}/mlm/latest_checkpointed_iteration.txt", "w") as f:
        f.write("100")
    if zero_centred:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(("layernorm.weight", "layer_norm_weight")):
                    p.add_(1.0)
    from test_family_matrix import IDS

    n = IDS.shape[1]
    mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        logits = model(IDS, torch.arange(n)[None], mask)
    torch.save(logits, f"{root}/mcore_logits.pt")
    dist.destroy_process_group()
    print("MCORE-WORKER OK")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["core_v0.16.1+nemotron4", "core_v0.16.1+qwen2"])
def test_run_megatron_core_saved_exports_with_its_logits(tmp_path: Any, name: str) -> None:
    """A Megatron-LM checkpoint Megatron-Core itself saved under the run's args exports to an HF
    model whose logits are Megatron-Core's."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("megatron.core") is None:
        pytest.skip("needs megatron.core")
    from test_family_matrix import IDS, logits

    root = str(tmp_path)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.path.dirname(os.path.abspath(__file__)),
                                                       os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), root, name], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "MCORE-WORKER OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    mlm = f"{root}/mlm"
    assert api.inspect_checkpoint(mlm)["family"] == MODES[name.partition("+")[2]]
    back = f"{root}/back"
    api.export_hf(mlm, back)
    mcore = torch.load(f"{root}/mcore_logits.pt")
    got = logits(back, IDS)
    mcore = mcore if mcore.shape == got.shape else mcore.transpose(0, 1)
    delta = (got - mcore).abs().max().item()
    print(f"{name}: max|dlogit| HF export vs Megatron-Core = {delta:.3g}")
    assert delta < 1e-4, delta


if __name__ == "__main__":
    import sys

    _mcore_worker(sys.argv[1], sys.argv[2])
