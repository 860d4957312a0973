"""Megatron-Core runs what we write, for every GPT-base family: the dist ``.nemo`` of a tiny
random HF model is loaded into Megatron-Core 0.16's own ``GPTModel`` (local layer spec,
CPU, gloo, in a subprocess like ``tests/test_megatron_compat.py``), configured from the
NeMo config we wrote, and its logits are compared with transformers'.

Test-side shims (no math of ours): Megatron-Core 0.16.1 builds the sliding-window mask
with ``device="cuda"`` (rebuilt here on the CPU, same formula); its local spec has no
zero-centred RMSNorm and its ``GPTModel`` does not scale embeddings — both are Gemma
features that NeMo's Gemma model (Transformer Engine's norm, NeMo's embedding mixin)
provides — so for Gemma the loaded norms get ``+1`` in memory and the embedding output is
multiplied by sqrt(hidden), which is what those modules compute. Nemotron's ``layernorm1p``
(LayerNorm with zero-centred gamma) gets the same ``+1``: the local spec's torch LayerNorm
refuses ``layernorm_zero_centered_gamma`` (``torch_norm.py`` line 27). GPT-2 runs the learned
absolute positions, LayerNorms and biases of the local spec as they are.

Gemma 2 runs Megatron-Core's own ``softmax_scale`` (``query_pre_attn_scalar**-0.5``) and
``window_attn_skip_freq`` (the alternating windows); three shims apply exactly the math of
Megatron-Bridge's Gemma 2 custom modules (``067f987d``
``src/megatron/bridge/models/gemma/gemma2_provider.py``), which the local spec lacks: the
post-norms of ``TERowParallelLinearLayerNorm`` (``models/common/te_layers.py`` lines 26-57:
``linear_proj`` and ``linear_fc2`` normalise their output, a zero-centred RMSNorm
``post_layernorm``), the score soft-cap of ``Gemma2DotProductAttention`` (line 242:
``c·tanh(s/c)`` on the scaled scores, before the mask and softmax) and the logit soft-cap of
``Gemma2OutputLayer`` (lines 410-425).

Gemma 3 runs the same post-norm shim, Megatron-Core's own q/k norms (``qk_layernorm``, their
``+1`` from the zero-centred shim), ``softmax_scale`` and ``window_attn_skip_freq``, and
``GPTModel``'s RoPE with ``rotary_base`` and ``seq_len_interpolation_factor`` (the global
layers' linear factor). One more shim applies the math of Megatron-Bridge's Gemma 3 modules
(``067f987d`` ``src/megatron/bridge/models/gemma/gemma3_provider.py``), which Megatron-Core
0.16.1 lacks: the windowed layers rotate with a RoPE table of their own base,
``rotary_base_local``, and no interpolation (``Gemma3RotaryEmbedding``, lines 285-346: a
second ``RotaryEmbedding`` for local layers, the global one's ``inv_freq`` divided by
``rope_scaling_factor``; ``Gemma3SelfAttention``, lines 173-220: a local layer takes the
local table).

Mixture-of-experts families run with the settings families.md measured: SequentialMLP
(no grouped GEMM), the all-gather token dispatcher, no load balancing, fp32 routing; at
EP=2 two processes each hold half of the experts and load them from the same checkpoint.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from typing import Any

import pytest

# found, not imported, at collection: importing megatron.core costs seconds (tests/conftest.py, test time)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="needs megatron.core")

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v3",
            "gpt_oss", "nemotron", "gpt2", "glm4_moe")
TOLERANCE = 1e-4  # correct layouts measure ~1e-6; a wrong one 0.05 and more (families.md)
#: RoPE fields Megatron-Core reads: MLATransformerConfig's (multi_latent_attention.py lines 129-148) and
#: GPTModel's YaRN attributes (gpt_model.py lines 172-191), as nemo_convert/families/yarn.py writes them
MLA_ROPE = ("rope_type", "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim")
GPT_YARN = ("yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
            "yarn_mscale", "yarn_mscale_all_dim", "yarn_correction_range_round_to_int")


def _worker(family: str, nemo: str, want_path: str, root: str, tp: str = "1", ep: str = "1") -> None:  # subprocess
    if int(tp) * int(ep) == 1:
        _rank(0, family, nemo, want_path, root, 1, 1)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_rank, args=(family, nemo, want_path, root, int(tp), int(ep)), nprocs=int(tp) * int(ep))
        print(f"MCORE {family} TP={tp} EP={ep}: every rank matched")
        print("MCORE-PARITY OK")


def _rank(rank: int, family: str, nemo: str, want_path: str, root: str, tp: int, ep: int = 1) -> None:
    import contextlib
    import dataclasses
    import math
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as fn
    import yaml
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.activations import quick_gelu, squared_relu
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer import multi_latent_attention as mla_module
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )
    from megatron.core.transformer.utils import openai_gelu

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()

    def cpu_window_mask(sq: int, skv: int, window: Any) -> torch.Tensor:  # upstream's, on the CPU
        m = torch.ones(sq, skv, dtype=torch.bool)
        return ~torch.tril(torch.triu(m, diagonal=skv - sq - window[0]), diagonal=skv - sq + window[1])

    fused_softmax.get_sliding_window_causal_mask = cpu_window_mask
    moe_utils.te_general_gemm = None  # shim: without Transformer Engine the name is unbound (the torch.mm path)
    with open(os.path.join(nemo, "model_config.yaml")) as f:
        cfg = yaml.safe_load(f)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=tp * ep)
    # The experts' process groups come from here, not from TransformerConfig: without the
    # argument parallel_state makes expert TP = TP, and TransformerConfig's "Bias in Moe is
    # only supported when ETP==1" check passes on the config field alone (GPT-OSS at TP2
    # then splits each expert over the 2 ranks and adds the fc2 bias on both: 0.33).
    # (MCORE_EXPERT_TP_GROUPS reproduces that mismatch on purpose, for the negative test.)
    etp_groups = int(os.environ.get("MCORE_EXPERT_TP_GROUPS", 0)) or cfg.get("expert_tensor_parallel_size")
    parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep,
                                             expert_tensor_parallel_size=etp_groups)
    acts = {"fast-swiglu": fn.silu, "geglu": openai_gelu if cfg.get("openai_gelu") else fn.gelu,
            "quick-geglu": quick_gelu, "squared-relu": squared_relu,
            "gelu": openai_gelu if cfg.get("openai_gelu") else fn.gelu,  # NeMo's activation_to_func
            "relu": fn.relu}
    # NeMo's layernorm1p = Megatron's LayerNorm with zero-centred gamma (megatron_gpt_model.py 2221-2231)
    norm = "LayerNorm" if str(cfg.get("normalization")).lower() in ("layernorm", "layernorm1p") else "RMSNorm"
    zero_centred = bool(cfg.get("layernorm_zero_centered_gamma")) or cfg.get("normalization") == "layernorm1p"
    window = cfg.get("window_size")
    experts = cfg.get("num_moe_experts")
    moe: dict[str, Any] = {} if not experts else dict(
        num_moe_experts=experts, moe_router_topk=cfg["moe_router_topk"], moe_ffn_hidden_size=cfg["moe_ffn_hidden_size"],
        moe_router_pre_softmax=cfg["moe_router_pre_softmax"], moe_layer_freq=cfg["moe_layer_freq"],
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False, moe_router_dtype="fp32", expert_model_parallel_size=ep,
        moe_shared_expert_intermediate_size=cfg.get("moe_shared_expert_intermediate_size"),
        moe_shared_expert_gate=bool(cfg.get("moe_shared_expert_gate")),
        moe_router_score_function=cfg["moe_router_score_function"],
        moe_router_enable_expert_bias=bool(cfg.get("moe_router_enable_expert_bias")),
        moe_router_topk_scaling_factor=cfg.get("moe_router_topk_scaling_factor"),
        moe_router_num_groups=cfg.get("moe_router_num_groups"), moe_router_group_topk=cfg.get("moe_router_group_topk"))
    if cfg.get("softmax_type"):  # GPT-OSS: sinks, alternating windows, the clamped (up + 1) GLU, ETP 1
        moe.update(softmax_type=cfg["softmax_type"], window_attn_skip_freq=cfg.get("window_attn_skip_freq"),
                   glu_linear_offset=cfg["glu_linear_offset"],
                   activation_func_clamp_value=cfg["activation_func_clamp_value"])
    if cfg.get("window_attn_skip_freq") is not None:  # windows on some layers (GPT-OSS, Gemma 2)
        moe["window_attn_skip_freq"] = cfg["window_attn_skip_freq"]
    if cfg.get("query_pre_attn_scalar") is not None:  # Gemma 2: Megatron-Core's own softmax_scale
        moe["softmax_scale"] = float(cfg["query_pre_attn_scalar"]) ** -0.5
    if experts and cfg.get("expert_tensor_parallel_size"):
        moe["expert_tensor_parallel_size"] = cfg["expert_tensor_parallel_size"]
    mla = bool(cfg.get("multi_latent_attention"))
    if mla:  # shim: MLA passes its head dims to the core attention, which the local one does not take
        dpa_init = DotProductAttention.__init__

        def init(self: Any, *a: Any, k_channels: Any = None, v_channels: Any = None, **k: Any) -> None:
            dpa_init(self, *a, **k)  # it reads the shapes off the tensors; kv_channels = v_head_dim

        DotProductAttention.__init__ = init  # type: ignore[method-assign]
        mla_module.HAVE_TE = False  # shim: it imports Transformer Engine's names as None and believes it has TE
        # MLA's RoPE as the config says: rope_type and MLATransformerConfig's YaRN fields (a
        # .nemo written before YaRN has no rope_type: plain RoPE)
        rope = {k: cfg[k] for k in MLA_ROPE if k in cfg}
        moe.update(multi_latent_attention=True, q_lora_rank=cfg["q_lora_rank"], kv_lora_rank=cfg["kv_lora_rank"],
                   qk_head_dim=cfg["qk_head_dim"], qk_pos_emb_head_dim=cfg["qk_pos_emb_head_dim"],
                   v_head_dim=cfg["v_head_dim"], rotary_base=cfg["rotary_base"], rotary_percent=1.0,
                   **{"rope_type": "rope", **rope})
    mtp_layers = cfg.get("mtp_num_layers")  # DeepSeek-V3's multi-token-prediction block
    tc = (MLATransformerConfig if mla else TransformerConfig)(**moe, tensor_model_parallel_size=tp, mtp_num_layers=mtp_layers,
        num_layers=cfg["num_layers"], hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
        num_query_groups=cfg["num_query_groups"], ffn_hidden_size=cfg["ffn_hidden_size"],
        kv_channels=cfg["kv_channels"], gated_linear_unit=cfg["activation"].endswith("glu"),
        activation_func=acts[cfg["activation"]], normalization=norm, layernorm_epsilon=cfg["layernorm_epsilon"],
        add_bias_linear=cfg["bias"],
        add_qkv_bias=cfg["qkv_bias"], qk_layernorm=bool(cfg.get("qk_layernorm")),
        window_size=tuple(window) if window else None, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_activation_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, bias_dropout_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, attention_softmax_in_fp32=True)
    for k in GPT_YARN:  # GPTModel reads its YaRN fields with getattr (Megatron-Bridge's GPTModelProvider fields)
        if k in cfg:
            setattr(tc, k, cfg[k])
    assert os.environ.get("MCORE_EXPERT_TP_GROUPS") or (
        parallel_state.get_expert_tensor_parallel_world_size() == tc.expert_tensor_parallel_size), (
        parallel_state.get_expert_tensor_parallel_world_size(), tc.expert_tensor_parallel_size)
    vocab = cfg["nemo_convert"]["vocab_size"]
    if experts:
        # shim: the local spec saves an MoE layer's norm under the dense key map's
        # ``mlp.linear_fc1.layer_norm_weight``; Transformer Engine's MoE spec (what NeMo and
        # Megatron-Bridge run) keeps it as ``pre_mlp_layernorm.weight``. The local MLA spec
        # has no key map at all: TE's MLA keys are ``linear_q_up_proj.layer_norm_weight``
        # and ``linear_kv_up_proj.layer_norm_weight`` (and a dense layer's fc1 norm).
        spec = get_gpt_decoder_block_spec(tc, use_transformer_engine=False, normalization="RMSNorm")
        for i, layer in enumerate(spec.layer_specs):
            keys = dict(layer.submodules.sharded_state_dict_keys_map)
            is_moe = isinstance(layer.submodules.mlp, ModuleSpec) and layer.submodules.mlp.module is MoELayer
            if is_moe:
                keys.pop("pre_mlp_layernorm.", None)
            if mla:
                keys.update({"self_attention.q_layernorm.": "self_attention.linear_q_up_proj.layer_norm_",
                             "self_attention.kv_layernorm.": "self_attention.linear_kv_up_proj.layer_norm_"})
                if not is_moe:
                    keys["pre_mlp_layernorm."] = "mlp.linear_fc1.layer_norm_"
            spec.layer_specs[i] = dataclasses.replace(layer, submodules=dataclasses.replace(
                layer.submodules, sharded_state_dict_keys_map=keys))
    else:
        spec = get_gpt_layer_local_spec(normalization=norm, qk_layernorm=bool(cfg.get("qk_layernorm")))
    # The MTP layer copies the last decoder layer's spec (with the key map above), as
    # Megatron-Core's own get_gpt_mtp_block_spec does.
    mtp_spec = get_gpt_mtp_block_spec(tc, spec, use_transformer_engine=False) if mtp_layers else None
    model = GPTModel(tc, transformer_layer_spec=spec,
                     vocab_size=vocab, max_sequence_length=cfg["max_position_embeddings"],
                     position_embedding_type=cfg.get("position_embedding_type", "rope"),
                     rotary_base=int(cfg.get("rotary_base", 10000)),
                     rotary_percent=cfg.get("rotary_percentage", 1.0),
                     share_embeddings_and_output_weights=cfg["share_embeddings_and_output_weights"],
                     seq_len_interpolation_factor=cfg.get("seq_len_interpolation_factor"),
                     parallel_output=False, mtp_block_spec=mtp_spec)
    if cfg.get("nemo_convert", {}).get("post_norms") and not os.environ.get("MCORE_NO_POST_NORMS"):
        # shim: Megatron-Bridge's TERowParallelLinearLayerNorm, a norm on linear_proj's and
        # linear_fc2's (reduced) output, saved as their ``post_layernorm.weight``
        def with_post_norm(linear: Any) -> None:
            linear.post_layernorm = torch.nn.RMSNorm(cfg["hidden_size"], eps=cfg["layernorm_epsilon"])
            inner = linear.forward

            def forward(*a: Any, **k: Any) -> Any:
                out, bias = inner(*a, **k)
                assert bias is None
                return linear.post_layernorm(out), bias

            linear.forward = forward

        for layer in model.decoder.layers:
            with_post_norm(layer.self_attention.linear_proj)
            with_post_norm(layer.mlp.linear_fc2)
    if cfg.get("rotary_base_local") is not None and not os.environ.get("MCORE_NO_LOCAL_ROPE"):
        # shim: Megatron-Bridge's Gemma3RotaryEmbedding / Gemma3SelfAttention: a windowed
        # layer rotates with the local base and no interpolation (module docstring)
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        local_rope = RotaryEmbedding(kv_channels=tc.kv_channels, rotary_percent=1.0,
                                     rotary_base=cfg["rotary_base_local"], use_cpu_initialization=True)
        windowed = cfg.get("window_attn_skip_freq") or [1] * cfg["num_layers"]
        for layer in model.decoder.layers:
            if windowed[layer.layer_number - 1]:
                attention = layer.self_attention

                def local(*a: Any, rotary_pos_emb: Any = None, _inner: Any = attention.forward, **k: Any) -> Any:
                    return _inner(*a, rotary_pos_emb=local_rope(rotary_pos_emb.shape[0]), **k)

                attention.forward = local
    if cfg.get("attn_logit_softcapping"):  # shim: Gemma2DotProductAttention's c·tanh(s/c) on the scaled scores
        cap = float(cfg["attn_logit_softcapping"])
        for layer in model.decoder.layers:
            softmax = layer.self_attention.core_attention.scale_mask_softmax
            softmax.forward = (lambda inner: lambda s, *a, **k: inner(cap * torch.tanh(s / cap), *a, **k))(
                softmax.forward)
    if cfg.get("final_logit_softcapping") and model.post_process:  # shim: Gemma2OutputLayer's cap
        final_cap, head = float(cfg["final_logit_softcapping"]), model.output_layer.forward

        def capped(*a: Any, **k: Any) -> Any:
            out, bias = head(*a, **k)
            return final_cap * torch.tanh(out / final_cap), bias

        model.output_layer.forward = capped  # type: ignore[method-assign]
    ckpt = os.path.join(nemo, "model_weights")
    sharded = model.sharded_state_dict(prefix="model.")
    # Megatron-Core's words: "missing" = in the checkpoint, not asked for (left over: the
    # negative controls switch features off); "unexpected" = asked for, not in the checkpoint
    # (a weight among them fails load_state_dict(strict=True) below).
    loaded, left_over, absent = dist_checkpointing.load(sharded, ckpt, strict=StrictHandling.RETURN_ALL)
    # The MTP keys: Megatron-Core's own names and global shapes, none left over (not checked
    # when a negative control switched a feature off in the config: then keys are left over).
    if mtp_layers and not os.environ.get("MCORE_CONFIG_EDITED"):
        from megatron.core.dist_checkpointing.dict_utils import nested_values
        from megatron.core.dist_checkpointing.mapping import (
            ShardedObject,
            ShardedTensor,
        )

        ours = {k: tuple(v.global_shape) for k, v in dist_checkpointing.load_tensors_metadata(ckpt).items()
                if k.startswith("model.mtp.")}
        theirs = {v.key: tuple(v.global_shape) if isinstance(v, ShardedTensor) else ours.get(v.key)
                  for v in nested_values(sharded) if getattr(v, "key", "").startswith("model.mtp.")
                  and not isinstance(v, ShardedObject)}
        extra = sorted({v.key for v in nested_values(sharded) if isinstance(v, ShardedObject)
                        and v.key.startswith("model.mtp.")})
        assert ours == theirs, (sorted(set(ours) ^ set(theirs)), {k: (ours.get(k), theirs.get(k)) for k in ours
                                                                   if ours.get(k) != theirs.get(k)})
        # (Transformer Engine's core attention keeps an _extra_state that we write as NeMo does;
        # the local spec's DotProductAttention has none: left over, for grouped-query attention)
        assert not [k for k in absent | left_over if ".mtp." in k and not k.endswith("core_attention._extra_state")], \
            sorted(absent | left_over)
        print(f"MCORE {family} MTP keys: {len(ours)} tensors and {len(extra)} extra states, the names and shapes of "
              "Megatron-Core's sharded_state_dict", flush=True)
    model.load_state_dict({k[len("model."):]: v for k, v in loaded.items()}, strict=True)
    model.eval()
    if os.environ.get("MCORE_SAVE_TO"):  # Megatron-Core writes the model back, as it shards it (before the shims)
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]  # (its async saver, on the CPU)
        dist_checkpointing.save(model.sharded_state_dict(prefix="model."), os.environ["MCORE_SAVE_TO"])
    if zero_centred and not os.environ.get("MCORE_NO_ZERO_CENTRED_SHIM"):
        # shim: TE's zero-centred norms (RMSNorm for Gemma, LayerNorm for Nemotron) compute (1 + w)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("layernorm.weight") or name.endswith("layer_norm_weight"):
                    p.add_(1.0)
    if cfg.get("apply_embedding_scaling"):  # shim: NeMo's Gemma scales embeddings by sqrt(hidden)
        embed = model.embedding.forward
        scale = math.sqrt(cfg["hidden_size"])
        model.embedding.forward = lambda *a, **k: embed(*a, **k) * scale  # type: ignore[method-assign]
    want = torch.load(want_path)
    ids = want["ids"]
    n = ids.shape[1]
    mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)
    # With MTP the output layer runs on the MTP block's output, then on the main one; copied
    # at once (the cross entropy that follows shifts the logits in place).
    heads: list[torch.Tensor] = []
    hook = model.output_layer.register_forward_hook(lambda m, i, o: heads.append(o[0].transpose(0, 1).clone()))
    with torch.no_grad():  # (with an MTP block GPTModel needs labels, and then returns the loss)
        got = model(ids, torch.arange(n)[None], mask, **({"labels": ids} if mtp_layers else {}))
    hook.remove()
    if mtp_layers:
        got = heads[-1]
    delta = (got.float() - want["logits"].float()).abs().max().item()
    print(f"MCORE {family} TP={tp} EP={ep} rank {rank} max|dlogit| = {delta:.3g}", flush=True)
    if mtp_layers and "mtp_logits" in want:  # position n-1 predicts past the end: not compared
        mtp_delta = (heads[0][:, :-1].float() - want["mtp_logits"][:, :-1].float()).abs().max().item()
        print(f"MCORE {family} TP={tp} EP={ep} rank {rank} MTP max|dlogit| = {mtp_delta:.3g}", flush=True)
        delta = max(delta, mtp_delta)
    dist.destroy_process_group()
    assert delta < float(os.environ.get("MCORE_TOLERANCE", TOLERANCE)), delta
    if tp * ep == 1:
        print("MCORE-PARITY OK")


def _swap_experts(src: str, dst: str, a: int = 0, b: int = 1) -> str:
    """A copy of HF model ``src`` with experts ``a`` and ``b`` of every layer exchanged."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    tag = {f".experts.{a}.": f".experts.{b}.", f".experts.{b}.": f".experts.{a}."}
    out = {}
    for k, v in tensors.items():
        hit = next((t for t in tag if t in k), None)
        if ".experts." in k and hit is None:  # a fused [E, …] tensor (GPT-OSS): exchange on dim 0
            order = list(range(v.shape[0]))
            order[a], order[b] = b, a
            v = v[order].contiguous()
        out[k.replace(hit, tag[hit]) if hit else k] = v
    save_file(out, path, metadata={"format": "pt"})
    return dst


