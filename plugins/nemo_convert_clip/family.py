"""CLIP's key mapping, as data: HF ``CLIPModel`` ⇄ NeMo ``MegatronCLIPModel`` (mcore towers).

Each tower is a mapping of its own, with HF names relative to the tower
(``embeddings.…``, ``encoder.layers.{i}.…``), NeMo names relative to the NeMo tower
(``conv1.…``, ``decoder.layers.{i}.…``) and config paths relative to the tower's
config section; :func:`clip_mapping` places them under their prefixes, so each tower
expands ``{i}`` over its own layer count. NeVA reuses :func:`clip_vision_tower_mapping`.
"""

from __future__ import annotations

from typing import Any

from nemo_convert import HFSide, ModelFamily, NemoTarget
from nemo_convert.mapping import FuseQKV, Mapping, Parallel, Rename, Reshape
from nemo_convert_clip.config import NEMO_CLIP_TARGET, clip_config_to_hf, clip_config_to_nemo
from nemo_convert_clip.runtime import clip_defaults

E = "encoder.layers.{i}."
D = "decoder.layers.{i}."
H = "hidden_size"


def _layer_rules() -> tuple[Any, ...]:
    """One pre-LN transformer layer, the same in both towers (MHA: one query group per head)."""
    groups = "num_attention_heads"  # one key and value per head
    return (
        Rename(E + "layer_norm1.weight", D + "self_attention.linear_qkv.layer_norm_weight", shape=(H,)),
        Rename(E + "layer_norm1.bias", D + "self_attention.linear_qkv.layer_norm_bias", shape=(H,)),
        FuseQKV(E + "self_attn.q_proj.weight", E + "self_attn.k_proj.weight", E + "self_attn.v_proj.weight",
                D + "self_attention.linear_qkv.weight", groups=groups),
        FuseQKV(E + "self_attn.q_proj.bias", E + "self_attn.k_proj.bias", E + "self_attn.v_proj.bias",
                D + "self_attention.linear_qkv.bias", groups=groups),
        Rename(E + "self_attn.out_proj.weight", D + "self_attention.linear_proj.weight", Parallel.ROW,
               shape=(H, H)),
        Rename(E + "self_attn.out_proj.bias", D + "self_attention.linear_proj.bias", shape=(H,)),
        Rename(E + "layer_norm2.weight", D + "mlp.linear_fc1.layer_norm_weight", shape=(H,)),
        Rename(E + "layer_norm2.bias", D + "mlp.linear_fc1.layer_norm_bias", shape=(H,)),
        Rename(E + "mlp.fc1.weight", D + "mlp.linear_fc1.weight", Parallel.COLUMN, shape=("ffn_hidden_size", H)),
        Rename(E + "mlp.fc1.bias", D + "mlp.linear_fc1.bias", Parallel.COLUMN, shape=("ffn_hidden_size",)),
        Rename(E + "mlp.fc2.weight", D + "mlp.linear_fc2.weight", Parallel.ROW, shape=(H, "ffn_hidden_size")),
        Rename(E + "mlp.fc2.bias", D + "mlp.linear_fc2.bias", shape=(H,)),
    )


def clip_vision_tower_mapping() -> Mapping:
    """HF ``CLIPVisionTransformer`` ⇄ mcore ``CLIPViTModel`` (+ NeMo's final norm), without
    the projection head."""
    return Mapping((
        Rename("embeddings.patch_embedding.weight", "conv1.weight",
               shape=(H, "num_channels", "patch_dim", "patch_dim")),
        Reshape("embeddings.class_embedding", "class_token", nemo_shape=(1, "class_token_length", H),
                hf_shape=(H,)),
        Rename("embeddings.position_embedding.weight", "position_embeddings.weight",
               shape=("max_position_embeddings", H)),
        Rename("pre_layrnorm.weight", "ln_pre.weight", shape=(H,)),  # (sic: HF's spelling)
        Rename("pre_layrnorm.bias", "ln_pre.bias", shape=(H,)),
        *_layer_rules(),
        Rename("post_layernorm.weight", "final_layernorm.weight", shape=(H,)),
        Rename("post_layernorm.bias", "final_layernorm.bias", shape=(H,)),
    ), layers="num_layers", drop_hf=("embeddings.position_ids",))


def clip_text_tower_mapping() -> Mapping:
    """HF ``CLIPTextTransformer`` ⇄ NeMo's ``MCoreCLIPTextModel`` (an mcore GPT without output
    layer), without the projection head."""
    return Mapping((
        Rename("embeddings.token_embedding.weight", "embedding.word_embeddings.weight", Parallel.VOCAB,
               shape=(None, H)),
        Rename("embeddings.position_embedding.weight", "embedding.position_embeddings.weight",
               shape=("max_position_embeddings", H)),
        *_layer_rules(),
        Rename("final_layer_norm.weight", "final_layernorm.weight", shape=(H,)),
        Rename("final_layer_norm.bias", "final_layernorm.bias", shape=(H,)),
    ), layers="num_layers", drop_hf=("embeddings.position_ids",))


def clip_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF ``CLIPModel`` names ⇄ NeMo ``MegatronCLIPModel`` names (logical, no ``model.`` prefix)."""
    heads = Mapping((
        Rename("visual_projection.weight", "vision_encoder.head.weight", shape=("output_dim", "vision.hidden_size")),
        Rename("text_projection.weight", "text_encoder.head.weight", shape=("output_dim", "text.hidden_size")),
        Rename("logit_scale", "logit_scale", shape=()),
    ))
    vision = clip_vision_tower_mapping().nested(hf_prefix="vision_model.", nemo_prefix="vision_encoder.",
                                                cfg_prefix="vision.")
    text = clip_text_tower_mapping().nested(hf_prefix="text_model.", nemo_prefix="text_encoder.",
                                            cfg_prefix="text.")
    return vision.combine(text, heads)


CLIP = ModelFamily(
    name="clip",
    hf_architectures=("CLIPModel",),
    hf_model_types=("clip",),
    mapping=clip_mapping,
    config_to_nemo=clip_config_to_nemo,
    config_to_hf=clip_config_to_hf,
    # MegatronCLIPModel has no sharded_state_dict: one model_weights.ckpt
    nemo=NemoTarget(NEMO_CLIP_TARGET, default_layout="legacy", runtime_defaults=clip_defaults),
    hf=HFSide(model_class="CLIPModel",
              tokenizer_files=("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                               "merges.txt", "preprocessor_config.json")),
    description="CLIP (HF CLIPModel ⇄ NeMo MegatronCLIPModel, mcore vision and text towers)",
)
