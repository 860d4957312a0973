"""We read the ``.nemo`` files NeMo writes, with weights saved by Megatron-Core itself.

A tiny random HF Llama (``transformers``; norms randomised, GQA, untied or tied) is loaded
into a Megatron-Core ``GPTModel`` at TP=1 or TP=2 (one gloo process per rank, on CPU) and
saved with Megatron's own ``dist_checkpointing.save``, then laid out as NeMo lays out a
``.nemo``: ``./model_config.yaml`` (the NeMo-native config NeMo's
``convert_llama_hf_to_nemo.py`` writes: ``megatron_llama_config.yaml``'s model section with
the converter's overrides, /work/shared/reference/nemo-formats.md §2.6, no ``nemo_convert``
section), ``./<32hex>_tokenizer.model`` and ``./model_weights/``. ``inspect``, ``export``,
``verify`` and ``reshard`` must all work on it, and the export must give the source's logits.

Layout facts, all from Megatron-Core 0.16.1 (``megatron/core``):
- layers are stacked on a leading ``[L]`` axis with per-layer chunks (offset
  ``(0, layer, L)``, transformer/transformer_block.py L866-874);
- ``linear_fc1.weight`` is saved as two chunks per layer and rank, the gate half at rows
  ``[r·F/TP, …)`` and the up half at ``F + r·F/TP`` (``apply_swiglu_sharded_factory``,
  transformer/mlp.py L276-333), i.e. each rank holds ``[gate_r; up_r]``;
- the embedding and output layer hold the padded vocabulary (NeMo pads to a multiple of
  ``make_vocab_size_divisible_by × TP``, nemo-formats.md §2.6 / megatron_base_model.py
  L623-645) and are saved with ``allow_shape_mismatch`` (tensor_parallel/layers.py L309-317);
- ``_extra_state`` items are ShardedObjects (BYTE_IO); ``common.pt`` and ``metadata.json``
  come from dist_checkpointing/serialization.py L411-430; each rank writes two
  ``__<rank>_<i>.distcp`` files (strategies/torch.py L602, filesystem_async.py L121).
NeMo 1 saves with the ``model.`` prefix (nemo-formats.md §1.6, megatron_gpt_model.py L2052-2061).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from typing import Any

import pytest

# found, not imported, at collection: importing megatron.core costs seconds (tests/conftest.py, test time)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="needs megatron.core")

L, H, NH, NG, F, SEQ = 2, 64, 4, 2, 96, 256


def _padded(vocab: int, divisible_by: int, tp: int) -> int:
    m = divisible_by * tp
    return -(-vocab // m) * m


def _pow2_divisor(n: int) -> int:
    d = 128  # convert_llama_hf_to_nemo.py L122-125: start at 128, halve until it divides
    while n % d:
        d //= 2
    return d


# ------------------------------------------------------------------ the Megatron side (subprocess)

def _megatron_global(hf: dict[str, Any], tied: bool, padded: int, seed: int) -> dict[str, Any]:
    """The global (TP=1) Megatron local-spec state dict of an HF Llama, written independently
    of nemo_convert: per-group [q…, k, v] QKV rows, fc1 = [gate; up], vocab rows padded
    with random values (so that a missing trim shows)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = H // NH

    def pad(t: Any) -> Any:
        return torch.cat([t, torch.randn(padded - t.shape[0], t.shape[1], generator=g)]) if padded > t.shape[0] else t

    out = {"embedding.word_embeddings.weight": pad(hf["model.embed_tokens.weight"]),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not tied:
        out["output_layer.weight"] = pad(hf["lm_head.weight"])
    for i in range(L):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[p + "self_attn.q_proj.weight"].view(NG, NH // NG * d, H)
        k = hf[p + "self_attn.k_proj.weight"].view(NG, d, H)
        v = hf[p + "self_attn.v_proj.weight"].view(NG, d, H)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], 1).reshape(-1, H)
        out[m + "self_attention.linear_proj.weight"] = hf[p + "self_attn.o_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = hf[p + "mlp.down_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
    return out


def _rank_slice(name: str, t: Any, rank: int, tp: int) -> Any:
    """Megatron's local parameter at ``rank``: column-parallel (QKV, vocab) rows, row-parallel
    (proj, fc2) columns, fc1 as [gate_r; up_r] (mlp.py L276-333), norms replicated."""
    import torch

    if name.endswith("linear_fc1.weight"):
        gate, up = t.chunk(2)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    if name.endswith(("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
        return t.chunk(tp)[rank]
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return t.chunk(tp, 1)[rank]
    return t


def _worker(root: str, rank: int, tp: int) -> None:
    import contextlib
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as fn
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig
    from safetensors.torch import load_file

    # CPU stand-ins for the CUDA calls Megatron makes while building and saving.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    with open(os.path.join(root, "job.json")) as f:
        job = json.load(f)
    hf = load_file(os.path.join(root, "hf", "model.safetensors"))
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tp, 1)
    cfg = TransformerConfig(num_layers=L, hidden_size=H, num_attention_heads=NH, num_query_groups=NG,
                            ffn_hidden_size=F, gated_linear_unit=True, activation_func=fn.silu,
                            normalization="RMSNorm", layernorm_epsilon=1e-5, add_bias_linear=False,
                            use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
                            tensor_model_parallel_size=tp)
    model = GPTModel(cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=job["padded"], max_sequence_length=SEQ, position_embedding_type="rope",
                     rotary_base=10000, share_embeddings_and_output_weights=job["tied"])
    full = _megatron_global(hf, job["tied"], job["padded"], seed=7)
    local = {k: _rank_slice(k, v, rank, tp) for k, v in full.items()}
    result = model.load_state_dict(local, strict=False)
    assert not result.unexpected_keys and all("_extra_state" in k for k in result.missing_keys), result
    out = os.path.join(root, "model_weights")
    if rank == 0:
        os.makedirs(out)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(prefix="model."), out)
    dist.barrier()
    dist.destroy_process_group()
    print("SAVED", rank)


# ------------------------------------------------------------------ building the .nemo

def _native_config(vocab: int, tied: bool, tp: int, tokenizer_ref: str) -> dict[str, Any]:
    """``megatron_llama_config.yaml``'s model section (NeMo examples/nlp/language_modeling/
    conf, L41-119) with convert_llama_hf_to_nemo.py's overrides (L77-128, L177-178); the
    parallel sizes as the checkpoint was saved, tied as the model is."""
    return {
        "mcore_gpt": True, "micro_batch_size": 1, "global_batch_size": 8,
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "encoder_seq_length": SEQ, "max_position_embeddings": SEQ, "num_layers": L, "hidden_size": H,
        "ffn_hidden_size": F, "num_attention_heads": NH, "init_method_std": 0.02, "use_scaled_init_method": True,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "ffn_dropout": 0.0,
        "kv_channels": None, "apply_query_key_layer_scaling": True, "normalization": "rmsnorm",
        "layernorm_epsilon": 1e-5, "do_layer_norm_weight_decay": False,
        "make_vocab_size_divisible_by": _pow2_divisor(vocab), "pre_process": True, "post_process": True,
        "persist_layer_norm": True, "bias": False, "activation": "fast-swiglu", "headscale": False,
        "transformer_block_type": "pre_ln", "openai_gelu": False, "normalize_attention_scores": True,
        "position_embedding_type": "rope", "rotary_percentage": 1.0, "attention_type": "multihead",
        "share_embeddings_and_output_weights": tied, "overlap_p2p_comm": False, "batch_p2p_comm": True,
        "num_query_groups": NG,
        "tokenizer": {"library": "sentencepiece", "type": None, "model": tokenizer_ref, "vocab_file": None,
                      "merge_file": None, "delimiter": None, "sentencepiece_legacy": False},
        "native_amp_init_scale": 4294967296, "native_amp_growth_interval": 1000, "hysteresis": 2,
        "fp32_residual_connection": False, "fp16_lm_cross_entropy": False, "megatron_amp_O2": False,
        "grad_allreduce_chunk_size_mb": 125, "grad_div_ar_fusion": True, "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False, "bias_dropout_add_fusion": False, "masked_softmax_fusion": True,
        "get_attention_mask_from_fusion": True, "seed": 1234, "resume_from_checkpoint": None,
        "use_cpu_initialization": False, "onnx_safe": False, "apex_transformer_log_level": 30,
        "gradient_as_bucket_view": True, "sync_batch_comm": False, "sequence_parallel": False,
        "transformer_engine": True, "fp8": False,
        "rotary_base": 10000.0, "seq_len_interpolation_factor": None,
        "scale_positional_embedding": True,  # --llama31 defaults to True (convert_llama_hf_to_nemo.py L126)
        "precision": 32,
        "optim": {"name": "fused_adam", "lr": 2e-4, "weight_decay": 0.01, "betas": [0.9, 0.98]},
        # added by ModelPT when saving (nemo/core/classes/modelPT.py L123-131)
        "target": "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel",
        "nemo_version": "2.0.0",
    }


def _pack(root: str, nemo: str, tok_path: str, tok_member: str, weights: str) -> str:
    with tarfile.open(nemo, "w") as tar:  # NeMo's tar: uncompressed, members under ./
        tar.add(os.path.join(root, "model_config.yaml"), arcname="./model_config.yaml")
        tar.add(tok_path, arcname=f"./{tok_member}")
        tar.add(weights, arcname="./model_weights")
    return nemo


def without_extra_state(root: str) -> str:
    """A copy of the ``.nemo`` whose ``.metadata`` lists no ``_extra_state`` item (what a
    checkpoint saved without them looks like); the data files are Megatron's."""
    import pickle
    import shutil

    src, dst = os.path.join(root, "model_weights"), os.path.join(root, "no_extra")
    shutil.copytree(src, dst)
    with open(os.path.join(dst, ".metadata"), "rb") as f:
        md = pickle.load(f)  # our own test file: torch's classes may load it
    gone = {k for k in md.state_dict_metadata if "_extra_state" in k}
    assert gone
    md.state_dict_metadata = {k: v for k, v in md.state_dict_metadata.items() if k not in gone}
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn not in gone}
    with open(os.path.join(dst, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    with open(os.path.join(root, "tok.json")) as f:
        tok_path, tok_member = json.load(f)
    return _pack(root, os.path.join(root, "no_extra.nemo"), tok_path, tok_member, dst)


def build_megatron_nemo(root: str, *, tp: int, tied: bool) -> tuple[str, str]:
    """(``.nemo`` path, source HF folder)."""
    import sentencepiece as spm
    import yaml

    from nemo_convert.examples import make_tiny_llama, write_sentencepiece

    os.makedirs(root, exist_ok=True)
    hf = os.path.join(root, "hf")
    os.makedirs(hf)
    tok_path = write_sentencepiece(os.path.join(hf, "tokenizer.model"), vocab_size=200)
    vocab = spm.SentencePieceProcessor(model_file=tok_path).get_piece_size()
    make_tiny_llama(hf, tokenizer=False, seed=3, vocab_size=vocab, tie_word_embeddings=tied,
                    max_position_embeddings=SEQ)
    padded = _padded(vocab, _pow2_divisor(vocab), tp)
    with open(os.path.join(root, "job.json"), "w") as f:
        json.dump({"padded": padded, "tied": tied}, f)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), root, str(r), str(tp)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(tp)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "SAVED" in out, out[-2000:] + err[-4000:]
    with open(tok_path, "rb") as f:
        tok = f.read()
    tok_member = f"{hashlib.md5(tok).hexdigest()}_tokenizer.model"
    with open(os.path.join(root, "model_config.yaml"), "w") as f:
        yaml.safe_dump(_native_config(vocab, tied, tp, "nemo:" + tok_member), f, sort_keys=False)
    with open(os.path.join(root, "tok.json"), "w") as f:
        json.dump([tok_path, tok_member], f)
    nemo = _pack(root, os.path.join(root, "megatron.nemo"), tok_path, tok_member, os.path.join(root, "model_weights"))
    return nemo, hf


# ------------------------------------------------------------------ the tests

def _logits(folder: str) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    ids = torch.tensor([[1, 5, 9, 33, 70, 2, 101, 150, 7, 3, 64, 12]])
    with torch.no_grad():
        return model.eval()(ids).logits


def _with_rope(hf: str, folder: str, rope: dict[str, Any]) -> str:
    """The source weights in ``folder`` with ``rope`` scaling added to their config."""
    os.makedirs(folder)
    os.symlink(os.path.join(hf, "model.safetensors"), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**cfg, "rope_scaling": rope}, f)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("tp,tied", [(1, False), (2, False), (2, True)], ids=["tp1", "tp2", "tp2-tied"])