def _mtp_logits(folder: str, ids: Any) -> Any:
    """HF's multi-token-prediction logits of layer 0: transformers 5.24's own MTP module
    (``modeling_layers.py``: ``MtpLayer.forward``, lines 349-370, ``[enorm(embedding of token
    i+1); hnorm(hidden of token i)]`` → ``eh_proj`` → the decoder layer → ``post_norm``
    (= ``shared_head.norm``), then the shared head; ``MtpModel.forward_layer``) on the main
    model's last hidden state (after its final norm), at the main model's positions, as
    Megatron-Core's ``MultiTokenPredictionLayer`` runs it (rolled token ids, the main rotary
    embedding). Test-side shim: transformers finds MTP weights by the class's
    ``_keys_to_ignore_on_load_unexpected`` (``model\\.layers\\.61.*``, the hub model's
    index), here given this model's index."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{model.config.num_hidden_layers}.*"]
    mtp = MtpModel.from_pretrained(model)
    mtp.eval()
    n = ids.shape[1]
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state
        out = mtp.forward_layer(0, hidden, torch.arange(n)[None], None, input_ids=torch.roll(ids, -1, -1))
        return mtp._project_to_logits(out)


def _swap_mtp_norms(src: str, dst: str) -> str:
    """A copy of HF model ``src`` with its MTP layer's ``enorm`` and ``hnorm`` exchanged."""
    import shutil

    from safetensors.torch import load_file, save_file
    from tiny_models import read_json

    shutil.copytree(src, dst)
    path, layer = os.path.join(dst, "model.safetensors"), read_json(os.path.join(src, "config.json"))["num_hidden_layers"]
    tensors = load_file(path)
    e, h = f"model.layers.{layer}.enorm.weight", f"model.layers.{layer}.hnorm.weight"
    tensors[e], tensors[h] = tensors[h], tensors[e]
    save_file(tensors, path, metadata={"format": "pt"})
    return dst


