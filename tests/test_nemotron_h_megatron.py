"""Megatron-Core 0.16.1 builds its own hybrid ``MambaModel`` from the NeMo config we wrote,
on the CPU (gloo, in subprocesses like ``tests/test_family_megatron.py``), and:

* its ``sharded_state_dict()`` asks for exactly our keys and global shapes (the mixer's
  section keys from its ``_split_tensor_factory`` included) at TP=1, TP=2 and EP=2, and
  every extra state it asks for is in our checkpoint;
* at TP=2 every rank-local parameter it loads from our dist checkpoint is our
  ``TensorParallel.split`` of the global tensor (``Sections`` for ``in_proj`` / ``conv1d``),
  slice by slice — and a contiguous column split of ``in_proj`` is not;
* its logits equal transformers' (``NemotronHForCausalLM``) at TP=1, TP=2 and, for the
  MoE model, EP=2; two negative controls (``in_proj``'s ``z`` and ``x`` sections exchanged;
  at TP=2 a contiguous split) move them by far more than the tolerance;
* what it saves at TP=2 (its own sharding, its own section keys) exports to the HF source,
  bit-exact.

**What runs here is not all of Megatron-Core's Mamba path.** Its mixer needs the
``mamba_ssm`` and ``causal_conv1d`` CUDA/Triton kernels, which do not run on a CPU. The
test stands in for exactly three things, and says so:

* the selective-scan kernel ``mamba_chunk_scan_combined`` is transformers 5.24's PyTorch
  reference of it (``models/nemotron_h/modeling_nemotron_h.py`` ``mamba2_chunk_scan``, the
  same signature; called without ``dt_limit`` as Megatron-Core calls it);
* the gated RMSNorm (``mamba_ssm``'s ``RMSNormGated``, ``norm_before_gate=False``) is a
  few lines below, with Megatron-Core's own ``sharded_state_dict`` axis (``{"weight": 0}``,
  ``ExtendedRMSNorm``, ``mamba_mixer.py`` lines 88–100);
* the dynamic-inference Triton helpers ``mamba_mixer.py`` imports at module level (never
  called in a forward pass without an inference context) are absent stubs.

Everything else is Megatron-Core's: ``MambaModel``, ``MambaStack`` (per-layer keys, the
pattern), ``MambaLayer``, ``MambaMixer`` (the in_proj split into z/xBC/dt, the depthwise
``nn.Conv1d`` path taken when ``causal_conv1d`` is absent, ``A = -exp(A_log)``, ``D``,
``dt_bias``, the TP-local head/group counts), attention, MLP, MoE router and experts, and the
dist-checkpoint load. The local layer spec replaces Transformer Engine's modules with
Megatron-Core's own (its key maps give TE's fused-norm names). On a GPU,
``tests/gpu/nemotron_h_mcore.py`` runs the real kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("einops")

TOLERANCE = 1e-4  # measured: ~5e-7; the negative controls: 0.1 and more

def mcore_keys_record(asked: dict[str, Any]) -> dict[str, Any]:
    """The record of ``tiny_hybrid.MCORE_KEYS`` from ``{key: global shape, or None for an extra state}``."""
    return {"megatron_core": "0.16.1", "tensors": {k: list(s) for k, s in sorted(asked.items()) if s is not None},
            "extra_states": sorted(k for k, s in asked.items() if s is None)}


def _standins() -> None:
    """The three stand-ins of the module docstring (called before Megatron-Core's mixer
    module is imported)."""
    import types

    name = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"
    ops = types.ModuleType(name)

    def _not_here(*a: Any, **k: Any) -> None:
        raise RuntimeError("stand-in: Megatron-Core's dynamic-inference Triton helpers do not run on a CPU")

    ops.tensor_get_slice_after = ops.tensor_masked_update = ops.tensor_merge = _not_here  # type: ignore[attr-defined]
    sys.modules[name] = ops


def _rank(rank: int, nemo: str, hf: str, root: str, tp: int, ep: int, save_to: str) -> None:  # subprocess
    import contextlib
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as fn
    import yaml

    _standins()
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, ShardedTensorFactory
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.mamba import MambaModel
    from megatron.core.ssm import mamba_block, mamba_mixer
    from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
    from tiny_hybrid import MCORE_KEYS, megatron_config
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    from nemo_convert import api
    from nemo_convert.mapping.planner import nemo_parallel_kinds
    from nemo_convert.mapping.rules import Parallel
    from nemo_convert.sharding.tensor import TensorParallel

    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    moe_utils.te_general_gemm = None  # shim: without Transformer Engine the name is unbound (the torch.mm path)

    class GatedRMSNorm(nn.Module):
        """Stand-in for mamba_ssm's RMSNormGated: rmsnorm(y · silu(z)) over groups, times w."""

        def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                     norm_before_gate: bool = False, device: Any = None, dtype: Any = None) -> None:
            super().__init__()
            assert not norm_before_gate
            self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
            self.eps, self.group_size = eps, group_size or hidden_size

        def forward(self, y: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
            x = y.float() * (fn.silu(z.float()) if z is not None else 1.0)
            g = x.view(*x.shape[:-1], -1, self.group_size)
            g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
            return (g.view(x.shape) * self.weight.float()).to(y.dtype)

        def sharded_state_dict(self, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None) -> Any:
            return make_sharded_tensors_for_checkpoint(
                self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0}, sharded_offsets,
                tp_group=parallel_state.get_tensor_model_parallel_group(), dp_cp_group=metadata["dp_cp_group"])

    mamba_mixer.ExtendedRMSNorm = GatedRMSNorm  # type: ignore[misc,assignment]
    mamba_mixer.HAVE_MAMBA_SSM = True
    mamba_mixer.mamba_chunk_scan_combined = mamba2_chunk_scan  # type: ignore[attr-defined]
    mamba_block.TENorm = WrappedTorchNorm  # the final norm: Megatron-Core's own RMSNorm instead of TE's

    with open(os.path.join(nemo, "model_config.yaml")) as f:
        cfg = yaml.safe_load(f)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=tp * ep)
    parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep)
    experts = cfg.get("num_moe_experts")
    tc = TransformerConfig(**megatron_config(
        cfg, tp=tp, ep=ep, use_cpu_initialization=True, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, moe_token_dispatcher_type="allgather", moe_grouped_gemm=False,
        use_mamba_mem_eff_path=False))  # the prefill path (mamba_chunk_scan_combined), not the fused training kernel
    # The TE spec's modules (models/mamba/mamba_layer_specs.py) as Megatron-Core's local ones; the key maps
    # give the fused-norm names TE's TELayerNormColumnParallelLinear saves.
    spec = ModuleSpec(module=MambaStack, submodules=MambaStackSubmodules(
        mamba_layer=ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
            norm=WrappedTorchNorm, mamba_bda=get_bias_dropout_add,
            mixer=ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(
                in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)),
            sharded_state_dict_keys_map={"norm.": "mixer.in_proj.layer_norm_"})),
        attention_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm, self_attn_bda=get_bias_dropout_add,
            self_attention=ModuleSpec(module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                                      submodules=SelfAttentionSubmodules(linear_qkv=ColumnParallelLinear,
                                                                         core_attention=DotProductAttention,
                                                                         linear_proj=RowParallelLinear)),
            sharded_state_dict_keys_map={"input_layernorm.": "self_attention.linear_qkv.layer_norm_"})),
        mlp_layer=ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm, mlp_bda=get_bias_dropout_add,
            mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                                linear_fc2=RowParallelLinear)),
            sharded_state_dict_keys_map={"pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"})),
        moe_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm, mlp_bda=get_bias_dropout_add,
            mlp=get_moe_module_spec(use_te=False, num_experts=experts or 1, moe_grouped_gemm=False)))))
    model = MambaModel(tc, spec, vocab_size=cfg["nemo_convert"]["vocab_size"],
                       max_sequence_length=cfg["encoder_seq_length"],
                       hybrid_override_pattern=cfg["hybrid_override_pattern"],
                       share_embeddings_and_output_weights=cfg["share_embeddings_and_output_weights"],
                       parallel_output=False)
    bridge = os.environ.get("NEMOTRON_H_MCORE_BRIDGE_DIR")  # a Megatron-Bridge directory: its keys have no "model."
    ckpt, pfx = (os.path.join(bridge, "iter_0000000"), "") if bridge else (os.path.join(nemo, "model_weights"), "model.")
    sharded = model.sharded_state_dict(prefix=pfx)

    # 1. Megatron-Core's keys and global shapes are ours (the section keys from its own factory)
    theirs: dict[str, Any] = {}
    for v in nested_values(sharded):
        for t in (v.build() if isinstance(v, ShardedTensorFactory) else [v]):
            theirs[t.key] = None if isinstance(t, ShardedObject) else tuple(t.global_shape)
    ours = {k: tuple(v.global_shape) for k, v in dist_checkpointing.load_tensors_metadata(ckpt).items()}
    tensors = {k: s for k, s in theirs.items() if s is not None}
    assert tensors == ours, (sorted(set(tensors) ^ set(ours)),
                             {k: (tensors[k], ours[k]) for k in set(tensors) & set(ours) if tensors[k] != ours[k]})
    # the record of Megatron-Core's keys and global shapes that the normal suite checks ours against
    # (tests/test_nemotron_h.py): global, so the same at every TP and EP
    want = torch.load(os.path.join(root, "want.pt"))
    asked = mcore_keys_record({"model." + k[len(pfx):]: v for k, v in theirs.items()})
    if os.environ.get("NEMOTRON_H_WRITE_MCORE_KEYS") and not bridge:
        if rank == 0:
            with open(MCORE_KEYS.format(name=want["name"]), "w", encoding="utf-8") as f:
                json.dump(asked, f, indent=1, sort_keys=True)
                f.write("\n")
    else:
        with open(MCORE_KEYS.format(name=want["name"]), encoding="utf-8") as f:
            assert json.load(f) == asked, f"Megatron-Core asks for other keys than {MCORE_KEYS.format(name=want['name'])}"
    loaded, left_over, absent = dist_checkpointing.load(sharded, ckpt, strict=StrictHandling.RETURN_ALL)
    assert not absent, sorted(absent)  # every tensor and extra state it asks for is there
    # TE's spec has core_attention extra states the local spec does not ask for
    assert all(k.endswith("core_attention._extra_state") for k in left_over), sorted(left_over)
    # (a directory's common.pt — checkpoint_version, iteration — comes back beside the model's own keys)
    model.load_state_dict({k[len(pfx):]: v for k, v in loaded.items() if k in sharded}, strict=True)
    model.eval()
    print(f"MCORE TP={tp} EP={ep} rank {rank}{' (Megatron-Bridge directory)' if bridge else ''}: {len(tensors)} tensors and "
          f"{sum(s is None for s in theirs.values())} extra states, Megatron-Core's keys and shapes", flush=True)

    # 2. every rank-local tensor is our split of the global one (the experts' EP axis aside)
    split = TensorParallel()
    with api.open_checkpoint(nemo) as ck:
        family = api.get_registry().families["nemotron_h"].record
        kinds = nemo_parallel_kinds(family.mapping(ck.config), ck.config)
        compared = column_differs = 0
        for v in nested_values(model.sharded_state_dict(prefix="")):
            if not isinstance(v, (ShardedTensor, ShardedTensorFactory)) or ".experts." in v.key:
                continue
            name = v.key
            glob = ck.source.load(name)
            kind = kinds.get(name, Parallel.REPLICATED)
            mine = split.split(glob, kind, tp, parallel_state.get_tensor_model_parallel_rank())
            assert torch.equal(v.data.to(mine.dtype), mine), (name, kind)
            compared += 1
            if tp > 1 and name.endswith("mixer.in_proj.weight"):  # negative control: the column split is not it
                column = split.split(glob, Parallel.COLUMN, tp, parallel_state.get_tensor_model_parallel_rank())
                column_differs += not torch.equal(v.data.to(column.dtype), column)
        print(f"MCORE TP={tp} EP={ep} rank {rank}: {compared} local tensors equal our split"
              + (f"; a contiguous column split of in_proj differs on {column_differs} layer(s)" if tp > 1 else ""),
              flush=True)
        assert tp == 1 or column_differs > 0

    if save_to:  # Megatron-Core writes the model back, as it shards it
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
        args_path = os.environ.get("NEMOTRON_H_MLM_ARGS")
        if args_path:  # as a Megatron-LM training run saves it: {'model': sharded_state_dict(), 'args': ...}
            with open(args_path, "rb") as f:  # a real run's args (tests/data/megatron_lm_args/make_args.py)
                args = torch.load(f, weights_only=False)["args"]
            # what this run's command line would set otherwise: its parallelism, fp32 parameters
            args.tensor_model_parallel_size, args.expert_model_parallel_size, args.world_size = tp, ep, tp * ep
            args.bf16, args.params_dtype = False, torch.float32
            it = os.path.join(save_to, "iter_0000100")
            if rank == 0:
                os.makedirs(it)
            dist.barrier()
            dist_checkpointing.save({"model": model.sharded_state_dict(), "args": args, "checkpoint_version": 3.0,
                                     "iteration": 100}, it)
            if rank == 0:
                with open(os.path.join(save_to, "latest_checkpointed_iteration.txt"), "w") as f:
                    f.write("100")
        else:
            dist_checkpointing.save(model.sharded_state_dict(prefix="model."), save_to)

    # 3. logits: transformers' on the same ids; then the negative controls
    model.float()
    ids, n = want["ids"], want["ids"].shape[1]
    mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)

    def delta() -> float:
        with torch.no_grad():
            got = model(ids, torch.arange(n)[None], mask)
        return (got.float() - want["logits"].float()).abs().max().item()

    d = delta()
    print(f"MCORE TP={tp} EP={ep} rank {rank} max|dlogit| = {d:.3g}", flush=True)
    assert d < TOLERANCE, d
    mixer = next(m for m in model.modules() if isinstance(m, MambaMixer))
    w = mixer.in_proj.weight
    inner = mixer.d_inner_local_tp
    with torch.no_grad():
        saved = w.detach().clone()
        w[: 2 * inner] = torch.cat([saved[inner: 2 * inner], saved[:inner]])  # z and x exchanged
        swapped = delta()
        w.copy_(saved)
    print(f"MCORE TP={tp} EP={ep} rank {rank} negative control (z, x exchanged): max|dlogit| = {swapped:.3g}",
          flush=True)
    assert swapped > 100 * TOLERANCE, swapped
    dist.destroy_process_group()
    if tp * ep == 1:
        print("MCORE-PARITY OK")


