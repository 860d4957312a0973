"""CLIP config translation: HF ``config.json`` (``CLIPModel``) ⇄ NeMo ``model_config.yaml``
(``MegatronCLIPModel`` with Megatron-Core towers).

NeMo keeps one section per tower (``vision:``, ``text:``) shaped like NeMo's
``megatron_clip_VIT-L-14.yaml``; the converter's overrides (``mcore_gpt``,
``transformer_engine``, learned absolute positions) are applied. Fields HF leaves out
fall back to transformers' own defaults (hub configs are often sparse). The source
``config.json`` is kept verbatim by the core in ``nemo_convert.hf_config``, so export
restores it key for key; NeMo's fields win where both exist.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.families import refuse_unknown_keys
from nemo_convert.hf_config import dtype_name_of_precision, precision_of
from nemo_convert.mapping.ops import largest_pow2_divisor

NEMO_CLIP_TARGET = ("nemo.collections.multimodal.models.vision_language_foundation.clip."
                    "megatron_clip_models.MegatronCLIPModel")
DEFAULT_TOKENIZER = "openai/clip-vit-large-patch14"

#: transformers' ``CLIPTextConfig`` / ``CLIPVisionConfig`` / ``CLIPConfig`` defaults, for
#: fields a sparse ``config.json`` leaves out.
HF_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
    "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0, "initializer_range": 0.02}
HF_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0, "initializer_range": 0.02}
HF_CLIP_PROJECTION_DIM = 512

#: Every ``config.json`` key the translation reads or knows not to change the model (beside
#: the shared harmless keys): anything else is refused by name (strict, like the tensors).
#: Harmless: initialisation-only values, training dropouts, a tower's own
#: ``projection_dim`` / ``vocab_size`` copies that ``CLIPModel`` does not use, and the
#: ``tie_word_embeddings: true`` that the towers of openai/clip-vit-large-patch14 carry (a
#: ``PretrainedConfig`` default of its time; no CLIP tower has an output embedding to tie).
CLIP_TOWER_KEYS: tuple[str, ...] = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act", "layer_norm_eps",
    "initializer_range", "attention_dropout", "initializer_factor", "dropout", "projection_dim", "torch_dtype",
    "dtype", "tie_word_embeddings")
CLIP_TEXT_KEYS = CLIP_TOWER_KEYS + ("max_position_embeddings", "vocab_size")
CLIP_VISION_KEYS = CLIP_TOWER_KEYS + ("image_size", "patch_size", "num_channels", "vocab_size")
#: ``text_config_dict`` / ``vision_config_dict``: the legacy spelling of the towers that
#: openai/clip-vit-large-patch14 still publishes beside ``text_config`` / ``vision_config``
#: (:func:`legacy_tower_dicts`).
LEGACY_TOWER_DICTS = {"text_config_dict": "text_config", "vision_config_dict": "vision_config"}
CLIP_KEYS = ("text_config", "vision_config", "projection_dim", "torch_dtype", "dtype", "logit_scale_init_value",
             "initializer_factor", *LEGACY_TOWER_DICTS)
#: The tower fields the translation reads (those that change the model), per tower.
TOWER_MATH_KEYS = {
    "text_config": ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
                    "layer_norm_eps", "max_position_embeddings", "vocab_size"),
    "vision_config": ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
                      "layer_norm_eps", "image_size", "patch_size", "num_channels"),
}

#: HF ``hidden_act`` ⇄ NeMo ``activation`` (NeMo's ``approx-gelu`` is quick-GELU).
ACTIVATIONS = {"quick_gelu": "approx-gelu", "gelu": "gelu"}
HF_ACTIVATIONS = {v: k for k, v in ACTIVATIONS.items()}


def _activation(hf: dict[str, Any], tower: str) -> str:
    act = hf["hidden_act"]
    if act not in ACTIVATIONS:
        raise UnsupportedError(f"CLIP {tower} tower: hidden_act={act!r} has no NeMo equivalent "
                               f"(supported: {', '.join(sorted(ACTIVATIONS))})")
    return ACTIVATIONS[act]


def _tower_common(hf: dict[str, Any], tower: str, output_dim: int, precision: Any) -> dict[str, Any]:
    """The fields both tower sections share (Megatron transformer geometry)."""
    heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
    if hidden % heads:
        raise UnsupportedError(f"CLIP {tower} tower: hidden_size={hidden} is not a multiple of "
                               f"num_attention_heads={heads}")
    return {
        "precision": precision,
        "output_dim": output_dim,
        "position_embedding_type": "learned_absolute",
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": hidden,
        "ffn_hidden_size": int(hf["intermediate_size"]),
        "num_attention_heads": heads,
        "init_method_std": float(hf.get("initializer_range", 0.02)),
        "use_scaled_init_method": True,
        "hidden_dropout": 0.0,
        "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        "kv_channels": None,
        "apply_query_key_layer_scaling": True,
        "normalization": "layernorm",
        "layernorm_epsilon": float(hf.get("layer_norm_eps", 1e-5)),
        "do_layer_norm_weight_decay": False,
        "pre_process": True,
        "post_process": True,
        "persist_layer_norm": True,
        "activation": _activation(hf, tower),
        "sequence_parallel": False,
        "masked_softmax_fusion": True,
        "bias_dropout_add_fusion": True,
        "openai_gelu": False,
        "bias_activation_fusion": False,
        "megatron_legacy": True,
    }


def vision_section(hf_vision: dict[str, Any], *, output_dim: int, precision: Any = 32) -> dict[str, Any]:
    """NeMo's ``vision:`` section for an HF ``CLIPVisionConfig`` dict (also used by NeVA
    for its vision encoder)."""
    v = {**HF_VISION_DEFAULTS, **hf_vision}
    image, patch = int(v["image_size"]), int(v["patch_size"])
    if image % patch:
        raise UnsupportedError(f"CLIP vision tower: image_size={image} is not a multiple of patch_size={patch}")
    positions = (image // patch) ** 2 + 1  # patches + the class token
    return {
        **_tower_common(v, "vision", output_dim, precision),
        "patch_dim": patch,
        "img_h": image,
        "img_w": image,
        "image_mean": None,
        "image_std": None,
        "num_channels": int(v["num_channels"]),
        "drop_patch_rate": 0.0,
        "drop_path_rate": 0.0,
        "global_average_pool": False,
        "class_token_length": 1,
        "preprocess_layernorm": True,
        "encoder_seq_length": positions,
        "max_position_embeddings": positions,
    }


def text_section(hf_text: dict[str, Any], *, output_dim: int, precision: Any = 32) -> dict[str, Any]:
    """NeMo's ``text:`` section for an HF ``CLIPTextConfig`` dict."""
    t = {**HF_TEXT_DEFAULTS, **hf_text}
    seq = int(t["max_position_embeddings"])
    return {**_tower_common(t, "text", output_dim, precision),
            "encoder_seq_length": seq, "max_position_embeddings": seq}


