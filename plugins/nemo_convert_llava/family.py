"""LLaVA ⇄ NeVA, composed from the other families' mappings (nothing here is a copy).

* the language model is the Llama family's mapping under the HF prefix ``language_model.``
  (NeVA keeps the GPT names: ``decoder.layers.{i}.…``, ``embedding.word_embeddings.…``);
* the projector (``multi_modal_projector.linear_1/2``) becomes NeVA's ``mlp2x_gelu`` adapter,
  ``embedding.word_embeddings.adapter_layer.mm_projector_adapter.mm_projector.{0,2}``;
* the vision tower is the CLIP family's vision tower. NeVA attaches the HF
  ``CLIPVisionModel`` itself (``mm_cfg.vision_encoder.from_hf``) at
  ``embedding.word_embeddings.vision_encoder``, so when the tower is embedded its tensors
  keep their HF names there (``…vision_encoder.vision_model.encoder.layers.{i}.…``);
  when it is not, the CLIP tower's tensors are declared droppable (and reported).

HF checkpoints spell these parts several ways (see :data:`config.SPELLINGS`); the mapping
is built for the spelling recorded in the config, so export writes the source's spelling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_convert import CommandOption, FamilyOptions, HFSide, ModelFamily, NemoTarget
from nemo_convert.families.fields import HIDDEN
from nemo_convert.mapping import Mapping, Rename, cfg_get
from nemo_convert_clip.family import clip_vision_tower_mapping
from nemo_convert_llama.family import llama_mapping
from nemo_convert_llava.runtime import neva_defaults, neva_restore_warnings
from nemo_convert_llava.config import (HUB_SPELLING, NEVA_EXTRA_TOKENS, NEVA_TARGET, llava_config_to_hf,
                                       llava_config_to_nemo, llava_source_options)

#: NeVA's projector adapter (logical name, no ``model.``).
PROJECTOR = "embedding.word_embeddings.adapter_layer.mm_projector_adapter.mm_projector."
#: Where NeVA attaches the HF vision tower (an HF ``CLIPVisionModel``: ``vision_model.…``).
VISION_ENCODER = "embedding.word_embeddings.vision_encoder.vision_model."
VISION_CFG = "mm_cfg.vision_encoder."


def _prefix_swap(pairs: dict[str, str]) -> Callable[[str], str]:
    def fn(name: str) -> str:
        for old, new in pairs.items():
            if name.startswith(old):
                return new + name[len(old):]
        return name
    return fn


# -- the parts ---------------------------------------------------------------------------
def vision_tower_mapping(spelling: str, embedded: bool) -> Mapping:
    """The CLIP vision tower's tensors, kept under their HF names (NeVA's ``from_hf`` tower),
    or declared droppable when the tower is not embedded."""
    tower = clip_vision_tower_mapping()
    names = tower.hf_names()
    if embedded:
        inner = Mapping(tuple(Rename(n, n) for n in names), layers=tower.layers, drop_hf=tower.drop_hf)
        return inner.nested(hf_prefix=spelling, nemo_prefix=VISION_ENCODER, cfg_prefix=VISION_CFG)
    return Mapping((), layers=tower.layers, drop_hf=(*names, *tower.drop_hf)).nested(
        hf_prefix=spelling, cfg_prefix=VISION_CFG)


def projector_mapping() -> Mapping:
    """HF ``LlavaMultiModalProjector`` (linear_1, GELU, linear_2) ⇄ NeVA's ``mlp2x_gelu``
    adapter (``Sequential(Linear, GELU, Linear)``: indices 0 and 2)."""
    vh = VISION_CFG + "hidden_size"  # the vision tower's: a config path (the spec is the language model's)
    return Mapping((
        Rename("linear_1.weight", PROJECTOR + "0.weight", shape=(HIDDEN, vh)),
        Rename("linear_1.bias", PROJECTOR + "0.bias", shape=(HIDDEN,)),
        Rename("linear_2.weight", PROJECTOR + "2.weight", shape=(HIDDEN, HIDDEN)),
        Rename("linear_2.bias", PROJECTOR + "2.bias", shape=(HIDDEN,)),
    ))


def llava_mapping(cfg: dict[str, Any]) -> Mapping:
    """HF LLaVA names (in the recorded spelling) ⇄ NeVA names (logical, no ``model.``)."""
    spelling = {**HUB_SPELLING, **(cfg_get(cfg, "nemo_convert.hf_key_spelling") or {})}
    lm = llama_mapping(cfg).nested(hf_prefix="language_model.")
    canonical = {"language_model.model.": spelling["language_model"],
                 "language_model.lm_head.": spelling["lm_head"]}
    if any(k != v for k, v in canonical.items()):
        lm = lm.respelled_hf(_prefix_swap(canonical))
    projector = projector_mapping().nested(hf_prefix=spelling["projector"])
    vision = vision_tower_mapping(spelling["vision_tower"], bool(cfg_get(cfg, "nemo_convert.embed_vision_tower")))
    return lm.combine(projector, vision)


LLAVA = ModelFamily(
    name="llava",
    hf_architectures=("LlavaForConditionalGeneration",),
    hf_model_types=("llava",),
    mapping=llava_mapping,
    config_to_nemo=llava_config_to_nemo,
    config_to_hf=llava_config_to_hf,
    nemo=NemoTarget(
        NEVA_TARGET,
        # NeVA is a MegatronGPTModel with mcore_gpt; its sharded_state_dict is not None, so
        # NeMo saves it as a torch_dist checkpoint (model_weights/).
        default_layout="dist",
        # NeVA saves its HF tower through make_sharded_tensors_for_checkpoint: a key per layer.
        dist_unstacked=("embedding.word_embeddings.vision_encoder.",),
        runtime_defaults=neva_defaults,
        restore_warnings=neva_restore_warnings,
    ),
    hf=HFSide(
        model_class="LlavaForConditionalGeneration",
        tokenizer_files=("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                         "added_tokens.json", "preprocessor_config.json", "processor_config.json",
                         "chat_template.json", "chat_template.jinja"),
        add_tokens=NEVA_EXTRA_TOKENS,
    ),
    options=FamilyOptions(
        keys=("embed_vision_tower", "reference_vision_tower", "hf_key_spelling", "vision_tower_name",
              "conv_template"),
        cli=(CommandOption("import", "--embed-vision-tower",
                           "LLaVA: store the vision tower in the .nemo (the default: self-contained, export "
                           "reproduces the full HF checkpoint). Same as --option embed_vision_tower=true"),
             CommandOption("import", "--reference-vision-tower",
                           "LLaVA: as NeMo's converter, only name the vision tower (mm_cfg.vision_encoder."
                           "from_pretrained) instead of storing it; such a .nemo cannot be exported to HF"),),
        from_source=llava_source_options,
    ),
    description="LLaVA 1.5 (HF LlavaForConditionalGeneration ⇄ NeVA: Llama + CLIP tower + mlp2x_gelu projector)",
)