def _run(tmp_path: Any, family: str, edit: dict[str, Any] | None = None, tp: int = 1, ep: int = 1,
         swap: bool = False, save_to: str | None = None, expert_tp_groups: int = 0, ids: Any = None,
         env_extra: dict[str, str] | None = None, swap_mtp_norms: bool = False,
         **overrides: Any) -> subprocess.CompletedProcess[str]:
    import torch
    import yaml
    from test_family_matrix import IDS, logits, make_model

    from nemo_convert import api

    src = make_model(str(tmp_path / "hf"), family, **overrides)
    nemo = str(tmp_path / "m")
    imported = _swap_experts(src, str(tmp_path / "swapped")) if swap else src
    if swap_mtp_norms:
        imported = _swap_mtp_norms(imported, str(tmp_path / "swapped_norms"))
    api.import_hf(imported, nemo, packed=False, layout="dist")
    if edit:
        path = os.path.join(nemo, "model_config.yaml")
        with open(path) as f:
            cfg = yaml.safe_load(f)
        cfg.update(edit)
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
    want = str(tmp_path / "want.pt")
    want_logits = {"ids": IDS, "logits": logits(src)} if ids is None else {"ids": ids, "logits": logits(src, ids)}
    with api.open_checkpoint(nemo) as ck:
        if ck.config.get("mtp_num_layers"):
            want_logits["mtp_logits"] = _mtp_logits(src, want_logits["ids"])
    torch.save(want_logits, want)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    if save_to:
        env["MCORE_SAVE_TO"] = save_to
    if expert_tp_groups:
        env["MCORE_EXPERT_TP_GROUPS"] = str(expert_tp_groups)
    env.update(env_extra or {})
    if edit:
        env["MCORE_CONFIG_EDITED"] = "1"
    return subprocess.run([sys.executable, os.path.abspath(__file__), family, nemo, want, str(tmp_path), str(tp),
                           str(ep)], env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_megatron_core_logits_equal_hf(tmp_path: Any, family: str) -> None:
    proc = _run(tmp_path, family)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(proc.stdout.strip().splitlines()[0])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "phi3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "nemotron", "gpt2",
                                    "gemma2", "gemma3", "glm4_moe"])
