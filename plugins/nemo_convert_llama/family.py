"""Llama's key mapping, as data. Every tensor operation is the core's."""

from __future__ import annotations

from typing import Any

from nemo_convert import ModelFamily
from nemo_convert.mapping import FuseGated, FuseQKV, Mapping, Parallel, Rename, Tied, cfg_get
from nemo_convert_llama.config import NEMO_GPT_TARGET, llama_config_to_hf, llama_config_to_nemo
from nemo_convert_llama.trtllm import LLAMA_TRTLLM

L = "model.layers.{i}."
D = "decoder.layers.{i}."


def llama_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF Llama names ⇄ NeMo mcore GPT names (logical, per layer, no ``model.`` prefix)."""
    biases = cfg_get(cfg, "nemo_convert.linear_biases") or {}
    attn_bias = biases.get("attention", bool(cfg.get("qkv_bias") or cfg.get("bias")))
    mlp_bias = biases.get("mlp", bool(cfg.get("bias")))
    rules = [
        Rename("model.embed_tokens.weight", "embedding.word_embeddings.weight", Parallel.VOCAB,
               shape=("nemo_convert.vocab_size", "hidden_size")),
        Rename(L + "input_layernorm.weight", D + "self_attention.linear_qkv.layer_norm_weight",
               shape=("hidden_size",)),
        FuseQKV(L + "self_attn.q_proj.weight", L + "self_attn.k_proj.weight", L + "self_attn.v_proj.weight",
                D + "self_attention.linear_qkv.weight"),
        Rename(L + "self_attn.o_proj.weight", D + "self_attention.linear_proj.weight", Parallel.ROW,
               shape=("hidden_size", None)),
        Rename(L + "post_attention_layernorm.weight", D + "mlp.linear_fc1.layer_norm_weight",
               shape=("hidden_size",)),
        FuseGated(L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight", D + "mlp.linear_fc1.weight"),
        Rename(L + "mlp.down_proj.weight", D + "mlp.linear_fc2.weight", Parallel.ROW,
               shape=("hidden_size", "ffn_hidden_size")),
        Rename("model.norm.weight", "decoder.final_layernorm.weight", shape=("hidden_size",)),
        Rename("lm_head.weight", "output_layer.weight", Parallel.VOCAB, shape=("nemo_convert.vocab_size", "hidden_size"),
               when="!share_embeddings_and_output_weights"),
        Tied("lm_head.weight", "model.embed_tokens.weight", when="share_embeddings_and_output_weights"),
    ]
    if attn_bias:
        rules += [
            FuseQKV(L + "self_attn.q_proj.bias", L + "self_attn.k_proj.bias", L + "self_attn.v_proj.bias",
                    D + "self_attention.linear_qkv.bias"),
            Rename(L + "self_attn.o_proj.bias", D + "self_attention.linear_proj.bias"),
        ]
    if mlp_bias:
        rules += [
            FuseGated(L + "mlp.gate_proj.bias", L + "mlp.up_proj.bias", D + "mlp.linear_fc1.bias"),
            Rename(L + "mlp.down_proj.bias", D + "mlp.linear_fc2.bias"),
        ]
    return Mapping(tuple(rules), layers="num_layers", drop_hf=(L + "self_attn.rotary_emb.inv_freq",))


LLAMA = ModelFamily(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    hf_model_types=("llama",),
    nemo_target=NEMO_GPT_TARGET,
    mapping=llama_mapping,
    config_to_nemo=llama_config_to_nemo,
    config_to_hf=llama_config_to_hf,
    default_layout="dist",
    nemo2_targets=("nemo.collections.llm.gpt.model.llama.LlamaModel",),
    hf_model_class="LlamaForCausalLM",
    trtllm=LLAMA_TRTLLM,
    description="Llama 2/3/3.1/3.2 (MHA, GQA, tied embeddings, llama3/linear RoPE scaling)",
)
