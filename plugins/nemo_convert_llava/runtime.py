"""What NeMo's ``MegatronNevaModel`` reads at construction beyond the architecture: the
runtime keys of NeMo's ``examples/multimodal/multimodal_llm/neva/conf/neva_config.yaml``
(NVIDIA/NeMo 379b87679df2fb44509687b18be842ace70f0718; the converter's own
``use_cpu_initialization: True``, ``scripts/checkpoint_converters/convert_llava_hf_to_nemo.py``
L230), declared on the family's record (``NemoTarget.runtime_defaults``) and added to the
written ``model_config.yaml`` where absent (:mod:`nemo_convert.convert.nemo_defaults`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_convert.families.nemo_runtime import gpt_runtime, megatron_base_defaults, optim_section


def neva_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``MegatronNevaModel``: a GPT model with ``neva_config.yaml``'s values where they differ.
    ``use_flash_attention`` (True there) is left out: ``MegatronBaseModel`` refuses it
    without the flash-attn package. ``energon`` (a data-loader recipe) is left out too."""
    out = {**megatron_base_defaults(cfg), **gpt_runtime()}
    out.update({
        "context_parallel_size": 1,
        "fp8_hybrid": False,
        "fp8_amax_history_len": 1,
        "fp8_amax_compute_algo": "most_recent",
        "megatron_legacy": False,
        "async_grad_allreduce": False,
        "optim": optim_section(2e-3, 0.0, (0.9, 0.95), 140, 0, 2e-5),
    })
    mm_llm = (cfg.get("mm_cfg") or {}).get("llm") if isinstance(cfg.get("mm_cfg"), Mapping) else None
    out["data"] = {
        "packed_sequence": False,
        "num_workers": 8,
        "dataloader_type": "cyclic",
        "data_path": None,
        "global_batch_size": cfg.get("global_batch_size"),
        "micro_batch_size": cfg.get("micro_batch_size"),
        "concat_sampling_probabilities": None,
        "lazy_preprocess": True,
        "is_multimodal": True,
        "media_type": "image",
        "sep_image_conv_front": False,
        "conv_template": mm_llm.get("model_type") if isinstance(mm_llm, Mapping) else None,
        "image_folder": None,
        "image_aspect_ratio": "square",
    }
    return out


def neva_restore_warnings(cfg: Mapping[str, Any]) -> list[str]:
    """What ``MegatronNevaModel`` loads from outside the ``.nemo``: a vision tower that the
    config only names (``mm_cfg.vision_encoder.from_hf`` with ``from_pretrained``, NeMo's
    converter layout), whose config and image processor NeMo fetches by that hub id or
    folder when it restores the file."""
    mm = cfg.get("mm_cfg")
    tower = mm.get("vision_encoder") if isinstance(mm, Mapping) else None
    if isinstance(tower, Mapping) and tower.get("from_hf") and tower.get("from_pretrained"):
        return [f"mm_cfg.vision_encoder.from_pretrained={tower['from_pretrained']!r}: NeMo loads the vision "
                "tower's config and image processor from this hub id or folder when it restores the .nemo"]
    return []


__all__ = ["neva_defaults", "neva_restore_warnings"]
