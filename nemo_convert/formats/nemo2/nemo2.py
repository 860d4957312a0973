"""NeMo 2.0 checkpoint folders: ``weights/`` (a Megatron-Core dist checkpoint with the
``module.`` prefix) and ``context/`` (``model.yaml``, ``nemo_tokenizer/``, …).

The model config is fiddle-style YAML (``_target_`` keys); it is read with a safe loader
that turns any Python tag into an inert string, and translated into NeMo 1 field names so
that the model families handle both generations with one config translation.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from nemo_convert.errors import ConfigError, InputError, UnsupportedError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.sections import join_sections
from nemo_convert.formats.megatron.megatron_config import provider_to_nemo
from nemo_convert.formats.megatron.providers import MLA_PROVIDER, ProviderTable
from nemo_convert.formats.nemo.nemo_checkpoint import KindsFor, NemoCheckpoint, VocabTrimView
from nemo_convert.formats.io.tar_archive import DirectoryContainer
from nemo_convert.mapping.rules import Parallel
from nemo_convert.tensors.views import PrefixView


class _InertLoader(yaml.SafeLoader):
    """SafeLoader that keeps unknown tags (``!!python/...``) as plain strings: nothing is
    imported or called."""


def _inert(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> str:
    return f"<tag {node.tag}>"


_InertLoader.add_multi_constructor("", _inert)  # type: ignore[no-untyped-call]


def load_context_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_InertLoader)  # noqa: S506 - inert loader, never constructs objects
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, TypeError, AttributeError, KeyError,
            OverflowError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a readable YAML file ({first})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a YAML mapping")
    return data


def _target(v: Any) -> str:
    return v.get("_target_", "") if isinstance(v, dict) else str(v or "")


_DEEPSEEK = "nemo.collections.llm.gpt.model.deepseek."
#: NeMo 2's GPT-OSS configs (NeMo 8cfedd7 ``gpt_oss.py`` lines 45–103): YaRN as
#: ``rotary_scaling_factor: 32`` and ``yarn_original_max_position_embeddings: 131072`` (lines 64–70),
#: while ``HFGPTOSSExporter.config`` (lines 510–518) writes transformers' GptOssConfig defaults
#: (factor 32, original 4096): refused by name.
_GPT_OSS = "nemo.collections.llm.gpt.model.gpt_oss."
_FN = "torch.nn.functional."
#: NeMo 2's DeepSeek config classes (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/deepseek.py``:
#: ``DeepSeekConfig`` lines 58–130, ``DeepSeekV3Config`` lines 181–205): Megatron-Core
#: ``MLATransformerConfig`` subclasses, whose ``model.yaml`` holds only the arguments given
#: (``HFDeepSeekImporter.config``, lines 405–453, passes no RoPE field), so an absent field
#: means the class default — YaRN (MLATransformerConfig's ``rope_type: yarn``, original
#: context 4096, betas 32 / 1) at ``rotary_scaling_factor`` 40 with ``mscale`` and
#: ``mscale_all_dim`` 1: DeepSeek-V3's. The fields are Megatron-Bridge's ``MLAModelProvider``'s,
#: so they are read by the provider table (:func:`provider_to_nemo`). DeepSeek-V2's classes
#: route with softmax scores, which no family here runs.
_DEEPSEEK_DEFAULTS: dict[str, Any] = {
    "normalization": "RMSNorm", "activation_func": {"_target_": _FN + "silu", "_call_": False},
    "gated_linear_unit": True, "position_embedding_type": "rope", "add_bias_linear": False,
    "share_embeddings_and_output_weights": False, "num_attention_heads": 128, "kv_channels": 128,
    "max_position_embeddings": 4096, "seq_length": 4096, "rotary_base": 10000.0, "make_vocab_size_divisible_by": 3200,
    "qk_layernorm": True, "moe_grouped_gemm": True, "moe_router_pre_softmax": True,
    "moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "seq_aux_loss", "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
    "rotary_scaling_factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "init_method_std": 0.006,
    "layernorm_epsilon": 1e-6, "bf16": True, "params_dtype": {"_target_": "torch.bfloat16", "_call_": False},
}
NEMO2_MLA_DEFAULTS: dict[str, dict[str, Any]] = {
    _DEEPSEEK + "DeepSeekConfig": _DEEPSEEK_DEFAULTS,
    _DEEPSEEK + "DeepSeekV3Config": {
        **_DEEPSEEK_DEFAULTS, "num_layers": 61, "hidden_size": 7168, "ffn_hidden_size": 18432, "num_moe_experts": 256,
        "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048, "moe_layer_freq": [0] * 3 + [1] * 58,
        "moe_router_topk": 8, "moe_router_num_groups": 8, "moe_router_group_topk": 4,
        "moe_router_topk_scaling_factor": 2.5, "moe_aux_loss_coeff": 1e-4, "make_vocab_size_divisible_by": 1280,
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
}


def _mla_nemo2(c: dict[str, Any], model: dict[str, Any], providers: ProviderTable) -> dict[str, Any]:
    """A NeMo 2 DeepSeek config, read as the MLA provider it equals field for field."""
    cls = _target(c)
    if cls not in NEMO2_MLA_DEFAULTS:
        raise UnsupportedError(f"context/model.yaml: NeMo 2 config class {cls} is not supported (known: "
                               + ", ".join(k.rsplit(".", 1)[-1] for k in NEMO2_MLA_DEFAULTS) + ")")
    values = {**NEMO2_MLA_DEFAULTS[cls], **{k: v for k, v in c.items() if k != "_target_"}, "_target_": MLA_PROVIDER}
    cfg = provider_to_nemo(values, "context/model.yaml", providers)
    cfg["nemo2_target"] = _target(model)
    return cfg


#: What an absent field of a NeMo 2 GPT ``model.yaml`` means (fiddle keeps only the arguments
#: a config class was given; LlamaConfig's choices, NeMo 8cfedd7 ``llama.py`` — RMSNorm,
#: rotary positions, no linear biases, untied — over Megatron-Core's TransformerConfig
#: defaults for the rest, ``bias_activation_fusion`` included).
NEMO2_GPT_DEFAULTS: dict[str, Any] = {
    "normalization": "RMSNorm", "position_embedding_type": "rope", "add_bias_linear": False, "add_qkv_bias": False,
    "share_embeddings_and_output_weights": False, "rotary_base": 10000.0, "rotary_percent": 1.0,
    "init_method_std": 0.02, "layernorm_epsilon": 1e-5, "make_vocab_size_divisible_by": 128,
    "gated_linear_unit": False, "bias_activation_fusion": False, "layernorm_zero_centered_gamma": False,
}


def _provider_values(c: dict[str, Any]) -> dict[str, Any]:
    """A NeMo 2 GPT config as the provider-shaped values it is (NeMo 2's configs are
    Megatron-Core ``TransformerConfig`` subclasses, the fields Megatron-Bridge's providers
    have): the class defaults where absent, the context length under ``seq_length``, and
    ``activation_func`` by its last name (fiddle may spell it as a Python tag, read inert)."""
    values = {**NEMO2_GPT_DEFAULTS, **{k: v for k, v in c.items() if v is not None or k not in NEMO2_GPT_DEFAULTS}}
    values["seq_length"] = c.get("seq_length") or c.get("max_position_embeddings") or 4096
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _target(c.get("activation_func")))
    if names:
        values["activation_func"] = names[-1]
    return values


def nemo2_to_nemo1_config(model: dict[str, Any], providers: ProviderTable) -> dict[str, Any]:
    """NeMo 2 ``model.yaml`` (the GPT family of configs) → NeMo 1 ``model_config`` fields,
    through the one provider table (:func:`~nemo_convert.formats.megatron.megatron_config.provider_to_nemo`)."""
    c: dict[str, Any] = model["config"] if isinstance(model.get("config"), dict) else {}
    if _target(c).startswith(_DEEPSEEK):
        return _mla_nemo2(c, model, providers)
    if _target(c).startswith(_GPT_OSS):
        raise UnsupportedError(f"context/model.yaml: NeMo 2's {_target(c).rsplit('.', 1)[-1]} is not read: its YaRN "
                               "is rotary_scaling_factor (Megatron-Core 0.16's GPTModel reads yarn_rotary_scaling_"
                               "factor) with original context 131072 by default, where gpt-oss's and NeMo's own HF "
                               "export's is 4096, so which YaRN the checkpoint ran is not recorded")
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if c.get(k) is None]
    if missing:
        raise InputError(f"context/model.yaml lacks {', '.join(missing)} under config")
    try:
        cfg = provider_to_nemo(_provider_values(c), "context/model.yaml", providers)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"context/model.yaml: a model field is not understood ({type(exc).__name__}: {exc})") \
            from None
    cfg.pop("target", None)  # a NeMo 2 class: the family is NeMo 2's (nemo2_targets)
    cfg["nemo2_target"] = _target(model)
    return cfg


def open_nemo2(path: str, *, providers: ProviderTable, kinds_for: KindsFor | None = None) -> NemoCheckpoint:
    """Open a NeMo 2.0 checkpoint folder lazily (weights under logical NeMo names); its config is
    read by the provider table with ``providers`` (the registry's)."""
    model_yaml = os.path.join(path, "context", "model.yaml")
    if not os.path.isfile(model_yaml):
        raise InputError(f"{path}: NeMo 2 checkpoint without context/model.yaml")
    cfg = nemo2_to_nemo1_config(load_context_yaml(model_yaml), providers)
    container = DirectoryContainer(path)
    try:
        dist = DistCheckpointSource(lambda n: container.region("weights/" + n), name=f"{path}:weights")
        source: Any = PrefixView(dist, "module.")
        emb = "embedding.word_embeddings.weight"
        vocab = (load_context_yaml(model_yaml).get("config") or {}).get("vocab_size")
        if vocab is None and emb in source.keys():
            vocab = source.info(emb).shape[0]
        ours: dict[str, Any] = {"source_format": "nemo2"}
        if vocab is not None:
            ours["vocab_size"] = int(vocab)
        tok_dir = os.path.join(path, "context", "nemo_tokenizer")
        files: dict[str, str] = {}
        if os.path.isdir(tok_dir):
            files = {n: f"context/nemo_tokenizer/{n}" for n in sorted(os.listdir(tok_dir))
                     if os.path.isfile(os.path.join(tok_dir, n))}
        for n in sorted(os.listdir(os.path.join(path, "context"))):
            if n.endswith(".model") and "tokenizer.model" not in files:
                files["tokenizer.model"] = f"context/{n}"
        if files:
            ours["tokenizer_files"] = files
        cfg["nemo_convert"] = ours
        kinds = kinds_for(cfg) if kinds_for is not None else {}
        source = join_sections(source, kinds)
        if vocab:
            source = VocabTrimView(source, {k for k, v in kinds.items() if v is Parallel.VOCAB}, int(vocab))
        return NemoCheckpoint(path, container, "", cfg, "dist", source, list(dist.extra_state_keys))
    except BaseException:
        container.close()
        raise
