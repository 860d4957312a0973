"""Megatron-Core loads the Megatron-Bridge directory we write, and we read the Megatron-LM
training checkpoints it writes (model + optimizer state + RNG state + common.pt args) at
TP=1 and TP=2 (two gloo processes), back to an HF folder with transformers' logits equal.

Skipped unless ``megatron.core`` is importable (see tests/test_megatron_compat.py for how
to install it without touching the project venv). Megatron runs in subprocesses, so its
global process-group state never leaks into the test session. Megatron-Bridge itself is
not installable here (it needs the GPU stack): its acceptance of the directory is taken
from the measurements in /work/shared/reference/megatron-dirs.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

# found, not imported, at collection: importing megatron.core costs seconds (tests/conftest.py, test time)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="needs megatron.core")

SEQ = 16
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker(root: str, tp: int, rank: int) -> None:  # runs in a subprocess, one per TP rank
    import contextlib
    import dataclasses
    import random
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as fn
    import yaml
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    # CPU: RoPE asks for the current CUDA device, the async saver synchronises, attention
    # forks the CUDA RNG (dropout is 0): none of it is needed here.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg{tp}", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tp, 1)

    # The model, from the run_config.yaml fields we wrote.
    run_config = yaml.safe_load(open(f"{root}/mb/iter_0000000/run_config.yaml"))["model"]
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in run_config.items() if k in fields and not isinstance(v, dict)
          and k not in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "bf16", "fp16")}
    assert run_config["activation_func"]["_target_"] == "torch.nn.functional.silu"
    cfg = TransformerConfig(**kw, activation_func=fn.silu, tensor_model_parallel_size=tp,
                            use_cpu_initialization=True, params_dtype=torch.float32)
    model = GPTModel(cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=run_config["normalization"]),
                     vocab_size=run_config["vocab_size"], max_sequence_length=run_config["seq_length"],
                     position_embedding_type="rope", rotary_base=int(run_config["rotary_base"]),
                     share_embeddings_and_output_weights=run_config["share_embeddings_and_output_weights"],
                     parallel_output=False).eval()

    # 1. Megatron-Core loads our Megatron-Bridge directory (keys without ``model.``).
    loaded = dist_checkpointing.load(model.sharded_state_dict(), f"{root}/mb/iter_0000000")
    result = model.load_state_dict(loaded, strict=False)
    assert not [k for k in result.missing_keys if not k.endswith("_extra_state")], result.missing_keys
    # what load() adds from our common.pt (Megatron-Bridge's common state)
    assert set(result.unexpected_keys) <= {"checkpoint_version", "iteration", "content_metadata"}
    tokens = torch.load(f"{root}/tokens.pt")
    pos = torch.arange(SEQ)[None]
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)  # True = masked
    with torch.no_grad():
        logits = model(tokens, pos, mask)
    if rank == 0:
        torch.save(logits, f"{root}/mcore_logits_tp{tp}.pt")

    # 2. A Megatron-LM training checkpoint of that model: {'model': GPTModel.sharded_state_dict(),
    # 'optimizer': exp_avg / exp_avg_sq per parameter, 'rng_state': ShardedObject, + common state}.
    sd = model.sharded_state_dict()
    gen = torch.Generator().manual_seed(rank)
    opt: dict[str, Any] = {}
    for key, value in sd.items():
        if isinstance(value, ShardedTensor) and not key.endswith("_extra_state"):
            for moment in ("exp_avg", "exp_avg_sq"):
                data = torch.randn(value.data.shape, generator=gen)
                opt[f"{moment}.{key}"] = dataclasses.replace(value, key=f"optimizer.state.{moment}.{value.key}",
                                                             data=data)
    rng = ShardedObject("rng_state", [{"random_rng_state": random.getstate(), "torch_rng_state": torch.get_rng_state(),
                                       "rng_tracker_states": {}}], (1, tp), (0, rank), replica_id=0)
    # The args of a real run: what Megatron-LM core_v0.16.1's own parse_args + validate_args
    # made for this tiny Llama (tests/data/megatron_lm_args/make_args.py), with the fields
    # this run's command line would set differently (TP, its tokenizer folder, fp32).
    with open(f"{REPO}/tests/data/megatron_lm_args/core_v0.16.1.common.pt", "rb") as f:
        args = torch.load(f, weights_only=False)["args"]  # holds AttnBackend, ModelType, signal.Signals
    args.tensor_model_parallel_size, args.world_size = tp, tp
    args.tokenizer_model, args.vocab_size, args.padded_vocab_size = f"{root}/tok", None, run_config["vocab_size"]
    args.bf16, args.params_dtype = False, torch.float32
    state = {
        "model": sd, "optimizer": {"state": opt, "param_groups": [{"lr": 0.0, "wd_mult": 1.0}, {"lr": 0.0, "wd_mult": 0.0}]},
        "rng_state": rng, "args": args, "checkpoint_version": 3.0, "iteration": 100,
        "opt_param_scheduler": {"max_lr": 3e-4, "lr_warmup_steps": 0, "num_steps": 100, "lr_decay_style": "cosine"},
        "num_floating_point_operations_so_far": 0.0,
    }
    ckpt = f"{root}/mlm_tp{tp}"
    if rank == 0:
        os.makedirs(f"{ckpt}/iter_0000100")
    dist.barrier()
    dist_checkpointing.save(state, f"{ckpt}/iter_0000100")
    if rank == 0:
        with open(f"{ckpt}/latest_checkpointed_iteration.txt", "w") as f:
            f.write("100")
    dist.barrier()
    dist.destroy_process_group()
    print("MCORE-WORKER OK")


def _run_workers(root: str, tp: int) -> None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), root, str(tp), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(tp)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "MCORE-WORKER OK" in out, out[-3000:] + err[-6000:]


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_core_reads_ours_and_we_read_megatron_lm(tmp_path: Any, tiny_llama: Any, tp: int) -> None:
    import torch
    from tiny_models import hf_tensors
    from transformers import LlamaForCausalLM

    from nemo_convert import api

    root = str(tmp_path)
    src = tiny_llama()
    os.rename(src, f"{root}/hf")
    src = f"{root}/hf"
    api.import_hf(src, f"{root}/mb", to="megatron-bridge", parallel=api.Parallelism(tp, 1))
    os.makedirs(f"{root}/tok")  # the run's HF tokenizer: 320 ids (tokenizer.json only, as far as we read it)
    with open(f"{root}/tok/tokenizer.json", "w") as f:
        json.dump({"model": {"vocab": {f"t{i}": i for i in range(320)}}, "added_tokens": []}, f)
    tokens = torch.randint(0, 320, (1, SEQ), generator=torch.Generator().manual_seed(0))
    torch.save(tokens, f"{root}/tokens.pt")
    with torch.no_grad():
        want = LlamaForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()(tokens).logits
    _run_workers(root, tp)

    mcore = torch.load(f"{root}/mcore_logits_tp{tp}.pt")
    mcore = mcore if mcore.shape == want.shape else mcore.transpose(0, 1)
    delta_mb = (mcore - want).abs().max().item()
    assert delta_mb <= 1e-5, delta_mb

    mlm = f"{root}/mlm_tp{tp}"
    info = api.inspect_checkpoint(mlm)
    assert info["format"] == "megatron-lm" and info["family"] == "llama"
    assert any(n.startswith("dropped ") and "optimizer.*" in n for n in info["notes"]), info["notes"]
    assert any("rng_state" in n for n in info["notes"]), info["notes"]
    back = f"{root}/back"
    rep = api.export_hf(mlm, back)
    assert not rep.warnings, rep.warnings  # the vocabulary came from the run's tokenizer
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    with torch.no_grad():
        got = LlamaForCausalLM.from_pretrained(back, torch_dtype=torch.float32).eval()(tokens).logits
    delta = (got - want).abs().max().item()
    assert delta <= 1e-5, delta
    print(f"TP={tp}: max|dlogit| Megatron-Core on our directory vs HF = {delta_mb:.3g}; "
          f"HF export of Megatron-LM's save vs HF = {delta:.3g}")


def _family_worker(root: str) -> None:
    """Megatron-Core 0.16 builds a GPTModel from our run_config.yaml ``model:`` fields alone
    (the activation imported from its ``_target_``), loads our directory and runs the ids.
    Shims as in tests/test_family_megatron.py: the sliding-window mask on the CPU, and for
    GemmaModelProvider what its provide() and Transformer Engine's norm add to the local
    spec (embedding × sqrt(hidden), Megatron-Bridge gemma/modules.py lines 27-40; the
    zero-centred norm's 1 + w, Gemma's RMSNorm and Nemotron's LayerNorm alike); for
    Gemma3ModelProvider its fields as that class reads them, and shims for its post-norms and
    its two RoPEs (comments below)."""
    import contextlib
    import dataclasses
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import yaml
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()

    def cpu_window_mask(sq: int, skv: int, window: Any) -> torch.Tensor:  # upstream's formula, on the CPU
        m = torch.ones(sq, skv, dtype=torch.bool)
        return ~torch.tril(torch.triu(m, diagonal=skv - sq - window[0]), diagonal=skv - sq + window[1])

    fused_softmax.get_sliding_window_causal_mask = cpu_window_mask
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    m = yaml.safe_load(open(f"{root}/mb/iter_0000000/run_config.yaml"))["model"]
    module, name = m["activation_func"]["_target_"].rsplit(".", 1)
    act = getattr(importlib.import_module(module), name)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    cpu = ("bias_activation_fusion", "masked_softmax_fusion", "bias_dropout_fusion", "persist_layer_norm",
           "gradient_accumulation_fusion", "apply_rope_fusion", "attention_softmax_in_fp32")  # set for the CPU below
    kw = {k: v for k, v in m.items() if k in fields and not isinstance(v, dict) and k not in (
        "bf16", "fp16", "layernorm_zero_centered_gamma", "window_size", *cpu)}  # the local spec's norm: shim below
    if m.get("num_moe_experts"):
        # the CPU settings of tests/test_family_megatron.py: SequentialMLP (no grouped GEMM
        # or permute fusion, both Transformer Engine's), the all-gather dispatcher, no
        # load balancing (training only), fp32 routing; the routing math stays run_config's
        from megatron.core.transformer.moe import moe_utils

        moe_utils.te_general_gemm = None  # shim: without Transformer Engine the name is unbound
        kw.update(moe_grouped_gemm=False, moe_permute_fusion=False, moe_token_dispatcher_type="allgather",
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_router_dtype="fp32",
                  moe_shared_expert_overlap=False)  # overlap needs the all-to-all dispatcher
    config_class: Any = TransformerConfig
    mla = bool(m.get("multi_latent_attention"))
    if mla:
        # MLAModelProvider's fields (rope_type yarn at factor 1 = plain RoPE) as written; shims
        # as tests/test_family_matrix's MLA run: the local core attention does not take MLA's
        # head dims, and MLA believes it has Transformer Engine
        from megatron.core.transformer import multi_latent_attention as mla_module
        from megatron.core.transformer.dot_product_attention import DotProductAttention
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        dpa_init = DotProductAttention.__init__

        def init(self: Any, *a: Any, k_channels: Any = None, v_channels: Any = None, **k: Any) -> None:
            dpa_init(self, *a, **k)

        DotProductAttention.__init__ = init  # type: ignore[method-assign]
        mla_module.HAVE_TE = False
        config_class = MLATransformerConfig
        # shim: the local core attention sizes its output by kv_channels where Transformer
        # Engine's takes MLA's v_channels (MLAModelProvider's kv_channels = HF head_dim =
        # qk_rope_head_dim is otherwise unread)
        kw["kv_channels"] = m["v_head_dim"]
        kw.update({k: m[k] for k in ("rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim", "q_lora_rank",
                                     "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                                     "original_max_position_embeddings", "beta_fast", "beta_slow") if k in m})
    gemma3 = m["_target_"].endswith(".Gemma3ModelProvider")
    window = tuple(m["window_size"]) if m.get("window_size") and not gemma3 else None
    rotary_base = m["rotary_base"]
    if gemma3:
        # Gemma3ModelProvider's own fields, as its code reads them (Megatron-Bridge 067f987d
        # gemma/gemma3_provider.py): 1-based layer n is local when (n - 1) % (local + global) <
        # local, or when its listed kind is sliding_attention (lines 349-357); a local layer's
        # window is (window_size - 1, 0), a global one has none (lines 241-255): here Megatron-Core's
        # own per-layer window list. rotary_base is (local, global) (lines 113-117)
        pattern, layers = m["interleaved_attn_pattern"], int(m["num_layers"])
        if isinstance(pattern[0], str):
            local = [kind == "sliding_attention" for kind in pattern]
        else:
            local = [(n - 1) % (pattern[0] + pattern[1]) < pattern[0] for n in range(1, layers + 1)]
        window = (int(m["window_size"]) - 1, 0) if any(local) else None
        kw["window_attn_skip_freq"] = [int(x) for x in local]
        local_base, rotary_base = m["rotary_base"]
    tc = config_class(**kw, activation_func=act, window_size=window, use_cpu_initialization=True, params_dtype=torch.float32,
                           bias_activation_fusion=False, masked_softmax_fusion=False, bias_dropout_fusion=False,
                           persist_layer_norm=False, gradient_accumulation_fusion=False, apply_rope_fusion=False,
                           attention_softmax_in_fp32=True)
    for k, v in m.items():  # GPTModel's YaRN fields (GPTModelProvider's; gpt_model.py lines 172-191 read them)
        if k.startswith("yarn_"):
            setattr(tc, k, v)
    spec: Any = get_gpt_layer_local_spec(normalization=m["normalization"], qk_layernorm=bool(m.get("qk_layernorm")))
    if m.get("num_moe_experts"):
        # shim (as tests/test_family_megatron.py): the local spec saves an MoE layer's norm
        # under the dense key map's ``mlp.linear_fc1.layer_norm_weight``; Transformer Engine's
        # MoE spec (what Megatron-Bridge runs) keeps ``pre_mlp_layernorm.weight``
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
        from megatron.core.transformer.moe.moe_layer import MoELayer
        from megatron.core.transformer.spec_utils import ModuleSpec

        spec = get_gpt_decoder_block_spec(tc, use_transformer_engine=False, normalization=m["normalization"])
        for i, layer in enumerate(spec.layer_specs):
            is_moe = isinstance(layer.submodules.mlp, ModuleSpec) and layer.submodules.mlp.module is MoELayer
            keys = dict(layer.submodules.sharded_state_dict_keys_map)
            if is_moe:
                keys.pop("pre_mlp_layernorm.", None)
            if mla:  # Transformer Engine's MLA keys (the local MLA spec has no key map)
                keys.update({"self_attention.q_layernorm.": "self_attention.linear_q_up_proj.layer_norm_",
                             "self_attention.kv_layernorm.": "self_attention.linear_kv_up_proj.layer_norm_"})
                if not is_moe:
                    keys["pre_mlp_layernorm."] = "mlp.linear_fc1.layer_norm_"
            spec.layer_specs[i] = dataclasses.replace(layer, submodules=dataclasses.replace(
                layer.submodules, sharded_state_dict_keys_map=keys))
    mtp_spec = None
    if m.get("mtp_num_layers"):  # DeepSeek-V3's MTP block: the last layer's spec, as Megatron-Core builds it
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        mtp_spec = get_gpt_mtp_block_spec(tc, spec, use_transformer_engine=False)
    model = GPTModel(tc, transformer_layer_spec=spec,
                     vocab_size=m["vocab_size"], max_sequence_length=m["seq_length"],
                     position_embedding_type=m.get("position_embedding_type", "rope"),
                     rotary_base=int(rotary_base), rotary_percent=float(m.get("rotary_percent", 1.0)),
                     share_embeddings_and_output_weights=m["share_embeddings_and_output_weights"],
                     parallel_output=False, mtp_block_spec=mtp_spec).eval()
    if gemma3:
        # shim: the class's layer spec normalises linear_proj's and linear_fc2's output
        # (TERowParallelLinearLayerNorm, lines 157, 165), saved as their post_layernorm.weight
        def post_norm(linear: Any) -> None:
            linear.post_layernorm = torch.nn.RMSNorm(m["hidden_size"], eps=m["layernorm_epsilon"])
            inner = linear.forward

            def forward(*a: Any, **k: Any) -> Any:
                out, bias = inner(*a, **k)
                return linear.post_layernorm(out), bias

            linear.forward = forward

        for layer in model.decoder.layers:
            post_norm(layer.self_attention.linear_proj)
            post_norm(layer.mlp.linear_fc2)
    loaded = dist_checkpointing.load(model.sharded_state_dict(), f"{root}/mb/iter_0000000")
    result = model.load_state_dict(loaded, strict=False)
    assert not [k for k in result.missing_keys if not k.endswith("_extra_state")], result.missing_keys
    if m.get("layernorm_zero_centered_gamma"):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("layernorm.weight") or n.endswith("layer_norm_weight"):
                    p.add_(1.0)
    if gemma3:
        # shim: Gemma3RotaryEmbedding divides the global inv_freq by rope_scaling_factor (line 309)
        # and rotates the local layers with a second RoPE of the local base (lines 311-316),
        # which Gemma3SelfAttention picks for them (lines 200-207)
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        model.rotary_pos_emb.inv_freq /= float(m["rope_scaling_factor"])
        local_rope = RotaryEmbedding(kv_channels=tc.kv_channels, rotary_percent=1.0, rotary_base=local_base,
                                     use_cpu_initialization=True)
        for layer in model.decoder.layers:
            if local[layer.layer_number - 1]:
                def rotate_locally(*a: Any, rotary_pos_emb: Any = None, _inner: Any = layer.self_attention.forward,
                                   **k: Any) -> Any:
                    return _inner(*a, rotary_pos_emb=local_rope(rotary_pos_emb.shape[0]), **k)

                layer.self_attention.forward = rotate_locally
    if m["_target_"].endswith((".GemmaModelProvider", ".Gemma3ModelProvider")):
        embed = model.embedding.forward
        scale = torch.tensor(m["hidden_size"] ** 0.5)
        model.embedding.forward = lambda *a, **k: embed(*a, **k) * scale  # type: ignore[method-assign]
    want = torch.load(f"{root}/want.pt")
    n = want["ids"].shape[1]
    mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)
    heads: list[torch.Tensor] = []  # with MTP (as tests/test_family_megatron.py): the MTP head, then the main one
    hook = model.output_layer.register_forward_hook(lambda mod, i, o: heads.append(o[0].transpose(0, 1).clone()))
    with torch.no_grad():
        got = model(want["ids"], torch.arange(n)[None], mask, **({"labels": want["ids"]} if mtp_spec else {}))
    hook.remove()
    if mtp_spec is not None:
        got = heads[-1]
    delta = (got.float() - want["logits"].float()).abs().max().item()
    print(f"MCORE-FAMILY {m['_target_'].rsplit('.', 1)[-1]} max|dlogit| = {delta:.3g}")
    if mtp_spec is not None:
        mtp_delta = (heads[0][:, :-1].float() - want["mtp_logits"][:, :-1].float()).abs().max().item()
        print(f"MCORE-FAMILY {m['_target_'].rsplit('.', 1)[-1]} MTP max|dlogit| = {mtp_delta:.3g}")
        delta = max(delta, mtp_delta)
    dist.destroy_process_group()
    assert delta < 1e-4, delta
    print("MCORE-WORKER OK")


@pytest.mark.slow
@pytest.mark.parametrize("family, over", [
    ("llama", {}), ("mistral", {}), ("qwen2", {}), ("qwen3", {}), ("gemma", {}), ("qwen3_moe", {}),
    ("qwen3_moe", dict(num_hidden_layers=3, mlp_only_layers=[1])),  # moe_layer_freq [1, 0, 1]
    ("deepseek_v3", {}),  # MLAModelProvider: MLA, moe_layer_freq [0, 1, 1, 1], sigmoid + expert bias, shared
    ("nemotron", dict(attention_bias=False, mlp_bias=False)),  # LayerNorm 1p, squared ReLU, half rotary, GQA
    ("gpt_oss", {}),  # GPTModelProvider with sinks, window pattern, clamped quick-GELU GLU, biases, ETP 1
    # Gemma3ModelProvider: softmax_scale, (local, global) bases with the global factor, the int window on the
    # local layers of interleaved_attn_pattern [1, 1], then [5, 1] (gemma-3's six layers, the sixth global)
    ("gemma3", {}), ("gemma3", dict(num_hidden_layers=6, sliding_window_pattern=6)),
])
def test_megatron_core_runs_our_directory_for_each_family(tmp_path: Any, family: str, over: dict[str, Any]) -> None:
    import torch
    from test_family_matrix import IDS, logits, make_model

    from nemo_convert import api

    root = str(tmp_path)
    src = make_model(f"{root}/hf", family, **over)
    api.import_hf(src, f"{root}/mb", to="megatron-bridge")
    want = {"ids": IDS, "logits": logits(src)}
    if family == "deepseek_v3":  # its MTP layer: transformers' own MTP module gives the MTP logits
        from test_family_megatron import _mtp_logits

        want["mtp_logits"] = _mtp_logits(src, IDS)
    torch.save(want, f"{root}/want.pt")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), root, "family"], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "MCORE-WORKER OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(family, [ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE-FAMILY")][0])


if __name__ == "__main__":
    if sys.argv[2] == "family":
        _family_worker(sys.argv[1])
    else:
        _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
