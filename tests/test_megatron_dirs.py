"""Megatron-Bridge and Megatron-LM checkpoint directories, without Megatron installed:
the directory we write (file tree, run_config.yaml, train_state.pt, common.pt), reading it
back bit-exactly, Megatron-LM directories (torch_dist + common.pt args, legacy
mp_rank_XX/model_optim_rng.pt) built here by hand, and bad input. Megatron-Core itself
loads and writes these directories in tests/test_megatron_dirs_mcore.py."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil

import pytest
import torch
import yaml

from nemo_convert import api
from nemo_convert.errors import InputError, UnsafePickleError, UnsupportedError
from nemo_convert.formats.megatron.megatron_config import nemo_to_provider
from nemo_convert.formats.megatron.provider_read import args_to_nemo
from nemo_convert.plugins.manager import get_registry
from tiny_models import edit_config, hf_tensors, read_json

#: The installed families' Megatron-Bridge providers (what the CLI and the API use).
PROVIDERS = get_registry().providers()



def bridge_round_trip(src: str, tmp_path, family: str, *, every_tensor: bool = False):  # type: ignore[no-untyped-def]
    """HF ``src`` → Megatron-Bridge directory → export: the source's tensors bit for bit and
    transformers' logits; then the same directory without our record (as Megatron-Bridge
    writes it): the family is found from the provider alone, and its export holds the source's
    tensors bit for bit (``every_tensor``: all of them; else a subset, e.g. without a tied
    head). Returns ``run_config.yaml``'s model section, the bare export and the logits."""
    from test_family_matrix import assert_same, logits

    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert_same(src, back)
    ref = logits(src)
    assert torch.equal(logits(back), ref)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    assert api.inspect_checkpoint(out)["family"] == family
    bare = str(tmp_path / "bare")
    api.export_hf(out, bare)
    a, b = hf_tensors(src), hf_tensors(bare)
    assert (set(b) == set(a) if every_tensor else set(b) <= set(a)) and all(torch.equal(a[k], b[k]) for k in b)
    return model, bare, ref


def logical(path: str, **kw) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    with api.open_checkpoint(path, **kw) as ck:
        return {k: ck.source.load(k).clone() for k in ck.source.keys()}


def megatron_lm_args(**over) -> argparse.Namespace:  # type: ignore[no-untyped-def]
    """An ``args`` namespace with Megatron-LM core_v0.16.1's attribute names
    (megatron/training/arguments.py: the TransformerConfig-derived group, line 1621, and the
    network-size group, lines 1630-1697; params_dtype set by validate_args, lines 701-713)."""
    values = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, group_query_attention=True,
        num_query_groups=2, kv_channels=16, max_position_embeddings=256, seq_length=64, swiglu=True,
        normalization="RMSNorm", layernorm_epsilon=1e-5, position_embedding_type="rope",
        use_rotary_position_embeddings=False, rotary_base=10000, rotary_percent=1.0,
        rotary_seq_len_interpolation_factor=None, use_rope_scaling=False, rope_scaling_factor=8.0,
        untie_embeddings_and_output_weights=True, add_bias_linear=False, add_qkv_bias=False, qk_layernorm=False,
        layernorm_zero_centered_gamma=False, apply_residual_connection_post_layernorm=False,
        multi_latent_attention=False, num_experts=None, rotary_interleaved=False, squared_relu=False,
        quick_geglu=False, openai_gelu=False, window_size=None, hidden_dropout=0.0, attention_dropout=0.0,
        init_method_std=0.02, tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/nonexistent/llama",
        vocab_size=None, make_vocab_size_divisible_by=128, padded_vocab_size=384,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, bf16=False, fp16=False,
        params_dtype=torch.float32, transformer_impl="transformer_engine", ckpt_format="torch_dist",
        world_size=1, data_parallel_size=1, iteration=100, lr=3e-4, min_lr=3e-5, train_iters=100,
    )
    values.update(over)
    return argparse.Namespace(**values)


def common_pt(args: argparse.Namespace) -> dict:
    return {"args": args, "checkpoint_version": 3.0, "iteration": 100,
            "optimizer": {"param_groups": [{"lr": 0.0, "wd_mult": 1.0}], "state": {"common_step": torch.tensor(1.0)}},
            "opt_param_scheduler": {"max_lr": 3e-4, "num_steps": 100}, "num_floating_point_operations_so_far": 0}


def as_megatron_lm(mb: str, out: str, args: argparse.Namespace, iteration: int = 100) -> str:
    """A Megatron-LM torch_dist directory from a Megatron-Bridge one: no run_config.yaml,
    train_state.pt or tokenizer/, common.pt holding ``args``."""
    it = os.path.join(out, f"iter_{iteration:07d}")
    shutil.copytree(os.path.join(mb, "iter_0000000"), it)
    for name in ("run_config.yaml", "train_state.pt", "nemo_convert.json"):
        os.remove(os.path.join(it, name))
    shutil.rmtree(os.path.join(it, "tokenizer"), ignore_errors=True)
    torch.save(common_pt(args), os.path.join(it, "common.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    return out


# ---------------------------------------------------------------------------- writing
def test_import_writes_megatron_bridge_directory(tiny_llama, tmp_path, cli) -> None:
    src = tiny_llama()
    out = str(tmp_path / "mb")
    code, _, err = cli("import", src, "-o", out, "--to", "megatron-bridge", "-q")
    assert code == 0, err
    it = os.path.join(out, "iter_0000000")
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "rb") as f:
        assert f.read() == b"0"
    assert sorted(os.listdir(out)) == ["iter_0000000", "latest_checkpointed_iteration.txt", "latest_train_state.pt"]
    assert {".metadata", "common.pt", "metadata.json", "run_config.yaml", "train_state.pt", "tokenizer"} <= set(
        os.listdir(it))
    assert read_json(os.path.join(it, "metadata.json")) == {
        "sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
        "common_backend_version": 1}
    common = torch.load(os.path.join(it, "common.pt"), weights_only=True)
    assert common["checkpoint_version"] == 3.0 and common["iteration"] == 0
    state = torch.load(os.path.join(it, "train_state.pt"), weights_only=True)
    assert set(state) == {"step", "consumed_train_samples", "skipped_train_samples", "consumed_valid_samples",
                          "floating_point_operations_so_far", "do_train", "do_valid", "do_test"}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in state.values())
    with open(os.path.join(out, "latest_train_state.pt"), "rb") as a, open(os.path.join(it, "train_state.pt"), "rb") as b:
        assert a.read() == b.read()
    model = yaml.safe_load(open(os.path.join(it, "run_config.yaml")))["model"]
    assert model["_target_"] == "megatron.bridge.models.gpt_provider.GPTModelProvider"
    assert {k: model[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                  "num_query_groups", "kv_channels", "vocab_size", "seq_length",
                                  "make_vocab_size_divisible_by", "should_pad_vocab", "normalization",
                                  "gated_linear_unit", "bf16", "fp16")} == {
        "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4,
        "num_query_groups": 2, "kv_channels": 16, "vocab_size": 320, "seq_length": 256,
        "make_vocab_size_divisible_by": 64, "should_pad_vocab": False, "normalization": "RMSNorm",
        "gated_linear_unit": True, "bf16": False, "fp16": False}
    assert model["activation_func"] == {"_target_": "torch.nn.functional.silu", "_call_": False}
    assert model["params_dtype"] == {"_target_": "torch.float32", "_call_": False}
    assert model["share_embeddings_and_output_weights"] is False and "rope_scaling" not in model
    # keys without a model. prefix, layers stacked, extra states present
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    dist = DistCheckpointSource.from_dir(it, unstack=False)
    assert "decoder.layers.self_attention.linear_qkv.weight" in dist.raw_keys()
    assert dist.info("decoder.layers.mlp.linear_fc1.weight").shape == (2, 192, 64)
    assert not any(k.startswith("model.") for k in dist.raw_keys())
    assert "decoder.layers.mlp.linear_fc1._extra_state/shard_0_2" in dist.object_keys
    dist.close()
    # read back: the logical tensors of a .nemo import, bit for bit; export gives the source back
    ref = str(tmp_path / "ref.nemo")
    api.import_hf(src, ref)
    want, got = logical(ref), logical(out)
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert read_json(os.path.join(back, "config.json")) == read_json(os.path.join(src, "config.json"))
    code, stdout, _ = cli("inspect", out, "--json")
    info = json.loads(stdout)
    assert code == 0 and info["format"] == "megatron-bridge" and info["family"] == "llama"


