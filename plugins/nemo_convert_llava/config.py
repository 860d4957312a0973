"""LLaVA config translation: HF ``config.json`` (``LlavaForConditionalGeneration``) ⇄ NeVA
``model_config.yaml``.

The language model's fields are the Llama family's (its translation is reused, not
copied); ``mm_cfg`` describes the vision encoder and the projector the way NeMo's
``convert_llava_hf_to_nemo.py`` does (HF CLIP tower by reference, ``mlp2x_gelu``
projector), and ``data`` carries the image-token count and conversation template.
Hub configs are often sparse (``text_config`` / ``vision_config`` with a handful of
keys): missing fields take transformers' defaults. The source ``config.json`` is kept
verbatim (by the core) so export restores it key for key.

HF LLaVA checkpoints spell their tensor names several ways; which one a checkpoint uses
is recorded in ``nemo_convert.hf_key_spelling`` so that export writes the same spelling.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families import refuse_unknown_keys
from nemo_convert.hf_config import hf_dtype_name, precision_of
from nemo_convert_clip.config import CLIP_VISION_KEYS, HF_VISION_DEFAULTS, vision_section
from nemo_convert_llama.config import llama_config_to_hf, llama_config_to_nemo

NEVA_TARGET = "nemo.collections.multimodal.models.multimodal_llm.neva.neva_model.MegatronNevaModel"

#: NeVA's special tokens, appended to the SentencePiece tokenizer on import (NeMo's
#: ``add_special_tokens_to_sentencepiece.py --is_userdefined`` recipe).
NEVA_EXTRA_TOKENS = tuple(f"<extra_id_{i}>" for i in range(8))

#: transformers' ``LlamaConfig`` defaults, for fields a sparse ``text_config`` leaves out.
HF_LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02}
#: ``LlavaConfig``'s vision tower when ``vision_config`` is absent (CLIP ViT-L/14-336).
HF_LLAVA_VISION_DEFAULTS: dict[str, Any] = {
    **HF_VISION_DEFAULTS, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
    "num_attention_heads": 16, "image_size": 336, "patch_size": 14, "projection_dim": 768}
HF_LLAVA_DEFAULTS: dict[str, Any] = {
    "image_token_index": 32000, "projector_hidden_act": "gelu", "vision_feature_select_strategy": "default",
    "vision_feature_layer": -2, "multimodal_projector_bias": True}

# -- tensor-name spellings ----------------------------------------------------------------
#: Every spelling of each part of an HF LLaVA checkpoint, most specific first:
#: * ``language_model.model.`` / ``language_model.lm_head.`` / ``vision_tower.vision_model.``
#:   / ``multi_modal_projector.``: llava-hf hub checkpoints and transformers 4.x saves;
#: * ``vision_tower.`` (no ``vision_model.``): what transformers 5 ``save_pretrained`` writes;
#: * ``model.language_model.`` / ``lm_head.`` / ``model.vision_tower.…`` /
#:   ``model.multi_modal_projector.``: the module layout of transformers ≥ 4.52
#:   (``state_dict()`` names), found in checkpoints saved from a raw state dict.
SPELLINGS: dict[str, tuple[str, ...]] = {
    "language_model": ("model.language_model.", "language_model.model."),
    "lm_head": ("language_model.lm_head.", "lm_head."),
    "vision_tower": ("model.vision_tower.vision_model.", "model.vision_tower.", "vision_tower.vision_model.",
                     "vision_tower."),
    "projector": ("model.multi_modal_projector.", "multi_modal_projector."),
}
#: The spelling that loads in transformers 4 and 5 alike (hub checkpoints).
HUB_SPELLING = {"language_model": "language_model.model.", "lm_head": "language_model.lm_head.",
                "vision_tower": "vision_tower.vision_model.", "projector": "multi_modal_projector."}


def detect_hf_key_spelling(keys: Iterable[str]) -> dict[str, str]:
    """The spelling each part of a checkpoint uses, from its tensor names (parts it lacks,
    e.g. a tower that is not there, get the hub spelling)."""
    keys = list(keys)
    out = {}
    for part, candidates in SPELLINGS.items():
        out[part] = next((c for c in candidates if any(k.startswith(c) for k in keys)), HUB_SPELLING[part])
    return out


def llava_source_options(hf: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """Import options read from the source's tensor names (for the core's source hook)."""
    return {"hf_key_spelling": detect_hf_key_spelling(keys)}


def default_spelling(hf: dict[str, Any]) -> dict[str, str]:
    """The spelling ``save_pretrained`` of the config's transformers version writes (used
    when the tensor names were not inspected)."""
    version = str(hf.get("transformers_version") or "4")
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 4
    return {**HUB_SPELLING, "vision_tower": "vision_tower." if major >= 5 else "vision_tower.vision_model."}


def _spelling(hf: dict[str, Any], given: dict[str, str] | None) -> dict[str, str]:
    out = {**default_spelling(hf), **(given or {})}
    for part, value in out.items():
        if part not in SPELLINGS or value not in SPELLINGS[part]:
            raise ConfigError(f"hf_key_spelling: {part}={value!r} is not a known LLaVA spelling "
                              f"({'; '.join(f'{p}: {sorted(v)}' for p, v in SPELLINGS.items())})")
    return out


# -- HF → NeVA ---------------------------------------------------------------------------
#: Top-level ``config.json`` keys the translation reads or knows to be harmless (the image
#: token id and sequence length are the processor's; ``ignore_index`` is the loss's); the
#: ``text_config`` is strict through the Llama table, ``vision_config`` through CLIP's keys.
LLAVA_KEYS = ("text_config", "vision_config", "projector_hidden_act", "multimodal_projector_bias",
              "vision_feature_layer", "vision_feature_select_strategy", "image_token_index", "image_seq_length",
              "ignore_index", "torch_dtype", "dtype", "tie_word_embeddings", "vocab_size")


def _strict(hf: dict[str, Any], text: dict[str, Any]) -> None:
    refuse_unknown_keys(hf, LLAVA_KEYS, "llava")
    refuse_unknown_keys(hf.get("vision_config") or {}, CLIP_VISION_KEYS, "llava", "vision_config.")
    if hf.get("tie_word_embeddings") and not text.get("tie_word_embeddings"):
        raise UnsupportedError("tie_word_embeddings=True while text_config.tie_word_embeddings is false")
    if hf.get("vocab_size") is not None and int(hf["vocab_size"]) != int(text["vocab_size"]):
        raise UnsupportedError(f"vocab_size={hf['vocab_size']} differs from text_config.vocab_size="
                               f"{text['vocab_size']}")


def _towers(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Top-level, text and vision configs with transformers' defaults filled in."""
    top = {**HF_LLAVA_DEFAULTS, **hf}
    text = {**HF_LLAMA_DEFAULTS, **(hf.get("text_config") or {})}
    vision_given = hf.get("vision_config")
    vision = {**(HF_VISION_DEFAULTS if vision_given else HF_LLAVA_VISION_DEFAULTS), **(vision_given or {})}
    _strict(hf, text)
    if text.get("model_type", "llama") != "llama":
        raise UnsupportedError(f"LLaVA with a {text['model_type']!r} language model is not supported "
                               "(supported: llama)")
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise UnsupportedError(f"LLaVA with a {vision['model_type']!r} vision tower is not supported "
                               "(supported: clip_vision_model)")
    if top["projector_hidden_act"] != "gelu":
        raise UnsupportedError(f"projector_hidden_act={top['projector_hidden_act']!r}: NeVA's mlp2x_gelu "
                               "projector uses exact GELU only")
    if not top["multimodal_projector_bias"]:
        raise UnsupportedError("multimodal_projector_bias=false: NeVA's projector always has biases")
    if not isinstance(top["vision_feature_layer"], int):
        raise UnsupportedError(f"vision_feature_layer={top['vision_feature_layer']!r}: NeVA selects one layer")
    if top["vision_feature_select_strategy"] not in ("default", "full"):
        raise UnsupportedError(f"vision_feature_select_strategy={top['vision_feature_select_strategy']!r}")
    return top, text, vision


