"""The ``model_config.yaml`` keys NeMo's model classes expect, keyed by the NeMo target class.

NeMo restores a ``.nemo`` by building its model class from ``model_config.yaml`` in
OmegaConf *struct* mode, where reading a missing key by attribute raises. Its Megatron
models read some keys that way at construction (``cfg.optim.get('name')`` in
``MegatronBaseModel.__init__``; ``cfg.mm_cfg.llm.freeze`` in NeVA, …), so a config that
only describes the architecture does not restore. NeMo's own converters avoid this by
starting from an example training config (``megatron_llama_config.yaml``,
``megatron_clip_VIT-L-14.yaml``, ``neva_config.yaml``) and overriding the architecture.

This module holds the runtime part of those example configs — optimizer, data loader,
profiling, fusion, fp8 and initialization settings — per target class.
:func:`complete_nemo_config` adds every such key a config lacks and never changes a
value it has, so a family's own keys win at import and a resharded or training
checkpoint keeps what it had. Architecture keys (sizes, norms, activations, biases,
positions, the tokenizer) are never defaulted here: they are the family's to write.

Values are those of NeMo's example configs at NVIDIA/NeMo
379b87679df2fb44509687b18be842ace70f0718 (``examples/nlp/language_modeling/conf/
megatron_llama_config.yaml``, ``examples/multimodal/vision_language_foundation/clip/conf/
megatron_clip_VIT-L-14.yaml``, ``examples/multimodal/multimodal_llm/neva/conf/
neva_config.yaml``), with the converters' own override ``use_cpu_initialization: True``
(``scripts/checkpoint_converters/convert_llama_hf_to_nemo.py`` L92,
``convert_llava_hf_to_nemo.py`` L230). Interpolations of those files
(``${model.encoder_seq_length}``, …) are written as the values they stand for.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"
CLIP_TARGET = ("nemo.collections.multimodal.models.vision_language_foundation.clip."
               "megatron_clip_models.MegatronCLIPModel")
NEVA_TARGET = "nemo.collections.multimodal.models.multimodal_llm.neva.neva_model.MegatronNevaModel"

#: Sections added whole or not at all: merging defaults into a source's own optimizer
#: (say, a scheduler it does not have) would change its meaning.
ATOMIC_SECTIONS = frozenset({"optim"})

Defaults = Callable[[Mapping[str, Any]], dict[str, Any]]


def _optim(lr: float, weight_decay: float, betas: tuple[float, float], warmup_steps: int,
           constant_steps: int, min_lr: float) -> dict[str, Any]:
    """NeMo's usual ``optim`` section: fused Adam with cosine annealing."""
    return {"name": "fused_adam", "lr": lr, "weight_decay": weight_decay, "betas": list(betas),
            "sched": {"name": "CosineAnnealing", "warmup_steps": warmup_steps,
                      "constant_steps": constant_steps, "min_lr": min_lr}}


def _nsys_profile() -> dict[str, Any]:
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
        "nsys_profile": _nsys_profile(),
        "optim": _optim(2e-4, 0.01, (0.9, 0.98), 500, 50000, 2e-5),
    }


def _gpt_runtime() -> dict[str, Any]:
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
    return {**megatron_base_defaults(cfg), **_gpt_runtime(), "data": data}


