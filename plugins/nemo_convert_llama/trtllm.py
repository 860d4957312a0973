"""Llama as a TensorRT-LLM checkpoint (``nemo-convert quantize``), as data.

Names per TensorRT-LLM ``docs/source/architecture/checkpoint.md`` ("Rank Weights") and
nemo-formats.md §8.4: HF ``gate_proj`` (the activated branch) is ``mlp.fc``, ``up_proj``
is ``mlp.gate``, ``down_proj`` is ``mlp.proj``; ``attention.qkv`` is ``[Q; K; V]`` of the
rank's heads. Every tensor operation is the core's (:mod:`nemo_convert.qnemo`).
"""

from __future__ import annotations

from typing import Any

from nemo_convert.hf_config import require
from nemo_convert.mapping import Parallel
from nemo_convert.qnemo.spec import KvCacheScale, TrtllmSpec, TrtTensor, rope_fields

H = "model.layers.{i}."            # HF, global layer index
T = "transformer.layers.{i}."      # TensorRT-LLM, layer index within the pipeline stage
HEADS = ("num_attention_heads", "num_key_value_heads", "num_key_value_heads")


def llama_trtllm_config(hf: dict[str, Any]) -> dict[str, Any]:
    """HF Llama ``config.json`` → TensorRT-LLM ``LlamaForCausalLM`` model fields."""
    require(hf, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size")
    heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
    return {
        "vocab_size": int(hf["vocab_size"]),
        "hidden_size": hidden,
        "num_hidden_layers": int(hf["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(hf.get("num_key_value_heads") or heads),
        "head_size": int(hf.get("head_dim") or hidden // heads),
        "intermediate_size": int(hf["intermediate_size"]),
        "max_position_embeddings": int(hf.get("max_position_embeddings") or 2048),
        "hidden_act": str(hf.get("hidden_act") or "silu"),
        "norm_epsilon": float(hf.get("rms_norm_eps") or 1e-6),
        "position_embedding_type": "rope_gpt_neox",
        **rope_fields(hf),
    }


LLAMA_TRTLLM = TrtllmSpec(
    architecture="LlamaForCausalLM",
    tensors=(
        TrtTensor("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), Parallel.VOCAB,
                  stage="first"),
        TrtTensor(T + "input_layernorm.weight", (H + "input_layernorm.weight",)),
        TrtTensor(T + "attention.qkv.weight",
                  (H + "self_attn.q_proj.weight", H + "self_attn.k_proj.weight", H + "self_attn.v_proj.weight"),
                  Parallel.COLUMN, quantize=True, units=HEADS),
        TrtTensor(T + "attention.dense.weight", (H + "self_attn.o_proj.weight",), Parallel.ROW, quantize=True),
        TrtTensor(T + "post_layernorm.weight", (H + "post_attention_layernorm.weight",)),
        TrtTensor(T + "mlp.fc.weight", (H + "mlp.gate_proj.weight",), Parallel.COLUMN, quantize=True),
        TrtTensor(T + "mlp.gate.weight", (H + "mlp.up_proj.weight",), Parallel.COLUMN, quantize=True),
        TrtTensor(T + "mlp.proj.weight", (H + "mlp.down_proj.weight",), Parallel.ROW, quantize=True),
        TrtTensor("transformer.ln_f.weight", ("model.norm.weight",), stage="last"),
        TrtTensor("lm_head.weight", ("lm_head.weight",), Parallel.VOCAB, fallback=("model.embed_tokens.weight",),
                  stage="last"),
    ),
    config=llama_trtllm_config,
    kv_cache=KvCacheScale(T + "attention.kv_cache_scaling_factor", k=H + "self_attn.k_proj",
                          v=H + "self_attn.v_proj"),
    drop_hf=(H + "self_attn.rotary_emb.inv_freq",),
)
