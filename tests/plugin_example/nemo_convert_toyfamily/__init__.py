"""The ``toy-gpt`` model family: an example nemo-convert plugin.

HF ``ToyForCausalLM`` (a Llama-shaped decoder: RMSNorm, grouped-query attention, SwiGLU
MLP, no biases) ⇄ NeMo Megatron-Core GPT. The plugin only *declares*: which configs it
handles, how names map (as rules with built-in inverses) and how the configs translate.
Registered in ``pyproject.toml``::

    [project.entry-points.nemo_convert]
    toyfamily = "nemo_convert_toyfamily"
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_convert import ModelFamily, NemoTarget, hookimpl
from nemo_convert.hf_config import read_rope, require
from nemo_convert.mapping import FuseGated, FuseQKV, Mapping, Parallel, Rename, Tied

NEMO_GPT = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"

L = "model.layers.{i}."  # HF names; {i} runs over range(num_layers)
D = "decoder.layers.{i}."  # NeMo names, per layer and without the "model." prefix


def toy_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF ``ToyForCausalLM`` names ⇄ NeMo GPT names. Read left to right for import; export
    runs the same rules backwards."""
    return Mapping(
        rules=(
            Rename("model.embed_tokens.weight", "embedding.word_embeddings.weight", Parallel.VOCAB),
            Rename(L + "input_layernorm.weight", D + "self_attention.linear_qkv.layer_norm_weight",
                   shape=("hidden_size",)),
            FuseQKV(q=L + "self_attn.q_proj.weight", k=L + "self_attn.k_proj.weight",
                    v=L + "self_attn.v_proj.weight", nemo=D + "self_attention.linear_qkv.weight"),
            Rename(L + "self_attn.o_proj.weight", D + "self_attention.linear_proj.weight", Parallel.ROW),
            Rename(L + "post_attention_layernorm.weight", D + "mlp.linear_fc1.layer_norm_weight",
                   shape=("hidden_size",)),
            FuseGated(gate=L + "mlp.gate_proj.weight", up=L + "mlp.up_proj.weight",
                      nemo=D + "mlp.linear_fc1.weight"),
            Rename(L + "mlp.down_proj.weight", D + "mlp.linear_fc2.weight", Parallel.ROW,
                   shape=("hidden_size", "ffn_hidden_size")),
            Rename("model.norm.weight", "decoder.final_layernorm.weight", shape=("hidden_size",)),
            Rename("lm_head.weight", "output_layer.weight", Parallel.VOCAB,
                   when="!share_embeddings_and_output_weights"),
            Tied("lm_head.weight", same_as="model.embed_tokens.weight",
                 when="share_embeddings_and_output_weights"),
        ),
        layers="num_layers",
        drop_hf=(L + "self_attn.rotary_emb.inv_freq",),  # a buffer, not a weight
    )


def toy_config_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    """HF ``config.json`` → NeMo ``model_config.yaml``."""
    require(hf, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
    seq = int(hf.get("max_position_embeddings", 2048))
    return {
        "mcore_gpt": True,
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": hidden,
        "ffn_hidden_size": int(hf["intermediate_size"]),
        "num_attention_heads": heads,
        "num_query_groups": int(hf.get("num_key_value_heads") or heads),
        "kv_channels": int(hf.get("head_dim") or hidden // heads),
        "encoder_seq_length": seq,
        "max_position_embeddings": seq,
        "layernorm_epsilon": float(hf.get("rms_norm_eps", 1e-5)),
        "normalization": "rmsnorm",
        "activation": "fast-swiglu",
        "bias": False,
        "position_embedding_type": "rope",
        "rotary_base": read_rope(hf).theta,
        "share_embeddings_and_output_weights": bool(hf.get("tie_word_embeddings", False)),
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
    }


def toy_config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """NeMo config → HF ``config.json``: the source ``config.json`` (which the core keeps in
    the ``nemo_convert`` section on import) with NeMo's values written over it."""
    out = copy.deepcopy((cfg.get("nemo_convert") or {}).get("hf_config") or {})
    out.setdefault("architectures", ["ToyForCausalLM"])
    out.setdefault("model_type", "toy")
    out.update({
        "num_hidden_layers": int(cfg["num_layers"]),
        "hidden_size": int(cfg["hidden_size"]),
        "intermediate_size": int(cfg["ffn_hidden_size"]),
        "num_attention_heads": int(cfg["num_attention_heads"]),
        "num_key_value_heads": int(cfg["num_query_groups"]),
        "head_dim": int(cfg["kv_channels"]),
        "max_position_embeddings": int(cfg["max_position_embeddings"]),
        "rms_norm_eps": float(cfg["layernorm_epsilon"]),
        "tie_word_embeddings": bool(cfg["share_embeddings_and_output_weights"]),
    })
    return out


TOY_GPT = ModelFamily(
    name="toy-gpt",
    hf_architectures=("ToyForCausalLM",),
    hf_model_types=("toy",),
    nemo=NemoTarget(NEMO_GPT),
    mapping=toy_mapping,
    config_to_nemo=toy_config_to_nemo,
    config_to_hf=toy_config_to_hf,
    description="Example family: HF ToyForCausalLM (Llama-shaped) <-> NeMo GPT",
)


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [TOY_GPT]
