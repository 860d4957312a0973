"""Megatron-Core's own Mamba kernels on a GPU: what ``tests/test_nemotron_h_megatron.py``
checks on the CPU with the selective scan and the gated RMSNorm stood in, run here with
Megatron-Core's production layer spec (``models/mamba/mamba_layer_specs.py``
``mamba_stack_spec``: Transformer Engine linears and norms, ``mamba_ssm``'s Triton
``mamba_chunk_scan_combined`` and ``RMSNormGated``, ``causal_conv1d``).

Not a pytest module (its name does not start with ``test_``): run it in one go on a machine
with a CUDA device and ``megatron-core==0.16.1``, ``transformer_engine``, ``mamba_ssm``,
``causal_conv1d``, ``einops`` and ``transformers==5.24`` installed::

    python tests/gpu/nemotron_h_mcore.py                # TP=1, then TP=2 when two GPUs exist
    python tests/gpu/nemotron_h_mcore.py --tp 1 --keep /tmp/out

For each tiny model of ``tests/tiny_hybrid.py`` (the dense Nemotron-H-8B and the MoE
Nemotron-3 Nano configs, shrunk in size only) it imports the HF checkpoint to a dist
``.nemo``, builds ``MambaModel`` from the NeMo config we wrote, loads the checkpoint with
Megatron-Core's default strictness, and compares its logits (fp32 parameters) with
transformers'; then the negative control (``in_proj``'s ``z`` and ``x`` exchanged) must move
them. It prints one line per run and exits non-zero on any failure. Tolerance: 2e-3 (the
Triton scan and the PyTorch reference sum in different orders; the CPU test measures 5e-7
with one implementation on both sides).

transformers 5.24 clamps ``dt`` below at ``time_step_min`` where Megatron-Core does not clamp
it (docs/families/nemotron_h.md); the tiny models' ``dt_bias`` keep every ``dt`` far above it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, os.path.dirname(TESTS)]

TOLERANCE = 2e-3


def _rank(rank: int, nemo: str, want_path: str, root: str, tp: int) -> None:
    import torch
    import torch.distributed as dist
    import yaml
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.mamba import MambaModel
    from megatron.core.models.mamba.mamba_layer_specs import mamba_stack_spec
    from megatron.core.ssm.mamba_mixer import MambaMixer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig
    from tiny_hybrid import megatron_config

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{root}/pg", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tp, 1)
    model_parallel_cuda_manual_seed(0)
    with open(os.path.join(nemo, "model_config.yaml")) as f:
        cfg = yaml.safe_load(f)
    tc = TransformerConfig(**megatron_config(cfg, tp=tp, params_dtype=torch.float32,
                                             moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True))
    model = MambaModel(tc, mamba_stack_spec, vocab_size=cfg["nemo_convert"]["vocab_size"],
                       max_sequence_length=cfg["encoder_seq_length"],
                       hybrid_override_pattern=cfg["hybrid_override_pattern"],
                       share_embeddings_and_output_weights=cfg["share_embeddings_and_output_weights"],
                       parallel_output=False).cuda()
    loaded = dist_checkpointing.load(model.sharded_state_dict(prefix="model."), os.path.join(nemo, "model_weights"))
    model.load_state_dict({k[len("model."):]: v for k, v in loaded.items()}, strict=False)
    model.eval()
    want = torch.load(want_path)
    ids = want["ids"].cuda()
    n = ids.shape[1]

    def delta() -> float:
        with torch.no_grad():
            got = model(ids, torch.arange(n, device="cuda")[None], None)
        return (got.float().cpu() - want["logits"].float()).abs().max().item()

    d = delta()
    mixer = next(m for m in model.modules() if isinstance(m, MambaMixer))
    w, inner = mixer.in_proj.weight, mixer.d_inner_local_tp
    with torch.no_grad():
        saved = w.detach().clone()
        w[: 2 * inner] = torch.cat([saved[inner: 2 * inner], saved[:inner]])
        swapped = delta()
        w.copy_(saved)
    print(f"GPU MCORE TP={tp} rank {rank}: max|dlogit| = {d:.3g}; negative control (z, x exchanged) {swapped:.3g}",
          flush=True)
    dist.destroy_process_group()
    if not (d < TOLERANCE and swapped > 10 * TOLERANCE):
        raise SystemExit(1)


def run(name: str, tp: int, work: str) -> bool:
    import torch
    import torch.multiprocessing as mp
    from test_nemotron_h import IDS, logits
    from tiny_hybrid import make_nemotron_h

    from nemo_convert import api

    root = os.path.join(work, f"{name}-tp{tp}")
    os.makedirs(root, exist_ok=True)
    src = make_nemotron_h(os.path.join(root, "hf"), name)
    nemo = os.path.join(root, "m")
    api.import_hf(src, nemo, packed=False, layout="dist", overwrite=True)
    want = os.path.join(root, "want.pt")
    torch.save({"ids": IDS, "logits": logits(src)}, want)
    try:
        mp.spawn(_rank, args=(nemo, want, root, tp), nprocs=tp)
    except Exception as exc:  # a rank failed (its line says why)
        print(f"GPU MCORE {name} TP={tp}: FAILED ({type(exc).__name__})", flush=True)
        return False
    print(f"GPU MCORE {name} TP={tp}: OK", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="*", help="tensor-parallel sizes (default: 1, and 2 with 2 GPUs)")
    parser.add_argument("--keep", help="work folder to keep (default: a temporary one)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs Megatron-Core's GPU kernels (the CPU check is "
              "tests/test_nemotron_h_megatron.py)")
        return 2
    for module in ("mamba_ssm", "causal_conv1d", "transformer_engine", "einops"):
        try:
            __import__(module)
        except ImportError:
            print(f"{module} is not installed: Megatron-Core's mamba_stack_spec needs it")
            return 2
    from tiny_hybrid import CONFIGS

    tps = args.tp or ([1, 2] if torch.cuda.device_count() >= 2 else [1])
    work = args.keep or tempfile.mkdtemp(prefix="nemotron_h_gpu_")
    ok = all([run(name, tp, work) for name in CONFIGS for tp in tps])
    print("GPU MCORE NEMOTRON-H: " + ("every run matched" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
