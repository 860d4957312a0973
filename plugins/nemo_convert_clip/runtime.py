"""What NeMo's ``MegatronCLIPModel`` reads at construction beyond the architecture: the
runtime keys of NeMo's ``examples/multimodal/vision_language_foundation/clip/conf/
megatron_clip_VIT-L-14.yaml`` (NVIDIA/NeMo 379b87679df2fb44509687b18be842ace70f0718), declared on
the family's record (``NemoTarget.runtime_defaults``) and added to the written
``model_config.yaml`` where absent (:mod:`nemo_convert.convert.nemo_defaults`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_convert.families.nemo_runtime import megatron_base_defaults, optim_section


def _clip_tower() -> dict[str, Any]:
    """Runtime keys both towers of ``megatron_clip_VIT-L-14.yaml`` carry, less its
    ``use_cpu_initialization: False``: a tower key wins over the top-level one in the
    tower's ``TransformerConfig``, and False there makes Megatron allocate on the GPU."""
    return {
        "activations_checkpoint_granularity": None,
        "activations_checkpoint_method": None,
        "activations_checkpoint_num_layers": None,
        "sequence_parallel": False,
        "native_amp_init_scale": 4294967296,
        "native_amp_growth_interval": 1000,
        "hysteresis": 2,
        "fp32_residual_connection": False,
        "fp16_lm_cross_entropy": False,
        "onnx_safe": False,
        "gradient_accumulation_fusion": False,
    }


def clip_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``MegatronCLIPModel``: ``megatron_clip_VIT-L-14.yaml``'s runtime keys (its dataset
    paths are examples of the training recipe and are not written)."""
    text = {**_clip_tower(), "num_micro_batches_with_partial_activation_checkpoints": None,
            "activations_checkpoint_layers_per_pipeline": None, "fp8": False, "fp8_e4m3": False,
            "fp8_hybrid": False, "fp8_margin": 0, "fp8_interval": 1, "fp8_amax_history_len": 1,
            "fp8_amax_compute_algo": "most_recent", "use_emha": False}
    return {
        **megatron_base_defaults(cfg),
        "restore_from_pretrained": None,
        "local_loss": False,
        "gather_with_grad": True,
        "vision": _clip_tower(),
        "text": text,
        "data": {"num_workers": 8, "imagenet_val": None},
        "optim": optim_section(1e-3, 0.2, (0.9, 0.98), 2000, 0, 1e-5),
    }


__all__ = ["clip_defaults"]