def test_nemo_written_by_megatron_core(tmp_path: Any, cli: Any, tp: int, tied: bool) -> None:
    import torch
    from tiny_models import hf_tensors

    from nemo_convert import api
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    nemo, hf = build_megatron_nemo(str(tmp_path / "src"), tp=tp, tied=tied)
    weights = DistCheckpointSource.from_dir(tmp_path / "src" / "model_weights", strip_prefix="model.")
    fc1 = next(c for k, (_, _, c) in weights._raw.items() if k.endswith("linear_fc1.weight"))
    assert len(fc1) == 2 * L * tp  # Megatron's gate/up chunks: what our writer never produces
    assert sorted({c.path for c in fc1}) == sorted(f"__{r}_{i}.distcp" for r in range(tp) for i in range(2)) \
        or tp == 1
    assert len(weights.extra_state_keys) == 4 * L
    weights.close()

    # inspect
    code, out, err = cli("inspect", nemo, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["layout"] == "dist" and info["family"] == "llama"

    # export as NeMo runs it: llama3 RoPE scaling (NeMo's defaults), with the one-line warning
    code, out, err = cli("export", nemo, "-o", str(tmp_path / "scaled"))
    assert code == 0, err
    assert "scale_positional_embedding" in err and "--no-rope-scaling" in err
    scaled = json.loads((tmp_path / "scaled" / "config.json").read_text())
    nemo_rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
    assert scaled["rope_scaling"] == nemo_rope
    a, b = _logits(str(tmp_path / "scaled")), _logits(_with_rope(hf, str(tmp_path / "hf-llama3"), nemo_rope))
    assert (a - b).abs().max().item() <= 1e-5 and not torch.equal(a, _logits(hf))  # scaling changes them

    # export without it: the source model back, bit for bit
    rep = api.export_hf(nemo, str(tmp_path / "out"), rope_scaling=False)
    assert not any("scale_positional_embedding" in w for w in rep.warnings)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    src_cfg = json.loads((tmp_path / "src" / "hf" / "config.json").read_text())
    assert "rope_scaling" not in cfg or cfg["rope_scaling"] is None
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings", "hidden_size",
                "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "rms_norm_eps", "max_position_embeddings"):
        assert cfg[key] == src_cfg[key], key
    assert cfg["torch_dtype"] == "float32" and cfg.get("pad_token_id") is None
    got, want = hf_tensors(str(tmp_path / "out")), hf_tensors(hf)
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    a, b = _logits(str(tmp_path / "out")), _logits(hf)
    assert (a - b).abs().max().item() <= 1e-5
    print(f"logits max |delta| TP={tp} tied={tied}: {(a - b).abs().max().item():.3g}")

    if tp == 1:  # _extra_state items absent: the same model
        api.export_hf(without_extra_state(str(tmp_path / "src")), str(tmp_path / "no-extra"), rope_scaling=False)
        again = hf_tensors(str(tmp_path / "no-extra"))
        assert sorted(again) == sorted(want) and all(torch.equal(again[k], want[k]) for k in want)

    # verify: every tensor equal (the config differs where NeMo's does: RoPE scaling, extra HF keys)
    code, out, err = cli("verify", nemo, hf, "--json")
    report = json.loads(out)
    assert all(t["status"] in ("equal", "skipped") for t in report["tensors"]), report["tensors"]

    # reshard: dist -> legacy TP2 -> dist TP1, and dist -> dist; the weights survive
    code, _, err = cli("reshard", nemo, "-o", str(tmp_path / "legacy.nemo"), "--layout", "legacy", "--tp", "2")
    assert code == 0, err
    code, _, err = cli("reshard", str(tmp_path / "legacy.nemo"), "-o", str(tmp_path / "back.nemo"),
                       "--layout", "dist", "--tp", "1")
    assert code == 0, err
    code, _, err = cli("reshard", nemo, "-o", str(tmp_path / "dist.nemo"))
    assert code == 0, err
    for name in ("back", "dist"):
        api.export_hf(str(tmp_path / f"{name}.nemo"), str(tmp_path / f"{name}-hf"), rope_scaling=False)
        again = hf_tensors(str(tmp_path / f"{name}-hf"))
        assert sorted(again) == sorted(want) and all(torch.equal(again[k], want[k]) for k in want), name


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