def test_megatron_core_at_tp2_loads_the_same_checkpoint(tmp_path: Any, family: str) -> None:
    """Megatron reshards the dist checkpoint on load: at TP=2 each rank's slices of the
    grouped QKV (and its bias, and Phi-3's regrouped packed projection) are whole query
    groups, and the gathered logits are HF's."""
    proc = _run(tmp_path, family, tp=2)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
def test_the_check_sees_nemos_window_convention(tmp_path: Any) -> None:
    """NeMo's importer writes ``window_size=[W, 0]``; Megatron-Core then lets each query see
    one key too many, and this test notices (families.md: 0.31 at 12 tokens, W=8)."""
    proc = _run(tmp_path, "mistral", {"window_size": [4, 0]})
    assert proc.returncode != 0 and "MCORE mistral" in proc.stdout
    delta = float(proc.stdout.split("= ")[1].split()[0])
    print(f"NeMo window [W, 0]: max|dlogit| = {delta:.3g}")
    assert delta > 1e-2, delta


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v3", "gpt_oss", "glm4_moe"])
def test_megatron_core_at_ep2_loads_the_same_checkpoint(tmp_path: Any, family: str) -> None:
    """Expert parallelism: two processes, each building and loading half of the experts
    (global expert ``ep_rank * E/2 + j``) from the one dist checkpoint, give HF's logits."""
    proc = _run(tmp_path, family, ep=2)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