def _worker(nemo: str, hf: str, root: str, tp: str, ep: str, save_to: str) -> None:  # subprocess
    if int(tp) * int(ep) == 1:
        _rank(0, nemo, hf, root, 1, 1, save_to)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_rank, args=(nemo, hf, root, int(tp), int(ep), save_to), nprocs=int(tp) * int(ep))
        print(f"MCORE TP={tp} EP={ep}: every rank matched")
        print("MCORE-PARITY OK")


def _run(tmp_path: Any, name: str, tp: int = 1, ep: int = 1, save_to: str = "",
         bridge: bool = False) -> subprocess.CompletedProcess[str]:
    import torch
    from test_family_matrix import IDS, logits
    from tiny_hybrid import make_nemotron_h

    from nemo_convert import api

    src = make_nemotron_h(str(tmp_path / "hf"), name)
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False, layout="dist")
    torch.save({"ids": IDS, "logits": logits(src), "name": name}, str(tmp_path / "want.pt"))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, tests, os.environ.get("PYTHONPATH", "")]))
    if bridge:  # the same model written as a Megatron-Bridge directory (--to megatron-bridge): loaded from there
        env["NEMOTRON_H_MCORE_BRIDGE_DIR"] = str(tmp_path / "mb")
        api.import_hf(src, env["NEMOTRON_H_MCORE_BRIDGE_DIR"], to="megatron-bridge")
    return subprocess.run([sys.executable, os.path.abspath(__file__), nemo, src, str(tmp_path), str(tp), str(ep),
                           save_to], env=env, capture_output=True, text=True, timeout=900, check=False)