def test_bf16_tied_llama3_fields(tiny_llama, tmp_path) -> None:
    src = tiny_llama(tie_word_embeddings=True, dtype=torch.bfloat16,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 128})
    edit_config(src, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    assert model["bf16"] is True and model["fp16"] is False
    assert model["params_dtype"] == {"_target_": "torch.bfloat16", "_call_": False}
    assert model["rope_scaling"] is True and model["rope_scaling_factor"] == 8.0
    assert model["share_embeddings_and_output_weights"] is True
    got = logical(out)
    assert "output_layer.weight" not in got and got["embedding.word_embeddings.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_nemo_tp2_pp2_to_megatron_bridge_one_command(tiny_llama, tmp_path, cli, layout) -> None:
    src = tiny_llama()
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, layout=layout, parallel=api.Parallelism(2, 2))
    out = str(tmp_path / "mb")
    code, _, err = cli("reshard", nemo, "-o", out, "--to", "megatron-bridge", "--tp", "2", "--pp", "2", "-q")
    assert code == 0, err
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"]) == (2, 2)
    want, got = logical(nemo), logical(out)
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)
    # and back to a .nemo from the directory
    again = str(tmp_path / "again.nemo")
    api.reshard(out, again, tp=2, pp=2, layout=layout)
    back = logical(again)
    assert all(torch.equal(want[k], back[k]) for k in want)


def test_refusals_are_by_name(tiny_llama, tmp_path) -> None:
    with pytest.raises(UnsupportedError, match="'phi3' cannot be written .* no Phi-3 bridge"):
        PROVIDERS.of("phi3")
    with pytest.raises(UnsupportedError, match="'clip' has no confirmed Megatron-Bridge model provider"):
        PROVIDERS.of("clip")
    with pytest.raises(UnsupportedError, match="multi_latent_attention"):
        nemo_to_provider({"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
                          "multi_latent_attention": True}, "llama", providers=PROVIDERS, vocab_size=8,
                         params_dtype=torch.float32)
    src = tiny_llama()
    with pytest.raises(UnsupportedError, match="does not divide the vocabulary"):
        api.import_hf(src, str(tmp_path / "mb"), to="megatron-bridge", parallel=api.Parallelism(3, 1))
    assert not os.path.exists(tmp_path / "mb")
    with pytest.raises(UnsupportedError, match="--layout legacy is a .nemo layout"):
        api.import_hf(src, str(tmp_path / "mb"), to="megatron-bridge", layout="legacy")
    with pytest.raises(UnsupportedError, match="unknown target 'nemo3'"):
        api.reshard(src, str(tmp_path / "mb"), to="nemo3")


# ---------------------------------------------------------------------------- Megatron-LM
def test_args_table() -> None:
    cfg = args_to_nemo(vars(megatron_lm_args(use_rope_scaling=True, rope_scaling_factor=32.0)), "x")
    assert cfg["num_query_groups"] == 2 and cfg["activation"] == "fast-swiglu"
    assert cfg["normalization"] == "rmsnorm" and cfg["share_embeddings_and_output_weights"] is False
    assert cfg["scale_positional_embedding"] is True and cfg["scale_factor"] == 32.0
    assert args_to_nemo(vars(megatron_lm_args(group_query_attention=False)), "x")["num_query_groups"] == 4
    assert args_to_nemo(vars(megatron_lm_args(bf16=True, params_dtype=torch.bfloat16)), "x")["precision"] == "bf16"
    # sigmoid routing without MLA (GLM-4.5's) is read; which family runs it is the registry's choice
    routed = args_to_nemo(vars(megatron_lm_args(num_experts=8, moe_router_score_function="sigmoid",
                                                moe_router_enable_expert_bias=True, moe_router_num_groups=2,
                                                moe_router_group_topk=1)), "x")
    assert (routed["moe_router_score_function"], routed["moe_router_enable_expert_bias"],
            routed["moe_router_num_groups"], routed["moe_router_group_topk"]) == ("sigmoid", True, 2, 1)
    with pytest.raises(UnsupportedError, match="moe_router_enable_expert_bias=True"):  # with softmax scores
        args_to_nemo(vars(megatron_lm_args(num_experts=8, moe_router_enable_expert_bias=True)), "x")
    with pytest.raises(UnsupportedError, match="position_embedding_type='learned_absolute'"):
        args_to_nemo(vars(megatron_lm_args(position_embedding_type="learned_absolute")), "x")


def test_megatron_lm_torch_dist_directory(tiny_llama, tmp_path, cli) -> None:
    src = tiny_llama()
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    mlm = as_megatron_lm(mb, str(tmp_path / "mlm"), megatron_lm_args(padded_vocab_size=320))
    code, stdout, _ = cli("inspect", mlm, "--json")
    info = json.loads(stdout)
    assert code == 0 and info["format"] == "megatron-lm" and info["iteration_dir"].endswith("iter_0000100")
    assert any("optimizer, opt_param_scheduler" in n for n in info["notes"])
    back = str(tmp_path / "back")
    rep = api.export_hf(mlm, back)
    assert any("padded_vocab_size=320" in w for w in rep.warnings)
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    cfg = read_json(os.path.join(back, "config.json"))
    assert (cfg["num_key_value_heads"], cfg["vocab_size"], cfg["intermediate_size"]) == (2, 320, 96)
    # --iteration picks another folder; the tracker's folder missing is one line, nothing written
    shutil.copytree(os.path.join(mlm, "iter_0000100"), os.path.join(mlm, "iter_0000050"))
    assert logical(mlm, iteration=50).keys() == logical(mlm).keys()
    shutil.rmtree(os.path.join(mlm, "iter_0000100"))
    code, _, err = cli("export", mlm, "-o", str(tmp_path / "bad"))
    assert code == 2 and "names iteration 100, but iter_0000100/ is missing" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "bad")
    code, _, err = cli("reshard", mlm, "-o", str(tmp_path / "ok.nemo"), "--iteration", "50", "-q")
    assert code == 0, err


def test_megatron_lm_padded_vocab_trimmed_from_tokenizer(tiny_llama, tmp_path) -> None:
    """The true vocabulary comes from the tokenizer (tokenizer.json at tokenizer_model)."""
    src = tiny_llama()
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(300)}},
                                                    "added_tokens": [{"id": 319, "content": "<x>"}]}))
    mlm = as_megatron_lm(mb, str(tmp_path / "mlm"), megatron_lm_args(tokenizer_model=str(tok)))
    with api.open_checkpoint(mlm) as ck:
        assert ck.config["nemo_convert"]["vocab_size"] == 320
        assert ck.source.info("embedding.word_embeddings.weight").shape == (320, 64)
    # a SentencePiece model file as tokenizer_model (the tiny one has 300 pieces)
    mlm2 = as_megatron_lm(mb, str(tmp_path / "mlm2"), megatron_lm_args(tokenizer_model=os.path.join(src, "tokenizer.model")))
    with api.open_checkpoint(mlm2) as ck:
        assert ck.config["nemo_convert"]["vocab_size"] == 300
        assert ck.source.info("output_layer.weight").shape == (300, 64)