def neva_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``MegatronNevaModel``: a GPT model with ``neva_config.yaml``'s values where they differ.
    ``use_flash_attention`` (True there) is left out: ``MegatronBaseModel`` refuses it
    without the flash-attn package. ``energon`` (a data-loader recipe) is left out too."""
    out = {**megatron_base_defaults(cfg), **_gpt_runtime()}
    out.update({
        "context_parallel_size": 1,
        "fp8_hybrid": False,
        "fp8_amax_history_len": 1,
        "fp8_amax_compute_algo": "most_recent",
        "megatron_legacy": False,
        "async_grad_allreduce": False,
        "optim": _optim(2e-3, 0.0, (0.9, 0.95), 140, 0, 2e-5),
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
        "optim": _optim(1e-3, 0.2, (0.9, 0.98), 2000, 0, 1e-5),
    }


#: NeMo target class → its defaults. A family with another Megatron target gets
#: :func:`megatron_base_defaults`; add a row here for a new NeMo class.
DEFAULTS: dict[str, Defaults] = {
    GPT_TARGET: gpt_defaults,
    CLIP_TARGET: clip_defaults,
    NEVA_TARGET: neva_defaults,
}


def defaults_for(target: str | None) -> Defaults | None:
    """The defaults of NeMo class ``target``: its row of :data:`DEFAULTS`, the Megatron base
    for any other ``…Megatron*`` class, None for a class we know nothing about."""
    if not target:
        return None
    if target in DEFAULTS:
        return DEFAULTS[target]
    if target.rsplit(".", 1)[-1].startswith("Megatron"):
        return megatron_base_defaults
    return None


def _fill(cfg: dict[str, Any], defaults: Mapping[str, Any], where: str, added: list[str]) -> None:
    for key, value in defaults.items():
        path = f"{where}{key}"
        if key not in cfg:
            cfg[key] = copy.deepcopy(value)
            added.append(path)
        elif isinstance(value, Mapping) and isinstance(cfg[key], dict) and key not in ATOMIC_SECTIONS:
            _fill(cfg[key], value, path + ".", added)


def complete_nemo_config(cfg: dict[str, Any]) -> list[str]:
    """Add, in place, every default key of ``cfg['target']`` that ``cfg`` lacks (inside
    existing sections too, except :data:`ATOMIC_SECTIONS`); never change a value ``cfg``
    has, ``None`` included. Returns the dotted paths added."""
    make = defaults_for(cfg.get("target") if isinstance(cfg.get("target"), str) else None)
    added: list[str] = []
    if make is not None:
        _fill(cfg, make(cfg), "", added)
    return added


def _known_target(cfg: Mapping[str, Any]) -> bool:
    return defaults_for(cfg.get("target") if isinstance(cfg.get("target"), str) else None) is not None


def restore_warnings(cfg: Mapping[str, Any]) -> list[str]:
    """One line for each thing NeMo's ``restore_from`` loads from outside the ``.nemo`` to
    build the model ``cfg`` describes: a Hugging Face tokenizer or vision tower named by
    hub id or folder (NeMo resolves neither inside the archive)."""
    if not _known_target(cfg):
        return []
    out: list[str] = []
    mm = cfg.get("mm_cfg")
    tower = mm.get("vision_encoder") if isinstance(mm, Mapping) else None
    if isinstance(tower, Mapping) and tower.get("from_hf") and tower.get("from_pretrained"):
        out.append(f"mm_cfg.vision_encoder.from_pretrained={tower['from_pretrained']!r}: NeMo loads the vision "
                   "tower's config and image processor from this hub id or folder when it restores the .nemo")
    tok = cfg.get("tokenizer")
    if isinstance(tok, Mapping) and tok.get("library") == "huggingface":
        out.append(f"tokenizer: NeMo builds a Hugging Face tokenizer from tokenizer.type={tok.get('type')!r} "
                   "(a hub id it needs online or in the HF cache, or a folder that must still exist), not from "
                   "the tokenizer files packed in the .nemo; see 'Compatibility with NeMo' in docs/formats.md")
    return out


def restore_notes(cfg: Mapping[str, Any]) -> list[str]:
    """What keeps NeMo from restoring the ``.nemo`` at all, for the report's notes: no
    tokenizer section (NeMo sizes a Megatron model's vocabulary from its tokenizer)."""
    if _known_target(cfg) and not isinstance(cfg.get("tokenizer"), Mapping):
        return ["no tokenizer files in the source, so the .nemo has no tokenizer section; NeMo sizes a Megatron "
                "model's vocabulary from its tokenizer and cannot restore the file without one"]
    return []