def legacy_tower_dicts(hf: dict[str, Any]) -> None:
    """``text_config_dict`` / ``vision_config_dict`` duplicate ``text_config`` /
    ``vision_config``; transformers builds a tower config from the ``*_dict`` (its fields
    over the tower class's defaults) and lays all of it over the other spelling (transformers
    5.24 ``models/clip/configuration_clip.py`` lines 167-235, ``CLIPConfig.__post_init__``).
    Every field the translation reads must therefore come out the same from both: then the
    towers are read from ``text_config`` / ``vision_config`` and the ``*_dict`` travel with
    the rest of the source config; otherwise the config says two things and is refused by
    the field's name. The ``*_dict`` themselves are strict like the towers."""
    defaults = {"text_config": HF_TEXT_DEFAULTS, "vision_config": HF_VISION_DEFAULTS}
    for legacy, tower in LEGACY_TOWER_DICTS.items():
        given = hf.get(legacy)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise UnsupportedError(f"{legacy}={given!r} is not a tower config (a mapping like {tower})")
        refuse_unknown_keys(given, CLIP_TEXT_KEYS if tower == "text_config" else CLIP_VISION_KEYS, "clip",
                            legacy + ".")
        used = {**defaults[tower], **given}  # what transformers lays over the tower
        stated = {**defaults[tower], **(hf.get(tower) or {})}
        for key in TOWER_MATH_KEYS[tower]:
            if used[key] != stated[key]:
                raise UnsupportedError(f"{legacy}.{key}={used[key]!r} differs from {tower}.{key}={stated[key]!r} "
                                       f"(transformers takes the {legacy} value)")