def _refused(cli, tmp_path, mlm: str, match: str) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli("export", mlm, "-o", str(tmp_path / "never"))
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "never")


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.getcwd, ())


def test_megatron_lm_bad_inputs(tiny_llama, tmp_path, cli) -> None:
    src = tiny_llama()
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    mlm = as_megatron_lm(mb, str(tmp_path / "a"), megatron_lm_args(multi_latent_attention=True))
    _refused(cli, tmp_path, mlm, "multi_latent_attention=True changes the model's math")
    mlm = as_megatron_lm(mb, str(tmp_path / "b"), megatron_lm_args())
    torch.save({"args": _Evil(), "iteration": 100}, os.path.join(mlm, "iter_0000100", "common.pt"))
    _refused(cli, tmp_path, mlm, "refuses to load global 'posix.getcwd'")
    with pytest.raises(UnsafePickleError):
        api.open_checkpoint(mlm).close()
    mlm = as_megatron_lm(mb, str(tmp_path / "c"), megatron_lm_args())
    torch.save({"iteration": 100}, os.path.join(mlm, "iter_0000100", "common.pt"))
    _refused(cli, tmp_path, mlm, "no Megatron-LM args")
    with open(os.path.join(mlm, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("soon")
    with pytest.raises(InputError, match="expected an iteration number"):
        api.open_checkpoint(mlm)


@pytest.mark.parametrize("pp,local_spec", [(1, False), (2, True)])
def test_megatron_lm_legacy_per_rank_files(tiny_llama, tmp_path, pp, local_spec) -> None:
    """mp_rank_XX[_YYY]/model_optim_rng.pt (TP=2, PP=1 or an uneven PP=2): the per-rank
    slices of a legacy .nemo, optionally under Megatron-Core's local-spec norm names."""
    src = tiny_llama(num_hidden_layers=3)
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, layout="legacy", parallel=api.Parallelism(2, pp, (2, 1) if pp == 2 else None),
                  packed=False)
    it = tmp_path / "mlm" / "iter_0000007"
    local = {".self_attention.linear_qkv.layer_norm_weight": ".input_layernorm.weight",
             ".mlp.linear_fc1.layer_norm_weight": ".pre_mlp_layernorm.weight"}
    for rank in range(2):
        for stage in range(pp):
            nemo_dir = f"mp_rank_{rank:02d}" if pp == 1 else f"tp_rank_{rank:02d}_pp_rank_{stage:03d}"
            mlm_dir = f"mp_rank_{rank:02d}" if pp == 1 else f"mp_rank_{rank:02d}_{stage:03d}"
            sd = torch.load(os.path.join(nemo, nemo_dir, "model_weights.ckpt"), weights_only=True)
            model = {}
            for k, v in sd.items():
                k = k[len("model."):]
                for te, name in local.items():
                    if local_spec and k.endswith(te):
                        k = k[: -len(te)] + name
                model[k] = v
            os.makedirs(it / mlm_dir)
            torch.save({"model": model,
                        **common_pt(megatron_lm_args(num_layers=3, tensor_model_parallel_size=2,
                                                     pipeline_model_parallel_size=pp, vocab_size=320)),
                        "rng_state": [{"random_rng_state": (3, (1, 2), None)}]},
                       str(it / mlm_dir / "model_optim_rng.pt"))
    (tmp_path / "mlm" / "latest_checkpointed_iteration.txt").write_text("7")
    with api.open_checkpoint(str(tmp_path / "mlm")) as ck:
        assert ck.format == "megatron-lm" and ck.layout == "legacy"
    want, got = logical(nemo), logical(str(tmp_path / "mlm"))
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)
    back = str(tmp_path / "back")
    api.export_hf(str(tmp_path / "mlm"), back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_common_state_entry_without_common_pt(tiny_llama, tmp_path) -> None:
    """megatron-core ≥ 0.17 keeps the common state as the byte entry common_state/shard_0_1."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
    from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter
    from nemo_convert.formats.io.sink import DirectorySink

    src = tiny_llama()
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    it = os.path.join(mb, "iter_0000000")
    dist = DistCheckpointSource.from_dir(it, unstack=False)
    out = tmp_path / "mlm"
    w = DistCheckpointWriter(DirectorySink(str(out)), "iter_0000003")
    for k in dist.raw_keys():
        t = dist.load(k)
        w.declare(k, t.shape, t.dtype)
        w.write_chunk(k, (0,) * t.dim(), t.contiguous())
    for k in dist.object_keys:
        w.add_object_bytes(k, dist.load_object_bytes(k))
    buf = io.BytesIO()
    torch.save([common_pt(megatron_lm_args(vocab_size=320))], buf)
    w.add_object_bytes("common_state/shard_0_1", buf.getvalue())
    w.close()
    dist.close()
    os.remove(out / "iter_0000003" / "common.pt")
    want, got = logical(mb), logical(str(out))
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)


def test_nemo2_folder_to_megatron_bridge(tiny_llama, tmp_path) -> None:
    from test_parallelism import _write_nemo2

    src = tiny_llama()
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    folder = str(tmp_path / "nemo2")
    _write_nemo2(folder, nemo)
    out = str(tmp_path / "mb")
    api.reshard(folder, out, to="megatron-bridge")
    want, got = logical(folder), logical(out)
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)
    assert os.listdir(os.path.join(out, "iter_0000000", "tokenizer")) == ["tokenizer.model"]
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_run_config_is_read_inertly(tiny_llama, tmp_path, cli) -> None:
    src = tiny_llama()
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    path = os.path.join(mb, "iter_0000000", "run_config.yaml")
    text = open(path).read().replace("num_layers: 2", "num_layers: !!python/object/apply:os.system ['touch pwned']")
    open(path, "w").write(text)
    _refused(cli, tmp_path, mb, "a model field is not understood")
    assert not os.path.exists("pwned")
    open(path, "w").write("tokenizer: {}\n")
    _refused(cli, tmp_path, mb, "no model: section")


def test_minimal_run_config_is_read_with_provider_defaults(tiny_llama, tmp_path) -> None:
    """The 18-key model section megatron-dirs.md shows Megatron-Bridge accepting; absent
    fields mean GPTModelProvider's defaults (tied embeddings, learned positions, biases)."""
    src = tiny_llama()
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    path = os.path.join(mb, "iter_0000000", "run_config.yaml")
    model = yaml.safe_load(open(path))["model"]
    keep = ("_target_", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
            "kv_channels", "vocab_size", "seq_length", "normalization", "gated_linear_unit", "activation_func",
            "add_bias_linear", "add_qkv_bias", "layernorm_epsilon", "position_embedding_type", "rotary_base",
            "share_embeddings_and_output_weights")
    with open(path, "w") as f:
        yaml.safe_dump({"model": {k: model[k] for k in keep}}, f)
    os.remove(os.path.join(mb, "iter_0000000", "nemo_convert.json"))
    back = str(tmp_path / "back")
    api.export_hf(mb, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    cfg = read_json(os.path.join(back, "config.json"))
    assert (cfg["num_key_value_heads"], cfg["vocab_size"], cfg["max_position_embeddings"]) == (2, 320, 256)
    del model["position_embedding_type"]
    with open(path, "w") as f:
        yaml.safe_dump({"model": model}, f)
    with pytest.raises(UnsupportedError, match="position_embedding_type='learned_absolute'"):
        api.open_checkpoint(mb)


# ------------------------------------------------------------------ every dense family
#: family → the run_config.yaml model fields Megatron-Bridge's bridge for it derives from
#: test_family_matrix's tiny model (Megatron-Bridge v0.6.0 src/megatron/bridge/models/:
#: mistral/mistral_bridge.py 56-81, qwen/qwen2_bridge.py 46-57, qwen/qwen3_bridge.py 43-55,
#: gemma/gemma_bridge.py 62-76; see nemo_convert/formats/megatron/megatron_config.py).
SILU = {"_target_": "torch.nn.functional.silu", "_call_": False}
FAMILY_PROVIDERS: dict[str, dict] = {
    "llama": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "add_bias_linear": True,
              "add_qkv_bias": True, "activation_func": SILU},
    "mistral": {"_target_": "megatron.bridge.models.mistral.mistral_provider.MistralModelProvider",
                "window_size": [3, 0], "cp_comm_type": "a2a", "activation_func": SILU, "add_bias_linear": False},
    "qwen2": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "add_qkv_bias": True,
              "add_bias_linear": False, "qk_layernorm": False, "activation_func": SILU,
              "autocast_dtype": {"_target_": "torch.bfloat16", "_call_": False}},
    "qwen3": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "qk_layernorm": True,
              "add_qkv_bias": False, "kv_channels": 32, "activation_func": SILU},
    "gemma": {"_target_": "megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider",
              "activation_func": {"_target_": "megatron.core.activations.fast_gelu", "_call_": False},
              "layernorm_zero_centered_gamma": True, "share_embeddings_and_output_weights": True,
              "kv_channels": 32, "gated_linear_unit": True, "normalization": "RMSNorm"},
    # Megatron-Bridge v0.6.0 qwen/qwen3_moe_bridge.py 51-70 and conversion/model_bridge.py 461-464
    "qwen3_moe": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "qk_layernorm": True,
                  "add_qkv_bias": False, "add_bias_linear": False, "kv_channels": 32, "activation_func": SILU,
                  "ffn_hidden_size": 96, "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 48,
                  "moe_router_pre_softmax": False, "moe_layer_freq": 1, "moe_grouped_gemm": True,
                  "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 1e-3,
                  "moe_token_dispatcher_type": "alltoall", "moe_permute_fusion": True,
                  "expert_model_parallel_size": 1, "moe_shared_expert_intermediate_size": None,
                  "autocast_dtype": {"_target_": "torch.bfloat16", "_call_": False}},
    # deepseek/deepseek_v3_bridge.py 53-99 and conversion/model_bridge.py 461-478, 604-614
    "deepseek_v3": {"_target_": "megatron.bridge.models.mla_provider.MLAModelProvider",
                    "multi_latent_attention": True, "qk_layernorm": True, "q_lora_rank": 32, "kv_lora_rank": 16,
                    "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16, "kv_channels": 8,
                    "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 48,
                    "moe_layer_freq": [0, 1, 1, 1], "moe_shared_expert_intermediate_size": 48,
                    "moe_shared_expert_gate": False, "moe_router_score_function": "sigmoid",
                    "moe_router_enable_expert_bias": True, "moe_router_topk_scaling_factor": 2.5,
                    "moe_router_num_groups": 1, "moe_router_group_topk": 1, "moe_router_pre_softmax": True,
                    "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-4,
                    "moe_router_dtype": "fp32", "make_vocab_size_divisible_by": 1280, "rope_type": "yarn",
                    "rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                    "share_embeddings_and_output_weights": False, "add_bias_linear": False,
                    "mtp_num_layers": 1},  # deepseek_v3_bridge.py 97: num_nextn_predict_layers (the row's MTP layer)
    # nemotron/nemotron_bridge.py (v0.6.0) lines 56-72 over the base bridge's GPTModelProvider
    "nemotron": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "normalization": "LayerNorm",
                 "gated_linear_unit": False, "layernorm_zero_centered_gamma": True, "add_bias_linear": False,
                 "activation_func": {"_target_": "megatron.core.activations.squared_relu", "_call_": False},
                 "rotary_percent": 0.5, "kv_channels": 32, "num_query_groups": 2},
    # gpt_oss/gpt_oss_bridge.py 57-101 (nemo_convert/formats/megatron/provider_gpt_oss.py): the tiny
    # model's clamp 0.5, window 8 on layer 0 and plain RoPE where the bridge has the hub's constants
    "gpt_oss": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "softmax_type": "learnable",
                "activation_func": {"_target_": "megatron.core.fusions.fused_bias_geglu.quick_gelu", "_call_": False},
                "gated_linear_unit": True, "add_bias_linear": True, "glu_linear_offset": 1.0,
                "activation_func_clamp_value": 0.5, "window_size": [7, 0], "window_attn_skip_freq": [1, 0],
                "kv_channels": 16, "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 48,
                "moe_router_pre_softmax": False, "moe_layer_freq": 1, "expert_tensor_parallel_size": 1,
                "moe_router_load_balancing_type": "none", "share_embeddings_and_output_weights": False,
                "normalization": "RMSNorm"},
    # deepseek/deepseek_v2_bridge.py (067f987) lines 35-84 and conversion/model_bridge.py 461-489: the MLA
    # provider with softmax routing before top-k, group-limited, scaled, no expert bias; YaRN as the model has it
    "deepseek_v2": {"_target_": "megatron.bridge.models.mla_provider.MLAModelProvider",
                    "multi_latent_attention": True, "qk_layernorm": True, "q_lora_rank": None, "kv_lora_rank": 16,
                    "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16, "num_moe_experts": 8,
                    "moe_router_topk": 3, "moe_ffn_hidden_size": 48, "moe_layer_freq": [0, 1, 1, 1],
                    "moe_shared_expert_intermediate_size": 96, "moe_router_score_function": "softmax",
                    "moe_router_enable_expert_bias": False, "moe_router_pre_softmax": True,
                    "moe_router_topk_scaling_factor": 1.5, "moe_router_num_groups": 4, "moe_router_group_topk": 2,
                    "moe_router_load_balancing_type": "seq_aux_loss", "moe_router_dtype": "fp32",
                    "make_vocab_size_divisible_by": 3200, "rope_type": "yarn", "rotary_scaling_factor": 4.0,
                    "original_max_position_embeddings": 8, "mscale": 0.707, "mscale_all_dim": 0.707,
                    "share_embeddings_and_output_weights": False, "add_bias_linear": False},
    # gemma/gemma2_bridge.py (067f987d) lines 47-66 and gemma2_provider.py 466-499: the tiny model's scalar,
    # soft-caps and window 4 (W - 1 = 3 keys before the query); the class windows the odd 1-based layers itself
    "gemma2": {"_target_": "megatron.bridge.models.gemma.gemma2_provider.Gemma2ModelProvider",
               "activation_func": {"_target_": "megatron.core.activations.fast_gelu", "_call_": False},
               "layernorm_zero_centered_gamma": True, "share_embeddings_and_output_weights": True,
               "kv_channels": 32, "gated_linear_unit": True, "normalization": "RMSNorm", "add_bias_linear": False,
               "query_pre_attn_scalar": 24, "attn_logit_softcapping": 1.5, "final_logit_softcapping": 3.0,
               "window_size": [3, 0], "window_attn_skip_freq": None},
    # gemma/gemma3_bridge.py (067f987d) lines 53-74 and gemma3_provider.py 58-98: the tiny model's RoPE bases as
    # (local, global), its linear factor 4 on the global layers, 1/sqrt(24), window 4 as an int, layer 0 local
    "gemma3": {"_target_": "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider",
               "activation_func": {"_target_": "megatron.core.activations.fast_gelu", "_call_": False},
               "layernorm_zero_centered_gamma": True, "share_embeddings_and_output_weights": True,
               "qk_layernorm": True, "kv_channels": 32, "gated_linear_unit": True, "normalization": "RMSNorm",
               "add_bias_linear": False, "rotary_base": [10.0, 1000.0], "rope_scaling_factor": 4.0,
               "softmax_scale": 1 / math.sqrt(24), "window_size": 4, "interleaved_attn_pattern": [1, 1],
               "seq_len_interpolation_factor": None, "window_attn_skip_freq": None},
    # glm/glm45_bridge.py (067f987d) lines 57-94 over conversion/model_bridge.py 456-498: the GPT provider
    # with sigmoid routing, expert bias, routed scaling, the MTP layer count and half-rotary RoPE
    "glm4_moe": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider", "add_qkv_bias": True,
                 "add_bias_linear": False, "qk_layernorm": True, "rotary_percent": 0.5, "kv_channels": 32,
                 "activation_func": SILU, "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 48,
                 "moe_layer_freq": [0, 1, 1, 1], "moe_shared_expert_intermediate_size": 48,
                 "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                 "moe_router_topk_scaling_factor": 2.5, "moe_router_num_groups": 1, "moe_router_group_topk": 1,
                 "moe_router_pre_softmax": False, "moe_router_dtype": "fp32", "moe_aux_loss_coeff": 0.001,
                 "moe_router_load_balancing_type": "seq_aux_loss", "mtp_num_layers": 1,
                 "share_embeddings_and_output_weights": False},
}
#: The tiny models as each provider's bridge takes them (Megatron-Bridge's Nemotron has no biases).
PROVIDER_MODEL_OVERRIDES: dict = {"nemotron": dict(attention_bias=False, mlp_bias=False)}


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):  # type: ignore[no-untyped-def]
    from test_family_matrix import make_model

    root = tmp_path_factory.mktemp("mb-families")
    return {f: make_model(str(root / f), f, **PROVIDER_MODEL_OVERRIDES.get(f, {})) for f in FAMILY_PROVIDERS}


