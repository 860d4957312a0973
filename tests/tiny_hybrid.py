"""Tiny random Nemotron-H checkpoints made from published ``config.json`` files
(``tests/data/hub_configs/nemotron_h/``), shrunk in size only: widths, head and group
counts, state size, vocabulary, experts, and a shorter layer pattern with every kind of
the original. Every other key stays as published. Every parameter is random — norms,
``A_log``, ``D``, ``dt_bias``, convolution biases, router — and so is the router's score
correction (a buffer)."""

from __future__ import annotations

import json
import os

import torch

HERE = os.path.join(os.path.dirname(__file__), "data", "hub_configs", "nemotron_h")

#: name → (published config file, the sizes changed)
CONFIGS: dict[str, tuple[str, dict]] = {
    "nemotron_h_8b": ("Nemotron-H-8B-Base-8K.json", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=256,
        mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, max_position_embeddings=64,
        hybrid_override_pattern="M-*M-M", num_hidden_layers=6)),
    "nemotron_3_nano": ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
        vocab_size=256, mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16,
        max_position_embeddings=64, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, hybrid_override_pattern="MEM*EM", num_hidden_layers=6)),
}


def published(name: str) -> dict:
    with open(os.path.join(HERE, CONFIGS[name][0]), encoding="utf-8") as f:
        return json.load(f)


def shrunk(name: str, **changes) -> dict:
    """The published config of ``name`` with its sizes shrunk (and ``changes`` on top)."""
    cfg = published(name)
    sizes = CONFIGS[name][1]
    unknown = set(sizes) - set(cfg) - {"head_dim"}
    assert not unknown, f"shrinking keys the published config lacks: {unknown}"
    return {**cfg, **sizes, **changes}


def make_nemotron_h(folder: str, name: str, *, seed: int = 0, keep_saved_config: bool = False, **changes) -> str:
    """A tiny random ``NemotronHForCausalLM`` of ``name``'s published config, saved by
    transformers into ``folder``; its ``config.json`` is then the published one, shrunk
    (unless ``keep_saved_config``: transformers 5's own spelling, ``layers_block_type``)."""
    from transformers import AutoModelForCausalLM, NemotronHConfig

    cfg_dict = shrunk(name, **changes)
    config = NemotronHConfig.from_dict({k: v for k, v in cfg_dict.items() if k != "auto_map"})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        for name_, buf in sorted(model.named_buffers()):
            if name_.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.5)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        cfg_dict.get("torch_dtype") or cfg_dict.get("dtype"), torch.float32)
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    if not keep_saved_config:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg_dict, f, indent=2)
    return folder


def megatron_config(cfg: dict, *, tp: int = 1, ep: int = 1, **overrides) -> dict:
    """``TransformerConfig`` keyword arguments for Megatron-Core 0.16.1's ``MambaModel`` from
    the NeMo config we wrote (``model_config.yaml``): what NeMo's ``MegatronMambaModel`` and
    Megatron-Bridge's provider set from it, with dropout off and the fused kernels that need
    a GPU off; ``overrides`` win."""
    from megatron.core.activations import squared_relu

    assert cfg["activation"] == "squared-relu" and cfg["normalization"] == "rmsnorm"
    assert cfg["position_embedding_type"] == "none" and not cfg["bias"] and not cfg["gated_linear_unit"]
    experts = cfg.get("num_moe_experts")
    moe = {} if not experts else dict(
        num_moe_experts=experts, moe_router_topk=cfg["moe_router_topk"], moe_ffn_hidden_size=cfg["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=cfg["moe_shared_expert_intermediate_size"],
        moe_router_score_function=cfg["moe_router_score_function"],
        moe_router_enable_expert_bias=cfg["moe_router_enable_expert_bias"],
        moe_router_topk_scaling_factor=cfg["moe_router_topk_scaling_factor"],
        moe_router_num_groups=cfg.get("moe_router_num_groups"), moe_router_group_topk=cfg.get("moe_router_group_topk"),
        moe_router_dtype=cfg["moe_router_dtype"], moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        expert_model_parallel_size=ep)
    return {**moe, "tensor_model_parallel_size": tp, "num_layers": cfg["num_layers"], "hidden_size": cfg["hidden_size"],
            "num_attention_heads": cfg["num_attention_heads"], "num_query_groups": cfg["num_query_groups"],
            "ffn_hidden_size": cfg["ffn_hidden_size"], "kv_channels": cfg["kv_channels"], "gated_linear_unit": False,
            "activation_func": squared_relu, "normalization": "RMSNorm", "layernorm_epsilon": cfg["layernorm_epsilon"],
            "add_bias_linear": False, "hidden_dropout": 0.0, "attention_dropout": 0.0, "bias_activation_fusion": False,
            "bias_dropout_fusion": False, "attention_softmax_in_fp32": True, "is_hybrid_model": True,
            "mamba_state_dim": cfg["mamba_state_dim"], "mamba_head_dim": cfg["mamba_head_dim"],
            "mamba_num_groups": cfg["mamba_num_groups"], "mamba_num_heads": cfg["mamba_num_heads"], **overrides}


#: What Megatron-Core 0.16.1's ``MambaModel.sharded_state_dict()`` asks for, per tiny model of
#: this module: every tensor key with its global shape, every extra-state key. The slow tests
#: of ``tests/test_nemotron_h_megatron.py`` assert it is still what Megatron-Core asks for
#: (``NEMOTRON_H_WRITE_MCORE_KEYS=1`` rewrites it); ``tests/test_nemotron_h.py`` checks our
#: dist checkpoints against it in the normal suite.
MCORE_KEYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "megatron_core_keys",
                          "mambamodel_{name}.json")