def clip_config_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    refuse_unknown_keys(hf, CLIP_KEYS, "clip")
    refuse_unknown_keys(hf.get("text_config") or {}, CLIP_TEXT_KEYS, "clip", "text_config.")
    refuse_unknown_keys(hf.get("vision_config") or {}, CLIP_VISION_KEYS, "clip", "vision_config.")
    legacy_tower_dicts(hf)
    text = {**HF_TEXT_DEFAULTS, **(hf.get("text_config") or {})}
    vision = {**HF_VISION_DEFAULTS, **(hf.get("vision_config") or {})}
    output_dim = int(hf.get("projection_dim") or HF_CLIP_PROJECTION_DIM)
    precision = precision_of(hf)
    vocab = int(text["vocab_size"])
    return {
        "mcore_gpt": True,
        "transformer_engine": True,
        "precision": precision,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "output_dim": output_dim,
        "local_loss": False,
        "gather_with_grad": True,
        "vision": vision_section(vision, output_dim=output_dim, precision=precision),
        "text": text_section(text, output_dim=output_dim, precision=precision),
        "megatron_amp_O2": False,
        # The core replaces this with the packed tokenizer files when the folder has them.
        "tokenizer": {"library": "huggingface", "type": hf.get("_name_or_path") or DEFAULT_TOKENIZER,
                      "model": None, "vocab_file": None, "merge_file": None, "delimiter": None,
                      "sentencepiece_legacy": False},
        "make_vocab_size_divisible_by": largest_pow2_divisor(vocab),
        "nemo_convert": {"vocab_size": vocab},
    }


def _tower_to_hf(sec: dict[str, Any]) -> dict[str, Any]:
    act = sec.get("activation", "approx-gelu")
    if act not in HF_ACTIVATIONS:
        raise UnsupportedError(f"NeMo activation {act!r} has no HF CLIP equivalent")
    return {
        "hidden_size": int(sec["hidden_size"]),
        "intermediate_size": int(sec["ffn_hidden_size"]),
        "num_hidden_layers": int(sec["num_layers"]),
        "num_attention_heads": int(sec["num_attention_heads"]),
        "layer_norm_eps": float(sec.get("layernorm_epsilon", 1e-5)),
        "hidden_act": HF_ACTIVATIONS[act],
    }


def vision_config_to_hf(sec: dict[str, Any]) -> dict[str, Any]:
    """HF ``CLIPVisionConfig`` fields NeMo's ``vision:`` section determines."""
    return {**_tower_to_hf(sec), "image_size": int(sec["img_h"]), "patch_size": int(sec["patch_dim"]),
            "num_channels": int(sec.get("num_channels", 3))}


def _overlay(original: dict[str, Any], derived: dict[str, Any]) -> dict[str, Any]:
    """``original`` with the keys it has replaced by NeMo's values (sparse stays sparse)."""
    out = copy.deepcopy(original)
    for k, v in derived.items():
        if k in out:
            out[k] = v
    return out


def clip_config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    ours = cfg.get("nemo_convert") or {}
    vision = vision_config_to_hf(cfg["vision"])
    text = {**_tower_to_hf(cfg["text"]), "max_position_embeddings": int(cfg["text"]["max_position_embeddings"])}
    if ours.get("vocab_size") is not None:
        text["vocab_size"] = int(ours["vocab_size"])
    output_dim = int(cfg["output_dim"])
    original = ours.get("hf_config")
    if isinstance(original, dict):
        out = copy.deepcopy(original)
        if "projection_dim" in out:
            out["projection_dim"] = output_dim
        if isinstance(out.get("text_config"), dict):
            out["text_config"] = _overlay(out["text_config"], text)
        if isinstance(out.get("vision_config"), dict):
            out["vision_config"] = _overlay(out["vision_config"], vision)
        return out
    return {"architectures": ["CLIPModel"], "model_type": "clip", "projection_dim": output_dim,
            "logit_scale_init_value": 2.6592, "torch_dtype": dtype_name_of_precision(cfg.get("precision", 32)),
            "text_config": {"model_type": "clip_text_model", **text},
            "vision_config": {"model_type": "clip_vision_model", **vision}}
