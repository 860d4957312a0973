"""The runtime keys NeMo's Megatron model classes read at construction, as NeMo's example
training configs set them — the shared pieces, for the core and for family plugins.

NeMo restores a ``.nemo`` by building its model class from ``model_config.yaml`` in
OmegaConf *struct* mode, where reading a missing key by attribute raises. Its Megatron
models read some keys that way at construction (``cfg.optim.get('name')`` in
``MegatronBaseModel.__init__``, …), so a config that only describes the architecture does
not restore. NeMo's own converters avoid this by starting from an example training config
(``megatron_llama_config.yaml``, …) and overriding the architecture.

Here are the runtime parts every Megatron model needs (:func:`megatron_base_defaults`) and
those of NeMo's GPT class (:func:`gpt_defaults`, ``MegatronGPTModel``, which every GPT family
and third-party GPT families write), with the pieces a family plugin composes its own
class's defaults from (:func:`optim_section`, :func:`gpt_runtime`): a family whose NeMo class
needs more declares them on its record (``NemoTarget.runtime_defaults``: CLIP's
``MegatronCLIPModel``, NeVA's ``MegatronNevaModel``). Architecture keys are never defaulted:
they are the family's to write.

Values are those of NeMo's example configs at NVIDIA/NeMo
379b87679df2fb44509687b18be842ace70f0718 (``examples/nlp/language_modeling/conf/
megatron_llama_config.yaml``), with the converters' own override ``use_cpu_initialization: True``
(``scripts/checkpoint_converters/convert_llama_hf_to_nemo.py`` L92). Interpolations of those
files (``${model.encoder_seq_length}``, …) are written as the values they stand for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: NeMo's GPT model class.
GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"

#: ``defaults(cfg) -> runtime keys`` of one NeMo model class, given the architecture config.
RuntimeDefaults = Callable[[dict[str, Any]], dict[str, Any]]


def optim_section(lr: float, weight_decay: float, betas: tuple[float, float], warmup_steps: int,
           constant_steps: int, min_lr: float) -> dict[str, Any]:
    """NeMo's usual ``optim`` section: fused Adam with cosine annealing."""
    return {"name": "fused_adam", "lr": lr, "weight_decay": weight_decay, "betas": list(betas),
            "sched": {"name": "CosineAnnealing", "warmup_steps": warmup_steps,
                      "constant_steps": constant_steps, "min_lr": min_lr}}


def nsys_profile() -> dict[str, Any]:
    return {"enabled": False, "start_step": 10, "end_step": 10, "ranks": [0], "gen_shape": False}


def megatron_base_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What every Megatron model (``MegatronBaseModel``) needs: ``optim`` (read by attribute
    in ``__init__``), CPU initialization (else ``__init__`` calls ``torch.cuda.set_device``),
    and the runtime keys all three example configs share."""
    return {
        "virtual_pipeline_model_parallel_size": None,
        "use_cpu_initialization": True,
        "seed": 1234,
        "resume_from_checkpoint": None,
        "apex_transformer_log_level": 30,
        "gradient_as_bucket_view": True,
        "grad_allreduce_chunk_size_mb": 125,
        "grad_div_ar_fusion": True,
        "nsys_profile": nsys_profile(),
        "optim": optim_section(2e-4, 0.01, (0.9, 0.98), 500, 50000, 2e-5),
    }


def gpt_runtime() -> dict[str, Any]:
    """The runtime keys of ``megatron_llama_config.yaml``'s ``model:`` section."""
    return {
        "restore_from_path": None,
        "restore_from_ckpt": None,
        "use_scaled_init_method": True,
        "do_layer_norm_weight_decay": False,
        "pre_process": True,
        "post_process": True,
        "headscale": False,
        "openai_gelu": False,
        "attention_type": "multihead",
        "overlap_p2p_comm": False,
        "batch_p2p_comm": True,
        "native_amp_init_scale": 4294967296,
        "native_amp_growth_interval": 1000,
        "hysteresis": 2,
        "fp32_residual_connection": False,
        "fp16_lm_cross_entropy": False,
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_add_fusion": False,
        "get_attention_mask_from_fusion": True,
        "onnx_safe": False,
        "sync_batch_comm": False,
        "activations_checkpoint_granularity": None,
        "activations_checkpoint_method": None,
        "activations_checkpoint_num_layers": None,
        "num_micro_batches_with_partial_activation_checkpoints": None,
        "activations_checkpoint_layers_per_pipeline": None,
        "sequence_parallel": False,
        "fp8": False,
        "fp8_e4m3": False,
        "fp8_hybrid": True,
        "fp8_margin": 0,
        "fp8_interval": 1,
        "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max",
        "reduce_amax": True,
        "use_emha": False,
    }


def gpt_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``MegatronGPTModel`` (Llama, GPT): ``megatron_llama_config.yaml``'s runtime keys."""
    data: dict[str, Any] = {
        "index_mapping_dir": None,
        "data_impl": "mmap",
        "splits_string": "900,50,50",
        "seq_length": cfg.get("encoder_seq_length"),
        "skip_warmup": True,
        "num_workers": 2,
        "dataloader_type": "single",
        "reset_position_ids": False,
        "reset_attention_mask": False,
        "eod_mask_loss": False,
        "validation_drop_last": True,
        "no_seqlen_plus_one_input_tokens": False,
        "pad_samples_to_global_batch_size": False,
        "shuffle_documents": True,
    }
    return {**megatron_base_defaults(cfg), **gpt_runtime(), "data": data}


#: NeMo's shared classes → their defaults (a family declares its own class's on its record).
SHARED_DEFAULTS: dict[str, RuntimeDefaults] = {GPT_TARGET: gpt_defaults}

__all__ = ["GPT_TARGET", "SHARED_DEFAULTS", "RuntimeDefaults", "gpt_defaults", "gpt_runtime", "megatron_base_defaults",
           "nsys_profile", "optim_section"]