@pytest.mark.parametrize("family, tp, ep", [("mixtral", 2, 1), ("qwen3_moe", 1, 2), ("gpt_oss", 2, 1)])
def test_what_megatron_core_saves_at_tp2_or_ep2_exports_to_hf(tmp_path: Any, family: str, tp: int, ep: int) -> None:
    """The other way: Megatron-Core saves the loaded model with its own sharding (experts
    as each EP rank holds them, fc1 gate/up halves per TP rank); our reader gathers it and
    the export is the HF source, bit-exact."""
    import shutil

    from test_family_matrix import assert_same

    from nemo_convert import api

    saved = str(tmp_path / "mcore")
    os.makedirs(saved)
    proc = _run(tmp_path, family, tp=tp, ep=ep, save_to=saved)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    nemo = str(tmp_path / "m")
    shutil.rmtree(os.path.join(nemo, "model_weights"))
    shutil.copytree(saved, os.path.join(nemo, "model_weights"))
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    assert_same(str(tmp_path / "hf"), back)


@pytest.mark.slow
def test_megatron_core_at_tp2_ep2_loads_the_same_checkpoint(tmp_path: Any) -> None:
    """Four processes: experts split over two EP ranks and, within each, tensor-parallel
    over two (expert TP = TP): each rank's gate/up halves of its experts' fc1 come from
    the one global ``[L, E, 2Fe, H]`` key."""
    proc = _run(tmp_path, "mixtral", tp=2, ep=2)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
