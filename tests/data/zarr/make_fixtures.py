"""Write the zarr ``.nemo`` fixtures of ``tests/test_zarr.py`` with Megatron-Core's own zarr strategy.

Megatron-Core removed the zarr backend (NVIDIA/Megatron-LM ``faa6037b87``, "fully remove zarr
support"), and the last release that writes it, megatron-core 0.13.1, cannot share a venv with
the 0.16.1 the project tests with. So this script runs in two interpreters:

- the project's (``transformers``, ``sentencepiece``, ``nemo_convert.examples``): it makes the
  tiny random HF models (every parameter randomised, norms and their biases included), turns
  them into Megatron's global (TP=1) local-spec tensors with its own code below, and lays each
  saved checkpoint out as NeMo lays out a ``.nemo`` (an unpacked folder: ``model_config.yaml``,
  ``<md5>_tokenizer.model``, ``model_weights/``);
- megatron-core 0.13.1's (``--mcore-python``, a venv with ``megatron-core==0.13.1``,
  ``zarr==2.18.*``, ``tensorstore``, ``numcodecs``, torch; README.md has the exact versions):
  one gloo process per tensor-parallel rank builds a ``GPTModel`` (local spec) on CPU, loads
  its rank's slice and saves it with ``dist_checkpointing.save(...,
  sharded_strategy=("zarr", 1))`` under the ``model.`` prefix NeMo 1 uses (nemo-formats.md §1.6).
  ``torch.cuda.synchronize`` is made a no-op: the strategy calls it before each write
  (megatron/core/dist_checkpointing/strategies/zarr.py L153 at ``core_v0.13.1``).

Run from the repository root::

    python tests/data/zarr/make_fixtures.py --mcore-python /work/venv-mcore013/bin/python

It rewrites ``tests/data/zarr/{hf_llama,hf_nemotron,llama-*,nemotron-*}`` and
``versions.json``. The Llama fixtures are fp32 and bf16 at TP=1 and TP=2; the Nemotron one
(squared-ReLU, layernorm1p, rotary 0.5, GQA) is bf16 at TP=2. The Nemotron model is built with
plain LayerNorm: Megatron's CPU norm refuses ``layernorm_zero_centered_gamma``
(transformer/torch_norm.py L26-28), and the saved tensors are the same ``[H]`` weights and
biases either way (zero-centred γ, as HF's ``NemotronLayerNorm1P`` stores them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ = 128
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=SEQ)
TOKENIZER_VOCAB = 96
FIXTURES = [  # (name, family, dtype, tp)
    ("llama-tp1-fp32", "llama", "float32", 1),
    ("llama-tp2-fp32", "llama", "float32", 2),
    ("llama-tp1-bf16", "llama", "bfloat16", 1),
    ("llama-tp2-bf16", "llama", "bfloat16", 2),
    ("nemotron-tp2-bf16", "nemotron", "bfloat16", 2),
]


def _pow2_divisor(n: int) -> int:
    d = 128  # NeMo's convert_llama_hf_to_nemo.py L122-125: start at 128, halve until it divides
    while n % d:
        d //= 2
    return d


def padded_vocab(vocab: int, tp: int) -> int:
    """NeMo's padding (megatron_base_model.py L623-645): a multiple of divisible_by × TP."""
    m = _pow2_divisor(vocab) * tp
    return -(-vocab // m) * m


# ------------------------------------------------------------------ the HF side (project venv)

def make_hf(family: str, folder: str, vocab: int) -> None:
    import torch

    from nemo_convert.examples import make_tiny_llama, randomize_

    if family == "llama":
        make_tiny_llama(folder, tokenizer=False, seed=21, vocab_size=vocab, rms_norm_eps=1e-5, **SHAPE)
        return
    from transformers import NemotronConfig, NemotronForCausalLM

    cfg = NemotronConfig(vocab_size=vocab, hidden_act="relu2", norm_eps=1e-5, partial_rotary_factor=0.5,
                         rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, **SHAPE)
    torch.manual_seed(22)
    model = NemotronForCausalLM(cfg)
    randomize_(model, 22)
    model.save_pretrained(folder, safe_serialization=True)


def megatron_global(family: str, hf: dict[str, Any], padded: int, dtype: Any,
                    shape: dict[str, int] = SHAPE) -> dict[str, Any]:
    """Megatron's global local-spec tensors of an HF model: per query group ``[q…, k, v]`` rows
    in ``linear_qkv`` (nemo-formats.md §2.3), ``linear_fc1 = [gate; up]`` when gated (§2.4),
    vocabulary rows padded with random values (so a missing trim shows)."""
    import torch

    g = torch.Generator().manual_seed(5)
    h, nh, ng, nl = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"], \
        shape["num_hidden_layers"]
    d = h // nh

    def pad(t: Any) -> Any:
        return torch.cat([t, torch.randn(padded - t.shape[0], t.shape[1], generator=g)]) if padded > t.shape[0] else t

    out = {"embedding.word_embeddings.weight": pad(hf["model.embed_tokens.weight"]),
           "decoder.final_layernorm.weight": hf["model.norm.weight"],
           "output_layer.weight": pad(hf["lm_head.weight"])}
    if family == "nemotron":
        out["decoder.final_layernorm.bias"] = hf["model.norm.bias"]
    for i in range(nl):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[p + "self_attn.q_proj.weight"].view(ng, nh // ng * d, h)
        k = hf[p + "self_attn.k_proj.weight"].view(ng, d, h)
        v = hf[p + "self_attn.v_proj.weight"].view(ng, d, h)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], 1).reshape(-1, h)
        out[m + "self_attention.linear_proj.weight"] = hf[p + "self_attn.o_proj.weight"]
        if family == "llama":
            out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[p + "mlp.gate_proj.weight"],
                                                          hf[p + "mlp.up_proj.weight"]])
        else:
            out[m + "mlp.linear_fc1.weight"] = hf[p + "mlp.up_proj.weight"]
        out[m + "mlp.linear_fc2.weight"] = hf[p + "mlp.down_proj.weight"]
        for norm, hf_norm in (("input_layernorm", "input_layernorm"), ("pre_mlp_layernorm", "post_attention_layernorm")):
            out[m + norm + ".weight"] = hf[p + hf_norm + ".weight"]
            if family == "nemotron":
                out[m + norm + ".bias"] = hf[p + hf_norm + ".bias"]
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def nemo_config(family: str, vocab: int, tp: int, dtype: str, tokenizer_ref: str,
                shape: dict[str, int] = SHAPE) -> dict[str, Any]:
    """A ``model_config.yaml`` as NeMo 1.2x wrote it for an mcore GPT saved in zarr:
    ``megatron_gpt_config.yaml``'s model section (NeMo examples/nlp/language_modeling/conf)
    with the converter's overrides (nemo-formats.md §2.6), ``dist_ckpt_format: zarr`` (the
    default until NeMo PR 10291), and ``target``/``nemo_version`` as ModelPT adds them
    (nemo/core/classes/modelPT.py L123-131)."""
    llama = family == "llama"
    return {
        "mcore_gpt": True, "micro_batch_size": 1, "global_batch_size": 8,
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "encoder_seq_length": shape["max_position_embeddings"],
        "max_position_embeddings": shape["max_position_embeddings"],
        "num_layers": shape["num_hidden_layers"], "hidden_size": shape["hidden_size"],
        "ffn_hidden_size": shape["intermediate_size"], "num_attention_heads": shape["num_attention_heads"],
        "init_method_std": 0.02, "use_scaled_init_method": True,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "ffn_dropout": 0.0,
        "kv_channels": None, "apply_query_key_layer_scaling": True,
        "normalization": "rmsnorm" if llama else "layernorm1p",
        "layernorm_epsilon": 1e-5, "do_layer_norm_weight_decay": False,
        "make_vocab_size_divisible_by": _pow2_divisor(vocab), "pre_process": True, "post_process": True,
        "persist_layer_norm": True, "bias": False, "activation": "fast-swiglu" if llama else "squared-relu",
        "headscale": False, "transformer_block_type": "pre_ln", "openai_gelu": False,
        "normalize_attention_scores": True, "position_embedding_type": "rope",
        "rotary_percentage": 1.0 if llama else 0.5, "attention_type": "multihead",
        "share_embeddings_and_output_weights": False, "overlap_p2p_comm": False, "batch_p2p_comm": True,
        "num_query_groups": shape["num_key_value_heads"],
        "tokenizer": {"library": "sentencepiece", "type": None, "model": tokenizer_ref, "vocab_file": None,
                      "merge_file": None, "delimiter": None, "sentencepiece_legacy": False},
        "native_amp_init_scale": 4294967296, "native_amp_growth_interval": 1000, "hysteresis": 2,
        "fp32_residual_connection": False, "fp16_lm_cross_entropy": False,
        "megatron_amp_O2": dtype == "bfloat16",
        "grad_allreduce_chunk_size_mb": 125, "grad_div_ar_fusion": True, "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False, "bias_dropout_add_fusion": False, "masked_softmax_fusion": True,
        "get_attention_mask_from_fusion": True, "seed": 1234, "resume_from_checkpoint": None,
        "use_cpu_initialization": False, "onnx_safe": False, "apex_transformer_log_level": 30,
        "gradient_as_bucket_view": True, "sync_batch_comm": False, "sequence_parallel": False,
        "transformer_engine": True, "fp8": False, "dist_ckpt_format": "zarr",
        "rotary_base": 10000.0, "seq_len_interpolation_factor": None,
        "precision": "bf16" if dtype == "bfloat16" else 32,
        "optim": {"name": "fused_adam", "lr": 2e-4, "weight_decay": 0.01, "betas": [0.9, 0.98]},
        "target": "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel",
        "nemo_version": "1.23.0",
    }