def exports_widened_source(hf: str, back: str) -> None:
    """``back`` (an export of what Megatron-Core saved in fp32) holds the HF source ``hf``'s
    tensors, each its bf16 value widened to fp32, and no other."""
    import torch
    from tiny_models import hf_tensors

    src, got = hf_tensors(hf), hf_tensors(back)
    assert set(src) == set(got), set(src) ^ set(got)
    for k, v in src.items():
        assert got[k].dtype == torch.float32 and torch.equal(got[k], v.float()), k


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
@pytest.mark.parametrize("name, tp, ep", [("nemotron_h_8b", 1, 1), ("nemotron_h_8b", 2, 1),
                                          ("nemotron_3_nano", 1, 1), ("nemotron_3_nano", 2, 1),
                                          ("nemotron_3_nano", 1, 2)])
def test_megatron_core_mamba_model_loads_our_checkpoint_with_hf_logits(tmp_path: Any, name: str, tp: int,
                                                                       ep: int) -> None:
    _ok(_run(tmp_path, name, tp, ep))


@pytest.mark.slow
@pytest.mark.parametrize("name, tp", [("nemotron_h_8b", 1), ("nemotron_3_nano", 2)])
def test_megatron_core_mamba_model_loads_our_megatron_bridge_directory(tmp_path: Any, name: str, tp: int) -> None:
    """The Megatron-Bridge directory's ``iter_0000000/`` (keys without ``model.``) loads into
    Megatron-Core 0.16.1's ``MambaModel`` (``sharded_state_dict(prefix="")``), strictly, with
    transformers' logits; the negative control as above."""
    _ok(_run(tmp_path, name, tp, bridge=True))


@pytest.mark.slow
def test_what_megatron_core_saves_at_tp2_exports_to_hf(tmp_path: Any) -> None:
    """The other way: Megatron-Core saves the loaded MambaModel at TP=2 with its own section
    keys and sharding; our reader joins the sections and the export is the HF source (its
    parameters are fp32 here: the bf16 source's values, widened)."""
    import shutil

    from tiny_models import read_json

    from nemo_convert import api

    saved = str(tmp_path / "mcore")
    os.makedirs(saved)
    _ok(_run(tmp_path, "nemotron_3_nano", tp=2, save_to=saved))
    nemo = str(tmp_path / "m")
    weights = os.path.join(nemo, "model_weights")
    shutil.rmtree(weights)
    shutil.copytree(saved, weights)
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    exports_widened_source(str(tmp_path / "hf"), back)
    assert read_json(os.path.join(back, "config.json")) == read_json(os.path.join(str(tmp_path / "hf"), "config.json"))


if __name__ == "__main__":
    _worker(*sys.argv[1:7])