def test_megatron_core_runs_a_mixed_dense_moe_stack(tmp_path: Any) -> None:
    """Qwen3-MoE with a dense layer between MoE layers: Megatron-Core's non-homogeneous
    per-layer keys (``decoder.layers.<i>.…``, experts ``[E, …]``) load and match HF."""
    proc = _run(tmp_path, "qwen3_moe", num_hidden_layers=3, mlp_only_layers=[1])
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(proc.stdout.strip().splitlines()[0])


@pytest.mark.slow
@pytest.mark.parametrize("family, ep", [("mixtral", 1), ("qwen3_moe", 2), ("deepseek_v3", 1), ("gpt_oss", 1)])
def test_the_check_sees_two_swapped_experts(tmp_path: Any, family: str, ep: int) -> None:
    """Experts 0 and 1 exchanged in every layer (the router unchanged): the logits part
    from HF's, so these checks would catch a wrong expert order (families.md: 0.26–1.04)."""
    proc = _run(tmp_path, family, ep=ep, swap=True)
    assert proc.returncode != 0 and "MCORE" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    # ranks print at once, so a line may hold two reports: take every number after "max|dlogit| = "
    delta = max(float(d) for d in re.findall(r"max\|dlogit\| = ([0-9.]+(?:e[-+]?[0-9]+)?)", proc.stdout))
    print(f"{family} experts 0 <-> 1 at EP={ep}: max|dlogit| = {delta:.3g}")
    assert delta > 1e-2, delta


@pytest.mark.slow
def test_the_check_sees_deepseeks_router_bias(tmp_path: Any) -> None:
    """DeepSeek-V3 without the router's score correction (``expert_bias``, an HF buffer,
    randomised in the tiny model) picks other experts: the check notices."""
    proc = _run(tmp_path, "deepseek_v3", {"moe_router_enable_expert_bias": False})
    assert proc.returncode != 0 and "MCORE deepseek_v3" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    delta = float(proc.stdout.split("= ")[1].split()[0])
    print(f"deepseek_v3 without expert_bias: max|dlogit| = {delta:.3g}")
    assert delta > 1e-2, delta


@pytest.mark.slow
@pytest.mark.parametrize("edit, what, least", [
    # RoPE over 12 positions of a tiny random model moves the logits least: 5.1e-3 measured,
    # 10^4 times what the right fraction measures (4e-7)
    ({"rotary_percentage": 1.0}, "whole-head RoPE instead of the first half", 1e-3),
    ({"moe_router_enable_expert_bias": False}, "the router without its score correction", 1e-2),
    ({"qk_layernorm": False}, "no q/k norms", 1e-2),
])
def test_the_check_sees_glm4_moe_features(tmp_path: Any, edit: dict[str, Any], what: str, least: float) -> None:
    """GLM-4.5 run with one of its features switched off in the config Megatron-Core reads
    (half-rotary RoPE, the expert bias, the per-head q/k norms): the logits part from HF's
    (measured: 5.1e-3, 0.149, 0.038)."""
    proc = _run(tmp_path, "glm4_moe", edit)
    assert proc.returncode != 0 and "MCORE glm4_moe" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    delta = float(re.search(r"max\|dlogit\| = ([0-9.]+(?:e[-+]?[0-9]+)?)", proc.stdout).group(1))
    print(f"glm4_moe with {what}: max|dlogit| = {delta:.3g}")
    assert delta > least, delta