@pytest.mark.parametrize("family", sorted(FAMILY_PROVIDERS))
def test_family_to_megatron_bridge_and_back(family_models, tmp_path, family) -> None:
    """HF → Megatron-Bridge directory (the family's provider) → export: the source's tensors
    bit for bit, its config.json and transformers' logits; then the same directory without
    our record (as Megatron-Bridge writes it): the family from the provider alone, the same
    tensors and logits."""
    from test_family_matrix import logits

    model, bare, ref = bridge_round_trip(family_models[family], tmp_path, family)
    want = FAMILY_PROVIDERS[family]
    assert {k: model.get(k) for k in want} == want
    assert model["position_embedding_type"] == "rope" and model["vocab_size"] == 128
    cfg = read_json(os.path.join(bare, "config.json"))
    if family == "mistral":
        assert cfg["sliding_window"] == 4  # window_size [3, 0] is W - 1 keys before the query
    assert torch.equal(logits(bare), ref)


@pytest.mark.parametrize("family, target", [
    ("mistral", None), ("gemma", None),
    ("qwen2", "megatron.bridge.models.qwen.qwen_provider.Qwen2ModelProvider"),  # Megatron-Bridge <= 0.3
    ("qwen3", "megatron.bridge.models.qwen.qwen_provider.Qwen3ModelProvider"),
])
def test_family_minimal_run_config_means_the_provider_defaults(family_models, tmp_path, family, target) -> None:
    """A hand-written model section with only the geometry and what differs from the
    provider class's own defaults (MistralModelProvider, GemmaModelProvider, the older
    Qwen2/Qwen3ModelProvider) reads as the same model."""
    from test_family_matrix import logits

    src = family_models[family]
    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    model = yaml.safe_load(open(path))["model"]
    keep = ["_target_", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
            "kv_channels", "vocab_size", "seq_length", "rotary_base", "layernorm_epsilon", "bf16", "params_dtype"]
    keep += ["window_size"] if family == "mistral" else []
    with open(path, "w") as f:
        yaml.safe_dump({"model": {**{k: model[k] for k in keep}, **({"_target_": target} if target else {})}}, f)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    assert api.inspect_checkpoint(out)["family"] == family
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert torch.equal(logits(back), logits(src))