def _default_tower_name(vision: dict[str, Any]) -> str:
    """What NeMo's HF LLaVA converter records: the OpenAI ViT-L/14 tower at the image size."""
    return "openai/clip-vit-large-patch14-336" if int(vision["image_size"]) == 336 else "openai/clip-vit-large-patch14"


def llava_config_to_nemo(hf: dict[str, Any], *, embed_vision_tower: bool | None = None,
                         reference_vision_tower: bool = False, hf_key_spelling: dict[str, str] | None = None,
                         vision_tower_name: str | None = None, conv_template: str = "v1") -> dict[str, Any]:
    """NeVA config for an HF LLaVA config.

    :param embed_vision_tower: store the vision tower's weights in the ``.nemo`` (under
        ``model.embedding.word_embeddings.vision_encoder.``) so that export can rebuild the
        complete HF checkpoint — the default: an import is exported back whole. NeMo
        itself ignores the stored copy while the tower is frozen (it loads the tower from
        ``from_pretrained``; Megatron-Core's ``dist_checkpointing.load`` leaves checkpoint
        keys the model does not ask for alone, ``StrictHandling.ASSUME_OK_UNEXPECTED``).
    :param reference_vision_tower: as NeMo's converter: only reference the tower by name
        (``embed_vision_tower=False``); such a ``.nemo`` cannot be exported to HF.
    :param hf_key_spelling: which spelling the checkpoint's tensor names use (see
        :data:`SPELLINGS`); detected from the tensor names when the core provides them.
    :param vision_tower_name: ``mm_cfg.vision_encoder.from_pretrained`` (HF id or path of the
        CLIP tower NeMo loads); default as NeMo's converter: OpenAI ViT-L/14(-336).
    :param conv_template: ``data.conv_template`` and ``mm_cfg.llm.model_type`` (NeMo's
        converter default ``v1``).
    """
    if reference_vision_tower and embed_vision_tower:
        raise ConfigError("reference_vision_tower and embed_vision_tower contradict each other (pass one)")
    embed = not reference_vision_tower if embed_vision_tower is None else bool(embed_vision_tower)
    top, text, vision = _towers(hf)
    cfg = llama_config_to_nemo(text)
    if hf_dtype_name(hf):
        cfg["precision"] = precision_of(hf)
    vsec = vision_section(vision, output_dim=int(vision["hidden_size"]), precision=cfg["precision"])
    patches = (int(vision["image_size"]) // int(vision["patch_size"])) ** 2
    full = top["vision_feature_select_strategy"] == "full"
    cfg["mm_cfg"] = {
        "llm": {"from_pretrained": None, "freeze": False, "model_type": conv_template},
        "vision_encoder": {
            "from_pretrained": vision_tower_name or _default_tower_name(vision),
            "from_hf": True,
            "patch_dim": vsec["patch_dim"],
            "crop_size": [vsec["img_h"], vsec["img_w"]],
            "hidden_size": vsec["hidden_size"],
            "vision_select_layer": int(top["vision_feature_layer"]),
            "vision_select_feature": "cls_patch" if full else "patch",
            "class_token_length": 1,
            "freeze": True,
            # The tower's geometry (NeMo reads it from the tower itself; we need it to
            # describe the embedded weights).
            "num_layers": vsec["num_layers"],
            "num_attention_heads": vsec["num_attention_heads"],
            "ffn_hidden_size": vsec["ffn_hidden_size"],
            "num_channels": vsec["num_channels"],
            "max_position_embeddings": vsec["max_position_embeddings"],
        },
        "pretrain_mm_mlp_adapter": None,
        "mm_mlp_adapter_type": "mlp2x_gelu",
        "use_im_start_end": False,
    }
    cfg["data"] = {
        "num_workers": 8,
        "dataloader_type": "cyclic",
        "data_path": None,
        "lazy_preprocess": True,
        "is_multimodal": True,
        "media_type": "image",
        "sep_image_conv_front": False,
        "image_token_len": patches + (1 if full else 0),
        "conv_template": conv_template,
        "image_folder": None,
        "image_aspect_ratio": "square",
    }
    ours = cfg.setdefault("nemo_convert", {})
    ours["embed_vision_tower"] = embed
    ours["hf_key_spelling"] = _spelling(hf, hf_key_spelling)
    return cfg


# -- NeVA → HF ---------------------------------------------------------------------------
class VisionTowerNotEmbedded(UnsupportedError):
    """Export of a NeVA whose vision tower is referenced by name, not stored."""


def llava_config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    ours = cfg.get("nemo_convert") or {}
    if not ours.get("embed_vision_tower"):
        ref = (cfg.get("mm_cfg") or {}).get("vision_encoder", {}).get("from_pretrained")
        raise VisionTowerNotEmbedded(
            f"this NeVA .nemo references its vision tower (mm_cfg.vision_encoder.from_pretrained = {ref!r}) "
            "instead of embedding it, so it cannot be exported to a complete HF LLaVA checkpoint; re-import "
            "the HF LLaVA without --reference-vision-tower (the tower is embedded by default, import option "
            "embed_vision_tower)")
    original = ours.get("hf_config")
    if not isinstance(original, dict):
        raise ConfigError("this NeVA .nemo has no record of its HF config (nemo_convert.hf_config), which "
                          "export needs to rebuild the LLaVA config")
    out = copy.deepcopy(original)
    # The language model: the Llama family's own export, applied to the text config.
    text_cfg = copy.deepcopy(cfg)
    text_cfg["nemo_convert"] = {**ours, "hf_config": copy.deepcopy(original.get("text_config") or {})}
    text = llama_config_to_hf(text_cfg)
    if "text_config" in out:
        out["text_config"] = text
    select = (cfg.get("mm_cfg") or {}).get("vision_encoder", {}).get("vision_select_layer")
    if "vision_feature_layer" in out and select is not None:
        out["vision_feature_layer"] = int(select)
    return out