@pytest.mark.slow
def test_megatron_core_runs_glm45_air_without_qk_norms(tmp_path: Any) -> None:
    """GLM-4.5-Air's shape: ``use_qk_norm: false`` (no q/k norm tensors on either side) and
    ``routed_scaling_factor: 1.0``, at TP=2 with its MTP layer: HF's logits."""
    proc = _run(tmp_path, "glm4_moe", tp=2, use_qk_norm=False, routed_scaling_factor=1.0)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
def test_megatron_core_runs_gpt_oss_at_tp2(tmp_path: Any) -> None:
    """GPT-OSS at TP=2 with expert TP 1 (Megatron requires it for expert biases): attention
    split by heads (sinks too), every rank holds whole experts and adds their fc2 bias once."""
    proc = _run(tmp_path, "gpt_oss", tp=2)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
def test_the_check_sees_expert_biases_split_over_tp(tmp_path: Any) -> None:
    """The same run with the process groups at expert TP 2 while the config says 1 (what
    ``initialize_model_parallel`` does when it is not told ETP, and what TransformerConfig's
    "Bias in Moe is only supported when ETP==1" check cannot see): each expert is split over
    the two ranks and both add its fc2 bias before the partial sums are reduced."""
    proc = _run(tmp_path, "gpt_oss", tp=2, expert_tp_groups=2)
    assert proc.returncode != 0 and "MCORE gpt_oss" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    delta = float(re.search(r"= ([0-9.]+(?:e[-+]?[0-9]+)?)", proc.stdout).group(1))  # (ranks print at once)
    print(f"gpt_oss with expert TP 2 groups: max|dlogit| = {delta:.3g}")
    assert delta > 1e-2, delta


@pytest.mark.slow
def test_the_check_sees_gpt_oss_sinks(tmp_path: Any) -> None:
    """GPT-OSS run without its attention sinks (``softmax_type: vanilla``): the check notices."""
    proc = _run(tmp_path, "gpt_oss", {"softmax_type": "vanilla"})
    assert proc.returncode != 0 and "MCORE gpt_oss" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    delta = float(proc.stdout.split("= ")[1].split()[0])
    print(f"gpt_oss without sinks: max|dlogit| = {delta:.3g}")
    assert delta > 1e-2, delta



@pytest.mark.slow
@pytest.mark.parametrize("family, edit, env_extra, what", [
    ("nemotron", None, {"MCORE_NO_ZERO_CENTRED_SHIM": "1"}, "LayerNorm γ without the +1"),
    ("nemotron", {"activation": "relu"}, None, "ReLU instead of squared ReLU"),
    ("gemma2", None, {"MCORE_NO_POST_NORMS": "1"}, "without the post-attention and post-MLP norms"),
    ("gemma2", {"attn_logit_softcapping": 3.0}, None, "the score cap 3 instead of 1.5"),
    ("gemma2", {"final_logit_softcapping": 6.0}, None, "the logit cap 6 instead of 3"),
    ("gemma2", {"query_pre_attn_scalar": 32}, None, "scores scaled by the head size instead of query_pre_attn_scalar"),
    ("gemma2", {"window_attn_skip_freq": None}, None, "the window on every layer"),
    ("gemma3", None, {"MCORE_NO_LOCAL_ROPE": "1"}, "the windowed layer rotating with the global RoPE"),
    ("gemma3", {"seq_len_interpolation_factor": None}, None, "the global RoPE without its linear factor"),
    ("gemma3", {"qk_layernorm": False}, None, "without the q/k norms"),
    ("gemma3", {"window_attn_skip_freq": [1, 1]}, None, "the window on the global layer too"),
    # erf vs tanh GeLU is a small difference (9.5e-5 here): checked at 1e-5, 30x what the
    # right GeLU measures (3.6e-7)
    ("gpt2", {"openai_gelu": False}, {"MCORE_TOLERANCE": "1e-5"}, "the erf GeLU instead of the tanh approximation"),
])
def test_the_check_sees_the_norm_and_activation_conventions(tmp_path: Any, family: str, edit: Any, env_extra: Any,
                                                            what: str) -> None:
    """Negative controls: the same checkpoint run with one convention changed parts from HF."""
    proc = _run(tmp_path, family, edit, env_extra=env_extra)
    assert proc.returncode != 0 and f"MCORE {family}" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    delta = float(proc.stdout.split("= ")[1].split()[0])
    print(f"{family}, {what}: max|dlogit| = {delta:.3g}")
    assert delta > float((env_extra or {}).get("MCORE_TOLERANCE", TOLERANCE)), delta


