"""Megatron-Core loads the dist checkpoints we write, and we read the ones it writes.

Skipped unless ``megatron.core`` is importable. Megatron-Core 0.16.1 installs on a CPU
machine without its optional dependencies; to run this test without touching the
project venv::

    python -m venv /tmp/mcore-venv
    echo /work/main/.venv/lib/python3.11/site-packages \\
        > /tmp/mcore-venv/lib/python3.11/site-packages/main-venv.pth
    /tmp/mcore-venv/bin/pip install --no-deps megatron-core==0.16.1
    PYTHONPATH=/work/main /tmp/mcore-venv/bin/python -m pytest tests/test_megatron_compat.py

The Megatron part runs in a subprocess (a gloo process group of size 1 on CPU), so the
global process-group state never leaks into the rest of the test session.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import pytest

# found, not imported, at collection: importing megatron.core costs seconds (tests/conftest.py, test time)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="needs megatron.core")

L, H, NH, NG, F, V = 2, 64, 4, 2, 96, 128
MODULES = ["self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]
# local-spec per-layer name -> the stacked checkpoint name (megatron-compat.md §3)
LAYER_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    **{f"{m}.weight": f"{m}.weight" for m in MODULES},
}


def _worker(root: str) -> None:  # runs in the subprocess
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as fn
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
    from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter
    from nemo_convert.formats.io.sink import DirectorySink

    # Megatron's RoPE moves its frequencies to the current CUDA device; keep them on CPU.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]  # (its async saver)
    # ... and forks the CUDA RNG around attention dropout (which is 0 here): skip that.
    import contextlib

    from megatron.core.tensor_parallel import random as tp_random

    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    cfg = TransformerConfig(num_layers=L, hidden_size=H, num_attention_heads=NH, num_query_groups=NG,
                            ffn_hidden_size=F, gated_linear_unit=True, activation_func=fn.silu,
                            normalization="RMSNorm", add_bias_linear=False, use_cpu_initialization=True,
                            attention_dropout=0.0, hidden_dropout=0.0)

    def build(seed: int) -> Any:
        torch.manual_seed(seed)
        model = GPTModel(cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                         vocab_size=V, max_sequence_length=32, position_embedding_type="rope",
                         share_embeddings_and_output_weights=False)
        with torch.no_grad():  # randomise norms too, so a swapped norm shows
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.1)
        return model.eval()

    src_model = build(1)
    sd = {k: v for k, v in src_model.state_dict().items() if isinstance(v, torch.Tensor)}

    # 1. Our writer, streamed one layer at a time, loaded by Megatron.
    w = DistCheckpointWriter(DirectorySink(f"{root}/ours"), "model_weights")
    for name in ("embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"):
        w.declare("model." + name, tuple(sd[name].shape), sd[name].dtype)
        w.write_chunk("model." + name, (0,) * sd[name].dim(), sd[name])
    for local, stacked in LAYER_NAMES.items():
        key = f"model.decoder.layers.{stacked}"
        t0 = sd[f"decoder.layers.0.{local}"]
        w.declare(key, (L, *t0.shape), t0.dtype)
        for layer in reversed(range(L)):
            t = sd[f"decoder.layers.{layer}.{local}"]
            w.write_chunk(key, (layer,) + (0,) * t.dim(), t.unsqueeze(0))
    for m in MODULES:
        for layer in range(L):
            w.add_extra_state(f"model.decoder.layers.{m}._extra_state", layer, L)
    w.close()

    dst_model = build(2)
    loaded = dist_checkpointing.load(dst_model.sharded_state_dict(prefix="model."), f"{root}/ours/model_weights")
    dst_model.load_state_dict({k[len("model."):]: v for k, v in loaded.items()}, strict=True)
    for k, v in dst_model.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, sd[k]), k
    tokens = torch.randint(0, V, (1, 16))
    pos = torch.arange(16)[None]
    mask = torch.triu(torch.ones(1, 1, 16, 16, dtype=torch.bool), diagonal=1)  # True = masked
    with torch.no_grad():
        a = src_model(tokens, pos, mask)
        b = dst_model(tokens, pos, mask)
    assert torch.equal(a, b)

    # 2. Megatron's own save, read by our source.
    os.makedirs(f"{root}/theirs")
    dist_checkpointing.save(src_model.sharded_state_dict(prefix="model."), f"{root}/theirs")
    src = DistCheckpointSource.from_dir(f"{root}/theirs", strip_prefix="model.")
    want = {}
    for k, v in sd.items():
        parts = k.split(".")
        if parts[:2] == ["decoder", "layers"]:
            local = ".".join(parts[3:])
            want[f"decoder.layers.{parts[2]}.{LAYER_NAMES[local]}"] = v
        else:
            want[k] = v
    assert sorted(src.keys()) == sorted(want)
    for k, v in want.items():
        assert torch.equal(src.load(k), v), k
    assert sorted(src.extra_state_keys) == sorted(
        f"model.decoder.layers.{m}._extra_state/shard_{layer}_{L}" for m in MODULES for layer in range(L))
    dist.destroy_process_group()
    print("MEGATRON-COMPAT OK")


@pytest.mark.slow
def test_megatron_core_round_trip(tmp_path: Any) -> None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "MEGATRON-COMPAT OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]


if __name__ == "__main__":
    _worker(sys.argv[1])
