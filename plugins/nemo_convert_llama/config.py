"""Llama config translation: HF ``config.json`` ⇄ NeMo ``model_config.yaml``.

What NeMo has no field for (the source rope-scaling block, bos/eos ids, the original
vocabulary size, …) is kept verbatim in the ``nemo_convert`` section so that export
restores ``config.json`` key for key.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.hf_config import dtype_name_of_precision, precision_of, read_rope, require
from nemo_convert.mapping.ops import largest_pow2_divisor

NEMO_GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"


def llama_config_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    require(hf, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    heads = int(hf["num_attention_heads"])
    groups = int(hf.get("num_key_value_heads") or heads)
    hidden = int(hf["hidden_size"])
    rope = read_rope(hf)
    if rope.kind not in ("default", "linear", "llama3"):
        raise UnsupportedError(f"rope scaling type {rope.kind!r} has no NeMo 1 equivalent (supported: "
                               "linear, llama3)")
    attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    seq = int(hf.get("max_position_embeddings", 4096))
    head_dim = int(hf.get("head_dim") or hidden // heads)
    cfg: dict[str, Any] = {
        "mcore_gpt": True,
        "transformer_engine": True,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "encoder_seq_length": seq,
        "max_position_embeddings": seq,
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": hidden,
        "ffn_hidden_size": int(hf["intermediate_size"]),
        "num_attention_heads": heads,
        "num_query_groups": groups,
        # null means hidden / heads to NeMo and Megatron, as NeMo's converter writes it
        "kv_channels": None if head_dim * heads == hidden else head_dim,
        "init_method_std": float(hf.get("initializer_range", 0.02)),
        "layernorm_epsilon": float(hf.get("rms_norm_eps", 1e-5)),
        "normalization": "rmsnorm",
        "activation": "fast-swiglu",
        "bias": attn_bias and mlp_bias,
        "qkv_bias": attn_bias,
        "share_embeddings_and_output_weights": bool(hf.get("tie_word_embeddings", False)),
        "position_embedding_type": "rope",
        "rotary_percentage": 1.0,
        "rotary_base": rope.theta,
        "seq_len_interpolation_factor": float(rope.params["factor"]) if rope.kind == "linear" else None,
        "scale_positional_embedding": rope.kind == "llama3",
        "make_vocab_size_divisible_by": largest_pow2_divisor(int(hf["vocab_size"])),
        "hidden_dropout": 0.0,
        "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        "ffn_dropout": 0.0,
        # NeMo's value; Megatron applies it only in fp16 (scores / layer number, multiplied
        # back in the fp32 softmax): the same attention either way
        "apply_query_key_layer_scaling": True,
        "normalize_attention_scores": True,
        "transformer_block_type": "pre_ln",
        "megatron_amp_O2": False,
        "persist_layer_norm": True,
        "masked_softmax_fusion": True,
        "apply_rope_fusion": False,
        "precision": precision_of(hf),
    }
    if rope.kind == "llama3":
        cfg.update({
            "scale_factor": float(rope.params.get("factor", 8.0)),
            "low_freq_factor": float(rope.params.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(rope.params.get("high_freq_factor", 4.0)),
            "old_context_len": int(rope.params.get("original_max_position_embeddings", 8192)),
        })
    cfg["nemo_convert"] = {"linear_biases": {"attention": attn_bias, "mlp": mlp_bias},
                           "vocab_size": int(hf["vocab_size"])}
    return cfg


def _rope_block(cfg: dict[str, Any]) -> dict[str, Any] | None:
    if cfg.get("scale_positional_embedding"):
        return {"rope_type": "llama3", "factor": cfg.get("scale_factor", 8.0),
                "low_freq_factor": cfg.get("low_freq_factor", 1.0),
                "high_freq_factor": cfg.get("high_freq_factor", 4.0),
                "original_max_position_embeddings": cfg.get("old_context_len", 8192)}
    if cfg.get("seq_len_interpolation_factor"):
        return {"rope_type": "linear", "factor": cfg["seq_len_interpolation_factor"]}
    return None


def llama_config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    ours = cfg.get("nemo_convert") or {}
    biases = ours.get("linear_biases") or {}
    heads = int(cfg["num_attention_heads"])
    derived: dict[str, Any] = {
        "hidden_size": int(cfg["hidden_size"]),
        "intermediate_size": int(cfg["ffn_hidden_size"]),
        "num_hidden_layers": int(cfg["num_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(cfg.get("num_query_groups") or heads),
        "head_dim": int(cfg.get("kv_channels") or int(cfg["hidden_size"]) // heads),
        "max_position_embeddings": int(cfg.get("max_position_embeddings") or cfg["encoder_seq_length"]),
        "rms_norm_eps": float(cfg.get("layernorm_epsilon", 1e-5)),
        "tie_word_embeddings": bool(cfg.get("share_embeddings_and_output_weights", False)),
        "attention_bias": bool(biases.get("attention", cfg.get("qkv_bias") or cfg.get("bias"))),
        "mlp_bias": bool(biases.get("mlp", cfg.get("bias"))),
    }
    if ours.get("vocab_size") is not None:
        derived["vocab_size"] = int(ours["vocab_size"])
    original = ours.get("hf_config")
    if isinstance(original, dict):
        # The source config.json, restored key for key; NeMo's fields win where they exist.
        out = copy.deepcopy(original)
        for k, v in derived.items():
            if k in out or k in ("vocab_size",):
                out[k] = v
        return out
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "initializer_range": float(cfg.get("init_method_std", 0.02)),
           "rope_theta": float(cfg.get("rotary_base", 10000.0)),
           "torch_dtype": dtype_name_of_precision(cfg.get("precision", 32)), **derived}
    rope = _rope_block(cfg)
    if rope is not None:
        out["rope_scaling"] = rope
    return out