@pytest.mark.slow
@pytest.mark.parametrize("what, overrides", [
    # gemma-3-1b's pattern and RoPEs as published (six layers, the sixth global; bases 1e6 / 1e4
    # from the v4 keys), a window of 8 under the 12 ids
    ("the published layer pattern and RoPE bases", dict(
        num_hidden_layers=6, sliding_window_pattern=6, sliding_window=8, rope_parameters=None, rope_theta=1e6,
        rope_local_base_freq=1e4, query_pre_attn_scalar=256)),
    # Gemma3TextConfig's optional logit cap, run by Gemma 2's shim (its score cap is refused:
    # transformers never applies it, plugins/nemo_convert_gemma3/family.py)
    ("the final logit soft-cap", dict(final_logit_softcapping=3.0)),
])
def test_megatron_core_runs_gemma3_variants(tmp_path: Any, what: str, overrides: dict[str, Any]) -> None:
    proc = _run(tmp_path, "gemma3", tp=2, **overrides)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(what, *[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
def test_the_check_sees_gemma3s_published_local_base(tmp_path: Any) -> None:
    """With the published bases (1e6 global, 1e4 local) the five windowed layers rotating with
    the global RoPE part from HF within 12 positions (measured 0.567): the shim matters."""
    proc = _run(tmp_path, "gemma3", env_extra={"MCORE_NO_LOCAL_ROPE": "1"}, num_hidden_layers=6,
                sliding_window_pattern=6, sliding_window=8, rope_parameters=None, rope_theta=1e6,
                rope_local_base_freq=1e4, query_pre_attn_scalar=256)
    assert proc.returncode != 0 and "MCORE gemma3" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    delta = float(proc.stdout.split("= ")[1].split()[0])
    print(f"gemma3 (published bases), windowed layers on the global RoPE: max|dlogit| = {delta:.3g}")
    assert delta > 1e-2, delta


@pytest.mark.slow
def test_gpt2_matches_to_1e_5(tmp_path: Any) -> None:
    """The positive control of the GeLU check above: the tanh GeLU NeMo runs passes at 1e-5."""
    proc = _run(tmp_path, "gpt2", env_extra={"MCORE_TOLERANCE": "1e-5"})
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.mark.slow
def test_a_nemo_native_nemotron_that_megatron_core_saved_exports_with_its_logits(tmp_path: Any) -> None:
    """The NeMo-native path end to end: Megatron-Core loads a tiny Nemotron at TP2 and saves
    it with its own sharding; that checkpoint under NVIDIA's own config (the
    NeMo-Framework-Launcher ``nemotron_4b.yaml`` model section, tiny sizes, no record of ours)
    is a ``.nemo`` as NeMo writes it. Export picks the family from NVIDIA's fields and
    writes ``NemotronForCausalLM`` with the logits Megatron-Core computed (= HF's)."""
    import json
    import shutil

    import torch
    import yaml
    from test_family_matrix import logits

    from nemo_convert import api

    saved = str(tmp_path / "mcore")
    os.makedirs(saved)
    proc = _run(tmp_path, "nemotron", tp=2, save_to=saved, attention_bias=False, mlp_bias=False)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    nemo = str(tmp_path / "m")
    ours = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    with open(os.path.join(os.path.dirname(__file__), "data", "nemo_configs", "launcher_nemotron_4b.yaml")) as f:
        model = yaml.safe_load(f)["model"]
    model.pop("optim"), model.pop("data")
    model.update({k: ours[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                       "num_query_groups", "kv_channels", "max_position_embeddings",
                                       "encoder_seq_length")})
    model.update(target=ours["target"], precision=32, tensor_model_parallel_size=2,
                 tokenizer={"library": "sentencepiece", "model": None},
                 nemo_convert={"vocab_size": ours["nemo_convert"]["vocab_size"]})  # NeMo knows it from its tokenizer
    with open(os.path.join(nemo, "model_config.yaml"), "w") as f:
        yaml.safe_dump(model, f)
    shutil.rmtree(os.path.join(nemo, "model_weights"))
    shutil.copytree(saved, os.path.join(nemo, "model_weights"))
    back = str(tmp_path / "back")
    assert api.export_hf(nemo, back).family == "nemotron"
    out = json.load(open(os.path.join(back, "config.json")))
    assert out["architectures"] == ["NemotronForCausalLM"] and out["head_dim"] == 32
    assert torch.equal(logits(back), logits(str(tmp_path / "hf")))


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_core_runs_deepseeks_mtp_block(tmp_path: Any, tp: int) -> None:
    """DeepSeek-V3 with its multi-token-prediction layer (the matrix's row carries one, as
    the hub files do): Megatron-Core 0.16.1 builds the MTP block (``mtp_num_layers``), its
    keys are Megatron-Core's own (names and global shapes, no key missing or left over),
    the main logits are HF's and so are the MTP logits (transformers' ``MtpModel``)."""
    proc = _run(tmp_path, "deepseek_v3", tp=tp)
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "MTP keys:" in proc.stdout and "MTP max|dlogit|" in proc.stdout, proc.stdout[-3000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
def test_the_check_sees_swapped_mtp_norms(tmp_path: Any) -> None:
    """The MTP layer's ``enorm`` and ``hnorm`` exchanged in the imported checkpoint: the
    main logits still match, the MTP logits do not."""
    proc = _run(tmp_path, "deepseek_v3", swap_mtp_norms=True)
    assert proc.returncode != 0 and "MTP max|dlogit|" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    main = float(re.search(r"rank 0 max\|dlogit\| = (\S+)", proc.stdout).group(1))
    mtp = float(re.search(r"MTP max\|dlogit\| = (\S+)", proc.stdout).group(1))
    print(f"deepseek_v3 with enorm <-> hnorm: main max|dlogit| = {main:.3g}, MTP {mtp:.3g}")
    assert main < TOLERANCE and mtp > 1e-2, (main, mtp)


if __name__ == "__main__":
    _worker(*sys.argv[1:7])