#: Megatron-Bridge's per-model Llama classes (releases up to v0.3.1; ``llama/llama_provider.py`` at
#: 217de1a2e~1), read through the llama plugin's declaration (``plugins/nemo_convert_llama/providers.py``).
LLAMA_CLASSES = "megatron.bridge.models.llama.llama_provider."
#: The geometry a minimal section keeps (and the dtype, which export must not change).
GEOMETRY = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
            "vocab_size", "seq_length", "rotary_base", "layernorm_epsilon", "bf16", "params_dtype")


def _llama3_model(folder: str, factor: float, tied: bool) -> str:
    from test_family_matrix import make_model

    return make_model(folder, "llama", attention_bias=False, mlp_bias=False, tie_word_embeddings=tied,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": factor,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})


def _minimal_llama_dir(src: str, out: str, section: dict) -> dict:
    """``src`` → a Megatron-Bridge directory whose ``model:`` is ``section`` over the geometry
    written (no record of ours); returns the section as written first."""
    api.import_hf(src, out, to="megatron-bridge")
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    model = yaml.safe_load(open(path))["model"]
    with open(path, "w") as f:
        yaml.safe_dump({"model": {**{k: model[k] for k in GEOMETRY}, **section}}, f)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    return model


def _rope_of(folder: str) -> dict:
    cfg = read_json(os.path.join(folder, "config.json"))
    return cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}


@pytest.mark.slow
@pytest.mark.parametrize("cls, factor, tied", [("Llama31ModelProvider8B", 8.0, False),
                                               ("Llama32ModelProvider1B", 32.0, True)])
def test_llama_provider_class_minimal_run_config(tmp_path, cls, factor, tied) -> None:
    """A section of one of Megatron-Bridge's own Llama classes with only the geometry (no RoPE
    fields: the class's ``rope_scaling`` / ``rope_scaling_factor``, 8 for 3.1 and 32 for 3.2, and
    3.2's tied embeddings) reads as the model: tensors bit for bit, config.json's llama3 factor,
    transformers' logits."""
    from test_family_matrix import logits

    src = _llama3_model(str(tmp_path / "src"), factor, tied)
    out = str(tmp_path / "mb")
    written = _minimal_llama_dir(src, out, {"_target_": LLAMA_CLASSES + cls})
    assert (written["rope_scaling"], written["rope_scaling_factor"]) == (True, factor)  # dropped from the section
    assert api.inspect_checkpoint(out)["family"] == "llama"
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(b) <= set(a) and set(a) - set(b) <= {"lm_head.weight"} and all(torch.equal(a[k], b[k]) for k in b)
    assert ("lm_head.weight" in b) != tied
    rope = _rope_of(back)
    assert (rope.get("rope_type"), rope.get("factor")) == ("llama3", factor)
    ref = logits(src)
    assert torch.equal(logits(back), ref)
    if factor == 32.0:
        # negative control: the same 3.2 section read with 3.1's factor 8 is another model
        wrong = str(tmp_path / "wrong")
        _minimal_llama_dir(src, wrong, {"_target_": LLAMA_CLASSES + "Llama31ModelProvider8B",
                                        "share_embeddings_and_output_weights": True})
        api.export_hf(wrong, str(tmp_path / "wrong_hf"))
        assert _rope_of(str(tmp_path / "wrong_hf")).get("factor") == 8.0
        assert not torch.allclose(logits(str(tmp_path / "wrong_hf")), ref)


