"""Builders of tiny random multimodal HF models: ``CLIPModel`` and
``LlavaForConditionalGeneration`` (a Llama + a CLIP vision tower). Every parameter is
randomised (norms, class token and ``logit_scale`` too) so a swapped tensor is caught."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from tiny_models import randomize_, write_sentencepiece

CLIP_TEXT: dict[str, Any] = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "max_position_embeddings": 16, "bos_token_id": 0,
                             "eos_token_id": 2, "pad_token_id": 1}
CLIP_VISION: dict[str, Any] = {"hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 3,
                               "num_attention_heads": 4, "image_size": 28, "patch_size": 14}

LLAVA_TEXT: dict[str, Any] = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                              "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
LLAVA_VISION: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
                                "num_attention_heads": 4, "image_size": 28, "patch_size": 14, "projection_dim": 16}
#: id of ``<image>`` in the tiny LLaVA (inside the 320-row embedding, above the 300 pieces
#: of the SentencePiece model, like llava-1.5's 32000 above Llama's 32000 pieces).
LLAVA_IMAGE_TOKEN = 310
#: image tokens one 28×28 image becomes: (28/14)² patches (the class token is dropped).
LLAVA_IMAGE_TOKENS = 4


def make_tiny_clip(folder: str, *, dtype: torch.dtype = torch.float32, seed: int = 0,
                   text: dict[str, Any] | None = None, vision: dict[str, Any] | None = None,
                   **overrides: Any) -> str:
    """Save a random ``CLIPModel`` in ``folder`` (with a small ``tokenizer_config.json`` so the
    tokenizer artifacts travel too)."""
    from transformers import CLIPConfig, CLIPModel

    cfg = CLIPConfig(text_config={**CLIP_TEXT, **(text or {})}, vision_config={**CLIP_VISION, **(vision or {})},
                     projection_dim=overrides.pop("projection_dim", 24), **overrides)
    torch.manual_seed(seed)
    model = CLIPModel(cfg)
    randomize_(model, seed)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": cfg.text_config.max_position_embeddings, "tokenizer_class": "CLIPTokenizer"},
                  f, indent=2)
    return folder


def make_tiny_llava(folder: str, *, dtype: torch.dtype = torch.float32, seed: int = 0,
                    text: dict[str, Any] | None = None, vision: dict[str, Any] | None = None,
                    tokenizer: bool = True, **overrides: Any) -> str:
    """Save a random ``LlavaForConditionalGeneration`` (and a small SentencePiece tokenizer)
    in ``folder``, as transformers' ``save_pretrained`` writes it."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    cfg = LlavaConfig(text_config=LlamaConfig(**{**LLAVA_TEXT, **(text or {})}),
                      vision_config=CLIPVisionConfig(**{**LLAVA_VISION, **(vision or {})}),
                      image_token_index=overrides.pop("image_token_index", LLAVA_IMAGE_TOKEN), **overrides)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg)
    randomize_(model, seed)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        write_sentencepiece(os.path.join(folder, "tokenizer.model"), vocab_size=300)
    return folder


def rename_safetensors_keys(folder: str, renames: list[tuple[str, str]]) -> None:
    """Rewrite every ``*.safetensors`` of ``folder`` (and the index, if any) with key prefixes
    replaced: ``renames`` is a list of ``(old_prefix, new_prefix)``, first match wins."""
    from safetensors.torch import load_file, save_file

    def respell(key: str) -> str:
        for old, new in renames:
            if key.startswith(old):
                return new + key[len(old):]
        return key

    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            tensors = load_file(path)
            save_file({respell(k): v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
        elif name.endswith(".safetensors.index.json"):
            with open(path) as f:
                index = json.load(f)
            index["weight_map"] = {respell(k): v for k, v in index["weight_map"].items()}
            with open(path, "w") as f:
                json.dump(index, f, indent=2)