def write_tokenizer(path: str) -> str:
    """A tiny SentencePiece BPE model; the ``identity`` normaliser keeps it ~1 KB (the
    default NFKC table alone is ~240 KB)."""
    import io

    import sentencepiece as spm

    from nemo_convert.examples import corpus

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=buf, vocab_size=TOKENIZER_VOCAB,
                                   model_type="bpe", character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0,
                                   pad_id=-1, hard_vocab_limit=False, minloglevel=2,
                                   normalization_rule_name="identity")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


def build(mcore_python: str) -> None:
    import sentencepiece as spm
    import torch
    import yaml
    from safetensors.torch import load_file

    tmp = tempfile.mkdtemp(prefix="zarr-fixtures-")
    try:
        tok_path = write_tokenizer(os.path.join(tmp, "tokenizer.model"))
        vocab = spm.SentencePieceProcessor(model_file=tok_path).get_piece_size()
        with open(tok_path, "rb") as f:
            tok = f.read()
        tok_member = f"{hashlib.md5(tok).hexdigest()}_tokenizer.model"
        hf_weights = {}
        for family in ("llama", "nemotron"):
            folder = os.path.join(HERE, f"hf_{family}")
            shutil.rmtree(folder, ignore_errors=True)
            make_hf(family, folder, vocab)
            shutil.copyfile(tok_path, os.path.join(folder, "tokenizer.model"))
            hf_weights[family] = load_file(os.path.join(folder, "model.safetensors"))
        versions: dict[str, Any] = {}
        for name, family, dtype, tp in FIXTURES:
            job = os.path.join(tmp, name)
            os.makedirs(job)
            padded = padded_vocab(vocab, tp)
            torch.save(megatron_global(family, hf_weights[family], padded, getattr(torch, dtype)),
                       os.path.join(job, "global.pt"))
            with open(os.path.join(job, "job.json"), "w") as f:
                json.dump({"family": family, "dtype": dtype, "padded": padded}, f)
            procs = [subprocess.Popen([mcore_python, os.path.abspath(__file__), "--worker", job, str(r), str(tp)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(tp)]
            outs = [p.communicate(timeout=600) for p in procs]
            for p, (out, err) in zip(procs, outs):
                if p.returncode != 0 or "SAVED" not in out:
                    raise SystemExit(f"{name}: worker failed\n{out[-3000:]}\n{err[-6000:]}")
            versions = json.loads(outs[0][0].split("VERSIONS ", 1)[1].splitlines()[0])
            dest = os.path.join(HERE, name)
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            shutil.copytree(os.path.join(job, "model_weights"), os.path.join(dest, "model_weights"))
            shutil.copyfile(tok_path, os.path.join(dest, tok_member))
            with open(os.path.join(dest, "model_config.yaml"), "w") as f:
                yaml.safe_dump(nemo_config(family, vocab, tp, dtype, "nemo:" + tok_member), f, sort_keys=False)
            print(f"wrote {dest}")
        import transformers

        versions["transformers (HF side)"] = transformers.__version__
        versions["torch (HF side)"] = torch.__version__
        with open(os.path.join(HERE, "versions.json"), "w") as f:
            json.dump(versions, f, indent=2, sort_keys=True)
            f.write("\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ the Megatron side (megatron-core 0.13.1)

def _rank_slice(name: str, t: Any, rank: int, tp: int, gated: bool) -> Any:
    """Megatron's local parameter at ``rank``: column-parallel rows (QKV, fc1, vocabulary),
    row-parallel columns (proj, fc2), gated fc1 as ``[gate_r; up_r]``, norms replicated."""
    import torch

    if name.endswith("linear_fc1.weight") and gated:
        gate, up = t.chunk(2)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    if name.endswith(("linear_qkv.weight", "linear_fc1.weight", "word_embeddings.weight", "output_layer.weight")):
        return t.chunk(tp)[rank].contiguous()
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return t.chunk(tp, 1)[rank].contiguous()
    return t


def worker(job: str, rank: int, tp: int) -> None:
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

    # CPU stand-ins for the CUDA calls Megatron makes while building and saving.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    with open(os.path.join(job, "job.json")) as f:
        spec = json.load(f)
    llama = spec["family"] == "llama"
    dtype = getattr(torch, spec["dtype"])
    shape = spec.get("shape", SHAPE)  # bench/bench_zarr.py passes a bigger one, and "backend"
    dist.init_process_group("gloo", init_method=f"file://{job}/pg", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tp, 1)

    def squared_relu(x: Any) -> Any:
        return torch.pow(fn.relu(x), 2)

    cfg = TransformerConfig(
        num_layers=shape["num_hidden_layers"], hidden_size=shape["hidden_size"],
        num_attention_heads=shape["num_attention_heads"], num_query_groups=shape["num_key_value_heads"],
        ffn_hidden_size=shape["intermediate_size"], gated_linear_unit=llama,
        activation_func=fn.silu if llama else squared_relu,
        normalization="RMSNorm" if llama else "LayerNorm", layernorm_epsilon=1e-5, add_bias_linear=False,
        use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0, tensor_model_parallel_size=tp,
        params_dtype=dtype, bf16=dtype == torch.bfloat16)
    model = GPTModel(cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=cfg.normalization),
                     vocab_size=spec["padded"], max_sequence_length=shape["max_position_embeddings"],
                     position_embedding_type="rope",
                     rotary_percent=1.0 if llama else 0.5, rotary_base=10000,
                     share_embeddings_and_output_weights=False).to(dtype)
    full = torch.load(os.path.join(job, "global.pt"), weights_only=True)
    local = {k: _rank_slice(k, v, rank, tp, llama) for k, v in full.items()}
    result = model.load_state_dict(local, strict=False)
    assert not result.unexpected_keys and all("_extra_state" in k for k in result.missing_keys), result
    for k, v in model.state_dict().items():
        if k in local:
            assert torch.equal(v, local[k]) and v.dtype == dtype, k
    out = os.path.join(job, "model_weights")
    if rank == 0:
        os.makedirs(out)
    dist.barrier()
    backend = spec.get("backend", "zarr")  # bench/bench_zarr.py also saves torch_dist (Megatron's default)
    dist_checkpointing.save(model.sharded_state_dict(prefix="model."), out,
                            sharded_strategy=(backend, 1) if backend == "zarr" else None)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and backend == "zarr":
        from importlib.metadata import version

        names = ("megatron-core", "zarr", "tensorstore", "numcodecs", "numpy", "ml_dtypes")
        print("VERSIONS " + json.dumps({**{n: version(n) for n in names}, "torch (Megatron side)": torch.__version__,
                                        "python": sys.version.split()[0]}))
    print("SAVED", rank)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        ap.add_argument("--mcore-python", required=True,
                        help="the python of a venv with megatron-core 0.13.1, zarr 2.18, tensorstore, numcodecs")
        build(ap.parse_args().mcore_python)