def test_llama_provider_classes_read_their_defaults() -> None:
    """The llama plugin's declared classes: llama3 scaling from the class (3.1: 8, 3.2: 32, Llama 3
    and CodeLlama: none), from the older releases' NeMo 2 spelling where the section writes it
    (Megatron-Bridge v0.1.0a0-v0.3.0: ``scale_factor`` & co., no ``rope_scaling`` field), refused
    when the two spellings disagree; Llama 4 refused by name, not read as a plain GPT."""
    from nemo_convert.formats.megatron.provider_read import provider_to_nemo

    geometry = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 96}

    def read(cls: str, **more) -> dict:  # type: ignore[no-untyped-def]
        return provider_to_nemo({"_target_": LLAMA_CLASSES + cls, **geometry, **more}, "run_config.yaml", PROVIDERS)

    def scaling(cfg: dict) -> tuple:
        return cfg["scale_positional_embedding"], cfg.get("scale_factor")

    assert scaling(read("Llama31ModelProvider8B")) == (True, 8.0)
    assert scaling(read("Llama32ModelProvider1B")) == (True, 32.0)
    assert scaling(read("Llama32ModelProvider3B")) == (True, 32.0)
    assert read("Llama32ModelProvider1B")["share_embeddings_and_output_weights"] is True
    assert scaling(read("Llama32ModelProvider1B", rope_scaling_factor=16.0)) == (True, 16.0)
    assert scaling(read("Llama3ModelProvider8B")) == (False, None)
    assert scaling(read("CodeLlamaModelProvider34B")) == (False, None)
    assert read("CodeLlamaModelProvider34B")["rotary_base"] == 1_000_000
    assert read("Llama3ModelProvider70B")["num_query_groups"] == 8
    old = read("Llama32ModelProvider1B", scale_factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
               old_context_len=8192)
    assert scaling(old) == (True, 32.0) and old["old_context_len"] == 8192
    assert scaling(read("Llama32ModelProvider1B", scale_factor=16)) == (True, 16.0)  # written over the class's 32
    with pytest.raises(UnsupportedError, match="the two spellings of llama3 RoPE scaling disagree"):
        read("Llama31ModelProvider", scale_factor=16.0, rope_scaling_factor=8.0)
    with pytest.raises(UnsupportedError, match="the two spellings of llama3 RoPE scaling disagree"):
        read("Llama31ModelProvider", scale_factor=8.0, rope_scaling=False)
    for cls in ("Llama4ModelProvider", "Llama4Experts16ModelProvider", "Llama4Experts128ModelProvider"):
        with pytest.raises(UnsupportedError, match=f"model provider {LLAMA_CLASSES}{cls} is not supported"):
            read(cls)


@pytest.mark.slow
def test_llama4_provider_directory_refused(tiny_llama, tmp_path) -> None:
    out = str(tmp_path / "mb")
    _minimal_llama_dir(tiny_llama(), out, {"_target_": LLAMA_CLASSES + "Llama4ModelProvider"})
    with pytest.raises(UnsupportedError, match="Llama4ModelProvider is not supported"):
        api.inspect_checkpoint(out)


def test_family_refusals_by_name(family_models, tmp_path) -> None:
    from test_family_matrix import make_model

    phi3 = make_model(str(tmp_path / "phi3"), "phi3")
    with pytest.raises(UnsupportedError, match="'phi3' cannot be written with --to megatron-bridge: "
                                               "Megatron-Bridge has no Phi-3 bridge"):
        api.import_hf(phi3, str(tmp_path / "mb"), to="megatron-bridge")
    assert not os.path.exists(tmp_path / "mb")
    out = str(tmp_path / "g")
    api.import_hf(family_models["gemma"], out, to="megatron-bridge")
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    doc = yaml.safe_load(open(path))
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    for target, words in (("megatron.bridge.models.gpt_provider.GPTModelProvider", "layernorm_zero_centered_gamma "
                           "without GemmaModelProvider"),
                          ("megatron.bridge.models.gemma.gemma4_provider.Gemma4ModelProvider",
                           "Gemma4ModelProvider is not supported")):
        with open(path, "w") as f:
            yaml.safe_dump({"model": {**doc["model"], "_target_": target}}, f)
        with pytest.raises(UnsupportedError, match=words):
            api.inspect_checkpoint(out)
    with pytest.raises(UnsupportedError, match="apply_embedding_scaling=True does not match"):
        nemo_to_provider({"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "apply_embedding_scaling": True},
                         "llama", providers=PROVIDERS, vocab_size=8, params_dtype=torch.float32)


def test_args_table_dense_families() -> None:
    """Megatron-LM arguments of the dense families (core_v0.16.1 arguments.py: --add-qkv-bias,
    --qk-layernorm, --window-size, --kv-channels) read into the NeMo fields their families
    claim; zero-centred RMSNorm (--apply-layernorm-1p up to core_v0.15.3) is Gemma's, whose embedding
    scaling Megatron-LM's GPT model does not have."""
    qwen2 = args_to_nemo(vars(megatron_lm_args(add_qkv_bias=True)), "x")
    assert qwen2["qkv_bias"] is True and qwen2["bias"] is False
    qwen3 = args_to_nemo(vars(megatron_lm_args(qk_layernorm=True, kv_channels=32)), "x")
    assert qwen3["qk_layernorm"] is True and qwen3["kv_channels"] == 32
    mistral = args_to_nemo(vars(megatron_lm_args(window_size=(3, 0))), "x")
    assert mistral["window_size"] == [3, 0] and mistral["nemo_convert"]["sliding_window"] == 4
    # --openai-gelu is read by the legacy models only: a Megatron-Core run's MLP is as without it
    assert args_to_nemo(vars(megatron_lm_args(openai_gelu=True)), "x") == args_to_nemo(vars(megatron_lm_args()), "x")
    for over, words in ((dict(layernorm_zero_centered_gamma=True), "layernorm_zero_centered_gamma without"),
                        (dict(apply_layernorm_1p=True), "layernorm_zero_centered_gamma without"),
                        (dict(openai_gelu=True, use_legacy_models=True), "openai_gelu=True")):
        with pytest.raises(UnsupportedError, match=words):
            args_to_nemo(vars(megatron_lm_args(**over)), "x")


@pytest.mark.parametrize("family", ["mistral", "gemma", "gemma2", "gemma3"])
def test_family_nemo_to_megatron_bridge_one_command(family_models, tmp_path, cli, family) -> None:
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(family_models[family], nemo, parallel=api.Parallelism(2, 1))
    out = str(tmp_path / "mb")
    code, _, err = cli("reshard", nemo, "-o", out, "--to", "megatron-bridge", "-q")
    assert code == 0, err
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    assert {k: model.get(k) for k in FAMILY_PROVIDERS[family]} == FAMILY_PROVIDERS[family]
    want, got = logical(nemo), logical(out)
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)


