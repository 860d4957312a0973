"""The ``toy-gpt`` model family: an example nemo-convert plugin.

HF ``ToyForCausalLM`` (a Llama-shaped decoder: RMSNorm, grouped-query attention, SwiGLU
MLP, no biases) ⇄ NeMo Megatron-Core GPT. The plugin only *declares*: which configs it
handles, how names map (as rules with built-in inverses) and how the configs translate.
Registered in ``pyproject.toml``::

    [project.entry-points.nemo_convert]
    toyfamily = "nemo_convert_toyfamily"
"""

from __future__ import annotations

from typing import Any

from nemo_convert import ModelFamily, NemoTarget, hookimpl
from nemo_convert.families import GPT_CONFIG, Check, never, table_translation
from nemo_convert.mapping import (
    FuseGated,
    FuseQKV,
    Mapping,
    Parallel,
    Rename,
    SpecField,
    Tied,
)

NEMO_GPT = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"

L = "model.layers.{i}."  # HF names; {i} runs over range(num_layers)
D = "decoder.layers.{i}."  # NeMo names, per layer and without the "model." prefix

# Conditions and declared shapes read the typed model spec (nemo_convert.spec.ModelSpec),
# by field path; a path that is not a field of the spec fails here, at import.
TIED = SpecField("embedding.tied")  # the output layer is the word embedding
HIDDEN, FFN = SpecField("geometry.hidden"), SpecField("geometry.ffn")


def toy_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF ``ToyForCausalLM`` names ⇄ NeMo GPT names. Read left to right for import; export
    runs the same rules backwards."""
    return Mapping(
        rules=(
            Rename("model.embed_tokens.weight", "embedding.word_embeddings.weight", Parallel.VOCAB),
            Rename(L + "input_layernorm.weight", D + "self_attention.linear_qkv.layer_norm_weight",
                   shape=(HIDDEN,)),
            FuseQKV(q=L + "self_attn.q_proj.weight", k=L + "self_attn.k_proj.weight",
                    v=L + "self_attn.v_proj.weight", nemo=D + "self_attention.linear_qkv.weight"),
            Rename(L + "self_attn.o_proj.weight", D + "self_attention.linear_proj.weight", Parallel.ROW),
            Rename(L + "post_attention_layernorm.weight", D + "mlp.linear_fc1.layer_norm_weight",
                   shape=(HIDDEN,)),
            FuseGated(gate=L + "mlp.gate_proj.weight", up=L + "mlp.up_proj.weight",
                      nemo=D + "mlp.linear_fc1.weight"),
            Rename(L + "mlp.down_proj.weight", D + "mlp.linear_fc2.weight", Parallel.ROW,
                   shape=(HIDDEN, FFN)),
            Rename("model.norm.weight", "decoder.final_layernorm.weight", shape=(HIDDEN,)),
            Rename("lm_head.weight", "output_layer.weight", Parallel.VOCAB,
                   when=~TIED),
            Tied("lm_head.weight", same_as="model.embed_tokens.weight",
                 when=TIED),
        ),
        layers="num_layers",
        drop_hf=(L + "self_attn.rotary_emb.inv_freq",),  # a buffer, not a weight
    )


def no_biases(hf: dict[str, Any]) -> str | None:
    """The mapping above has no bias tensors: the bias switches may only be off."""
    on = [f"{k}=True" for k in ("attention_bias", "mlp_bias") if hf.get(k)]
    return f"{', '.join(on)} (a toy-gpt linear has no bias)" if on else None


#: The config translation as a table: the GPT decoder's shared rows (sizes, heads, RoPE
#: without scaling, the dtype, …) and a check of the bias switches. Strict both ways:
#: ``config_to_nemo`` refuses by name every key no row translates, checks or declares
#: harmless — ``sliding_window``, ``attention_bias=True``, a yarn ``rope_scaling`` — so no
#: key is ever dropped silently; ``config_to_hf`` is derived from the same rows.
TOY_CONFIG = GPT_CONFIG.extend(
    Check(("attention_bias", "mlp_bias"), no_biases),
    hf_constants={"architectures": ["ToyForCausalLM"], "model_type": "toy"},
)
toy_config_to_nemo, toy_config_to_hf = table_translation(TOY_CONFIG, "toy-gpt")


TOY_GPT = ModelFamily(
    name="toy-gpt",
    hf_architectures=("ToyForCausalLM",),
    hf_model_types=("toy",),
    nemo=NemoTarget(NEMO_GPT),
    mapping=toy_mapping,
    config_to_nemo=toy_config_to_nemo,
    config_to_hf=toy_config_to_hf,
    # A .nemo NeMo wrote never holds a toy model: the family is chosen for a NeMo-native
    # MegatronGPTModel config only with --family (its own .nemo files record it).
    claims_nemo_config=never,
    description="Example family: HF ToyForCausalLM (Llama-shaped) <-> NeMo GPT",
)


@hookimpl
def nemo_convert_model_families() -> list[ModelFamily]:
    return [TOY_GPT]