def test_nemo_written_window_and_gemma_norms_to_megatron_bridge(family_models, tmp_path) -> None:
    """A Mistral ``.nemo`` in NeMo's window convention (``[W, 0]``, no record of ours) is
    written as Megatron-Bridge's ``[W-1, 0]`` — the window its export gives as HF's
    ``sliding_window: W``. A NeMo 1 Gemma (norms stored as 1 + w, no zero-centred flag) is
    refused: GemmaModelProvider's norms are zero-centred."""
    nemo = str(tmp_path / "m")
    api.import_hf(family_models["mistral"], nemo, packed=False)
    path = os.path.join(nemo, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    del cfg["nemo_convert"]["hf_config"], cfg["nemo_convert"]["sliding_window"]
    cfg["window_size"] = [4, 0]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    out = str(tmp_path / "mb")
    api.reshard(nemo, out, to="megatron-bridge")
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    assert model["window_size"] == [3, 0]
    gemma = str(tmp_path / "g")
    api.import_hf(family_models["gemma"], gemma, packed=False)
    path = os.path.join(gemma, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    del cfg["layernorm_zero_centered_gamma"]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    with pytest.raises(UnsupportedError, match="gemma: the config has layernorm_zero_centered_gamma=False; its "
                                               "provider needs True"):
        api.reshard(gemma, str(tmp_path / "gmb"), to="megatron-bridge")
    assert not os.path.exists(tmp_path / "gmb")


@pytest.mark.parametrize("family, over", [
    ("qwen2", dict(add_qkv_bias=True)),
    ("qwen3", dict(qk_layernorm=True, kv_channels=32)),
    ("mistral", dict(window_size=(3, 0))),
])
def test_megatron_lm_dense_family_directories(family_models, tmp_path, family, over) -> None:
    """A Megatron-LM torch_dist save of a Qwen2 / Qwen3 / Mistral (its args saying
    --add-qkv-bias, --qk-layernorm, --window-size) exports as that family: the source's
    tensors and transformers' logits."""
    from test_family_matrix import logits

    src = family_models[family]
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    args = megatron_lm_args(ffn_hidden_size=96, max_position_embeddings=64, layernorm_epsilon=1e-6, vocab_size=128,
                            padded_vocab_size=128, **over)
    mlm = as_megatron_lm(mb, str(tmp_path / "mlm"), args)
    info = api.inspect_checkpoint(mlm)
    assert info["format"] == "megatron-lm" and info["family"] == family
    back = str(tmp_path / "back")
    api.export_hf(mlm, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(logits(back), logits(src))


# ------------------------------------------------------------------ mixture of experts
@pytest.mark.parametrize("family, words", [
    ("mixtral", "Megatron-Bridge has no Mixtral bridge"),
    ("qwen2_moe", "Megatron-Bridge has no Qwen2-MoE bridge"),
])
def test_moe_families_without_a_confirmed_provider_are_refused_by_name(tmp_path, family, words) -> None:
    from test_family_matrix import make_model

    src = make_model(str(tmp_path / "hf"), family)
    with pytest.raises(UnsupportedError, match=f"'{family}' cannot be written with --to megatron-bridge: {words}"):
        api.import_hf(src, str(tmp_path / "mb"), to="megatron-bridge")
    assert not os.path.exists(tmp_path / "mb")


def test_qwen3_moe_mixed_stack_to_megatron_bridge(tmp_path) -> None:
    """``mlp_only_layers`` (a dense layer between MoE layers) is written as Megatron-Core's
    ``moe_layer_freq`` list and per-layer keys; without our record it reads back as the
    same Qwen3-MoE: the source's tensors and logits."""
    from test_family_matrix import assert_same, logits, make_model

    src = make_model(str(tmp_path / "hf"), "qwen3_moe", num_hidden_layers=3, mlp_only_layers=[1])
    out = str(tmp_path / "mb")
    api.import_hf(src, out, to="megatron-bridge")
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    assert model["moe_layer_freq"] == [1, 0, 1] and model["ffn_hidden_size"] == 96
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    assert_same(src, back)
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    bare = str(tmp_path / "bare")
    api.export_hf(out, bare)
    a, b = hf_tensors(src), hf_tensors(bare)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    cfg = read_json(os.path.join(bare, "config.json"))
    assert cfg["mlp_only_layers"] == [1] and cfg["norm_topk_prob"] is True
    assert torch.equal(logits(bare), logits(src))


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_moe_nemo_at_ep2_to_megatron_bridge_one_command(tmp_path, cli, family) -> None:
    """A MoE ``.nemo`` at TP2 × EP2 (per-rank experts) → a Megatron-Bridge directory:
    experts stacked ``[L, E, …]`` whole (DeepSeek-V3's mixed stack: per layer), EP
    recorded, the same logical tensors."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
    from test_family_matrix import make_model

    src = make_model(str(tmp_path / "hf"), family)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, parallel=api.Parallelism(2, 1, ep=2))
    out = str(tmp_path / "mb")
    code, _, err = cli("reshard", nemo, "-o", out, "--to", "megatron-bridge", "--tp", "2", "--ep", "2", "-q")
    assert code == 0, err
    model = yaml.safe_load(open(os.path.join(out, "iter_0000000", "run_config.yaml")))["model"]
    assert model["expert_model_parallel_size"] == 2 and model["tensor_model_parallel_size"] == 2
    assert model["num_moe_experts"] == 4
    want, got = logical(nemo), logical(out)
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)
    dist = DistCheckpointSource.from_dir(os.path.join(out, "iter_0000000"), unstack=False)
    fc1 = [k for k in dist.raw_keys() if ".experts." in k and k.endswith("linear_fc1.weight")]
    assert fc1 and all(not k.startswith("model.") for k in dist.raw_keys())
    if family == "qwen3_moe":
        assert fc1 == ["decoder.layers.mlp.experts.experts.linear_fc1.weight"]
        assert dist.info(fc1[0]).shape[:2] == (2, 4)  # [L, E, …]
    else:
        assert "decoder.layers.1.mlp.experts.experts.linear_fc1.weight" in fc1
        assert dist.info("decoder.layers.1.mlp.experts.experts.linear_fc1.weight").shape[0] == 4  # [E, …]
    dist.close()
    assert api.inspect_checkpoint(out)["family"] == family


def test_args_table_moe() -> None:
    """Megatron-LM's MoE arguments (core_v0.16.1 arguments.py: --num-experts line 2691,
    --moe-layer-freq 2693, the TransformerConfig-derived --moe-router-topk,
    --moe-ffn-hidden-size (defaulting to --ffn-hidden-size, lines 1016-1018),
    --moe-router-pre-softmax, --moe-shared-expert-*) read into the NeMo fields the MoE
    families claim; routing no family here expresses is refused by name."""
    from nemo_convert.plugins.manager import get_registry

    def family_for_config(cfg: dict) -> object:
        return get_registry().family_for_nemo_config({**cfg, "target": cfg["target"]})

    moe = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=48, moe_layer_freq=1,
               moe_router_pre_softmax=False, moe_aux_loss_coeff=[0.001], moe_router_load_balancing_type=["aux_loss"])
    qwen3 = args_to_nemo(vars(megatron_lm_args(qk_layernorm=True, kv_channels=32, **moe)), "x")
    assert {k: qwen3[k] for k in ("num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq",
                                  "moe_router_pre_softmax", "moe_aux_loss_coeff")} == {
        "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 48, "moe_layer_freq": 1,
        "moe_router_pre_softmax": False, "moe_aux_loss_coeff": 0.001}
    assert family_for_config(qwen3).name == "qwen3_moe"
    mixtral = args_to_nemo(vars(megatron_lm_args(**{**moe, "moe_ffn_hidden_size": None})), "x")
    assert mixtral["moe_ffn_hidden_size"] == 96 and family_for_config(mixtral).name == "mixtral"
    qwen2 = args_to_nemo(vars(megatron_lm_args(add_qkv_bias=True, moe_shared_expert_intermediate_size=80,
                                               moe_shared_expert_gate=True, **{**moe, "moe_layer_freq": [1, 0]})),
                         "x")
    assert qwen2["moe_shared_expert_intermediate_size"] == 80 and qwen2["moe_layer_freq"] == [1, 0]
    assert family_for_config(qwen2).name == "qwen2_moe"
    deepseek = args_to_nemo(vars(megatron_lm_args(
        multi_latent_attention=True, q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8,
        v_head_dim=16, rope_type=None, rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0, qk_layernorm=True,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=2.5,
        moe_shared_expert_intermediate_size=48, **{**moe, "moe_layer_freq": [0, 1]})), "x")
    assert {k: deepseek[k] for k in ("multi_latent_attention", "kv_channels", "qk_pos_emb_head_dim",
                                     "moe_router_topk_scaling_factor", "moe_router_num_groups")} == {
        "multi_latent_attention": True, "kv_channels": 16, "qk_pos_emb_head_dim": 8,
        "moe_router_topk_scaling_factor": 2.5, "moe_router_num_groups": None}
    assert family_for_config(deepseek).name == "deepseek_v3"
    for over, words in ((dict(moe_router_enable_expert_bias=True), "moe_router_enable_expert_bias=True"),
                        (dict(moe_router_topk_scaling_factor=2.5), "moe_router_topk_scaling_factor=2.5"),
                        (dict(moe_router_num_groups=2), "moe_router_num_groups=2"),
                        (dict(moe_expert_capacity_factor=1.0), "moe_expert_capacity_factor=1.0"),
                        (dict(moe_shared_expert_gate=True), "moe_shared_expert_gate without")):
        with pytest.raises(UnsupportedError, match=words):
            args_to_nemo(vars(megatron_lm_args(**{**moe, **over})), "x")


def test_megatron_lm_qwen3_moe_directory(family_models, tmp_path) -> None:
    """A Megatron-LM torch_dist save of a Qwen3-MoE (--num-experts 4 --moe-router-topk 2
    --moe-ffn-hidden-size 48 --qk-layernorm) exports as Qwen3-MoE: the source's tensors
    and transformers' logits."""
    from test_family_matrix import logits

    src = family_models["qwen3_moe"]
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    args = megatron_lm_args(ffn_hidden_size=96, max_position_embeddings=64, layernorm_epsilon=1e-6, vocab_size=128,
                            padded_vocab_size=128, qk_layernorm=True, kv_channels=32, num_experts=4,
                            moe_router_topk=2, moe_ffn_hidden_size=48, moe_layer_freq=1)
    mlm = as_megatron_lm(mb, str(tmp_path / "mlm"), args)
    info = api.inspect_checkpoint(mlm)
    assert info["format"] == "megatron-lm" and info["family"] == "qwen3_moe"
    back = str(tmp_path / "back")
    api.export_hf(mlm, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(logits(back), logits(src))


def test_moe_refusals_when_writing(family_models, tmp_path) -> None:
    """Qwen3-MoE's provider has no shared experts, sigmoid scores or expert bias: a config
    with them is refused by name."""
    base = {"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "ffn_hidden_size": 16, "qk_layernorm": True,
            "bias": False, "num_moe_experts": 4, "moe_router_topk": 2, "activation": "fast-swiglu",
            "normalization": "rmsnorm", "position_embedding_type": "rope"}  # what Qwen3-MoE's table writes
    assert nemo_to_provider(base, "qwen3_moe", providers=PROVIDERS, vocab_size=8, params_dtype=torch.float32)["num_moe_experts"] == 4
    for over, words in ((dict(moe_shared_expert_intermediate_size=8), "moe_shared_expert_intermediate_size=8"),
                        (dict(moe_router_score_function="sigmoid"), "moe_router_score_function='sigmoid'"),
                        (dict(moe_router_enable_expert_bias=True), "moe_router_enable_expert_bias=True"),
                        (dict(num_moe_experts=None), "no num_moe_experts")):
        with pytest.raises(UnsupportedError, match=words):
            nemo_to_provider({**base, **over}, "qwen3_moe", providers=PROVIDERS, vocab_size=8, params_dtype=torch.float32)
    with pytest.raises(UnsupportedError, match="num_moe_experts=4"):
        nemo_to_provider(base, "qwen3", providers=PROVIDERS, vocab_size=8, params_dtype=torch.float32)


def test_mla_provider_reading_refuses_what_deepseek_v3_does_not_run(family_models, tmp_path) -> None:
    """An MLAModelProvider section read without our record: plain RoPE whose softmax MLA
    still scales (``rope_type: rope`` with factor 40 and ``mscale_all_dim`` 1), softmax routing
    with an expert bias or sigmoid routing without one are refused by name (DeepSeek-V2's
    softmax routing without a bias reads: ``test_family_to_megatron_bridge_and_back``); MLA
    without experts too. (Without
    ``rotary_scaling_factor`` it is YaRN at MLATransformerConfig's 40: tests/test_yarn_dirs.py.)"""
    out = str(tmp_path / "mb")
    api.import_hf(family_models["deepseek_v3"], out, to="megatron-bridge")
    path = os.path.join(out, "iter_0000000", "run_config.yaml")
    doc = yaml.safe_load(open(path))
    os.remove(os.path.join(out, "iter_0000000", "nemo_convert.json"))
    assert api.inspect_checkpoint(out)["family"] == "deepseek_v3"
    for change, words in (({"rope_type": "rope", "rotary_scaling_factor": None}, "rope_type='rope' with "
                           "rotary_scaling_factor=40.0 and mscale_all_dim=1.0 scales MLA's softmax"),
                          ({"moe_router_score_function": "softmax"},  # softmax scores with V3's expert bias
                           "moe_router_enable_expert_bias=True with multi-latent attention and softmax scores"),
                          ({"moe_router_enable_expert_bias": False}, "moe_router_enable_expert_bias=False"),
                          ({"num_moe_experts": None}, "multi_latent_attention=True .* without experts")):
        model = {k: v for k, v in {**doc["model"], **change}.items() if v is not None}
        with open(path, "w") as f:
            yaml.safe_dump({"model": model}, f)
        with pytest.raises(UnsupportedError, match=words):
            api.inspect_checkpoint(out)


@pytest.mark.parametrize("family, over", [
    ("mixtral", dict(window_size=(3, 0), moe_ffn_hidden_size=None)),  # --moe-ffn-hidden-size absent: --ffn-hidden-size
    ("qwen2_moe", dict(add_qkv_bias=True, moe_shared_expert_intermediate_size=80, moe_shared_expert_gate=True,
                       moe_router_pre_softmax=True, moe_ffn_hidden_size=48)),
])
def test_megatron_lm_moe_directories_without_a_bridge(tmp_path, monkeypatch, family, over) -> None:
    """Mixtral and Qwen2-MoE have no Megatron-Bridge provider, but Megatron-LM trains them:
    a torch_dist save with their MoE arguments (the weights laid out here through a
    test-only provider entry) exports as that family, tensors and logits equal."""
    from nemo_convert.formats.megatron.providers import GPT_PROVIDER, ProviderFamily, ProviderTable
    from nemo_convert.plugins.manager import Registry
    from test_family_matrix import logits, make_model

    declared = Registry.providers
    test_only = ProviderFamily(GPT_PROVIDER, moe=True, shared_experts=True)  # Qwen2-MoE's shared experts
    monkeypatch.setattr(Registry, "providers",
                        lambda self: ProviderTable({**declared(self).families, family: test_only}))
    src = make_model(str(tmp_path / "hf"), family)
    mb = str(tmp_path / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    model = yaml.safe_load(open(os.path.join(mb, "iter_0000000", "run_config.yaml")))["model"]
    args = megatron_lm_args(ffn_hidden_size=model["ffn_hidden_size"], max_position_embeddings=model["seq_length"],
                            layernorm_epsilon=model["layernorm_epsilon"], rotary_base=model["rotary_base"],
                            vocab_size=128, padded_vocab_size=128, num_experts=4, moe_router_topk=2, moe_layer_freq=1,
                            **over)
    mlm = as_megatron_lm(mb, str(tmp_path / "mlm"), args)
    info = api.inspect_checkpoint(mlm)
    assert info["format"] == "megatron-lm" and info["family"] == family
    back = str(tmp_path / "back")
    api.export_hf(mlm, back)
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(logits(back), logits(src))
