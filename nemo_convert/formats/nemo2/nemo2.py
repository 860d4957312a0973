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

from nemo_convert.errors import InputError, UnsupportedError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.sections import join_sections
from nemo_convert.formats.megatron.megatron_config import MLA_PROVIDER, provider_to_nemo
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


#: Megatron-Core / NeMo 2 activation functions (``megatron.core.activations``,
#: ``nemo.collections.llm.fn.activation``, ``torch.nn.functional``) → NeMo 1's
#: ``activation`` (gated, not gated) and ``openai_gelu`` (the tanh GeLU).
_NEMO2_ACTIVATIONS: dict[str, tuple[str, str, bool]] = {
    "silu": ("fast-swiglu", "silu", False), "gelu": ("fast-geglu", "gelu", False),
    "openai_gelu": ("fast-geglu", "gelu", True), "fast_gelu": ("fast-geglu", "gelu", True),
    "gelu_impl": ("fast-geglu", "gelu", True), "relu": ("fast-reglu", "relu", False),
    "squared_relu": ("squared-reluglu", "squared-relu", False), "quick_gelu": ("quick-geglu", "approx-gelu", False),
}


def _activation(c: dict[str, Any]) -> dict[str, Any]:
    """NeMo 1's activation fields for a NeMo 2 config's ``activation_func``, ``gated_linear_unit``
    and ``bias_activation_fusion`` (Megatron-Core's default False; it decides whether a GeLU runs
    the tanh kernel)."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _target(c.get("activation_func")))
    act = names[-1] if names else ""
    gated = bool(c.get("gated_linear_unit", False))
    known = _NEMO2_ACTIVATIONS.get(act)
    if known is None:
        name = ("fast-swiglu" if act == "silu" else f"fast-{act}glu") if gated else (act or "gelu")
        return {"activation": name}
    return {"activation": known[0] if gated else known[1], "openai_gelu": known[2],
            "bias_activation_fusion": bool(c.get("bias_activation_fusion", False))}


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


def _mla_nemo2(c: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """A NeMo 2 DeepSeek config, read as the MLA provider it equals field for field."""
    cls = _target(c)
    if cls not in NEMO2_MLA_DEFAULTS:
        raise UnsupportedError(f"context/model.yaml: NeMo 2 config class {cls} is not supported (known: "
                               + ", ".join(k.rsplit(".", 1)[-1] for k in NEMO2_MLA_DEFAULTS) + ")")
    values = {**NEMO2_MLA_DEFAULTS[cls], **{k: v for k, v in c.items() if k != "_target_"}, "_target_": MLA_PROVIDER}
    cfg = provider_to_nemo(values, "context/model.yaml")
    cfg["nemo2_target"] = _target(model)
    return cfg


def nemo2_to_nemo1_config(model: dict[str, Any]) -> dict[str, Any]:
    """NeMo 2 ``model.yaml`` (the GPT family of configs) → NeMo 1 ``model_config`` fields."""
    c: dict[str, Any] = model["config"] if isinstance(model.get("config"), dict) else {}
    if _target(c).startswith(_DEEPSEEK):
        return _mla_nemo2(c, model)
    if _target(c).startswith(_GPT_OSS):
        raise UnsupportedError(f"context/model.yaml: NeMo 2's {_target(c).rsplit('.', 1)[-1]} is not read: its YaRN "
                               "is rotary_scaling_factor (Megatron-Core 0.16's GPTModel reads yarn_rotary_scaling_"
                               "factor) with original context 131072 by default, where gpt-oss's and NeMo's own HF "
                               "export's is 4096, so which YaRN the checkpoint ran is not recorded")
    heads = c.get("num_attention_heads")
    seq = c.get("seq_length") or c.get("max_position_embeddings") or 4096
    dtype = _target(c.get("params_dtype")).rsplit(".", 1)[-1]
    precision: Any = "bf16" if c.get("bf16") or dtype == "bfloat16" else (16 if c.get("fp16") or dtype == "float16" else 32)
    cfg: dict[str, Any] = {
        "mcore_gpt": True,
        "num_layers": c.get("num_layers"),
        "hidden_size": c.get("hidden_size"),
        "ffn_hidden_size": c.get("ffn_hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": c.get("num_query_groups") or heads,
        "kv_channels": c.get("kv_channels"),
        "encoder_seq_length": seq,
        "max_position_embeddings": seq,
        "init_method_std": c.get("init_method_std", 0.02),
        "layernorm_epsilon": c.get("layernorm_epsilon", 1e-5),
        "normalization": "rmsnorm" if "rms" in str(c.get("normalization", "RMSNorm")).lower() else "layernorm",
        **_activation(c),
        "layernorm_zero_centered_gamma": bool(c.get("layernorm_zero_centered_gamma", False)),
        "bias": bool(c.get("add_bias_linear", False)),
        "qkv_bias": bool(c.get("add_qkv_bias", False)),
        "share_embeddings_and_output_weights": bool(c.get("share_embeddings_and_output_weights", False)),
        "position_embedding_type": c.get("position_embedding_type", "rope"),
        "rotary_percentage": c.get("rotary_percent", 1.0),
        "rotary_base": c.get("rotary_base", 10000),
        "seq_len_interpolation_factor": c.get("seq_len_interpolation_factor"),
        "make_vocab_size_divisible_by": c.get("make_vocab_size_divisible_by", 128),
        "precision": precision,
        "nemo2_target": _target(model),
    }
    if c.get("scale_factor") is not None or "Llama31" in _target(c) or "Llama32" in _target(c):
        cfg.update({"scale_positional_embedding": True, "scale_factor": c.get("scale_factor", 8.0),
                    "low_freq_factor": c.get("low_freq_factor", 1.0),
                    "high_freq_factor": c.get("high_freq_factor", 4.0),
                    "old_context_len": c.get("old_context_len", 8192)})
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if cfg.get(k) is None]
    if missing:
        raise InputError(f"context/model.yaml lacks {', '.join(missing)} under config")
    return cfg


def open_nemo2(path: str, *, kinds_for: KindsFor | None = None) -> NemoCheckpoint:
    """Open a NeMo 2.0 checkpoint folder lazily (weights under logical NeMo names)."""
    model_yaml = os.path.join(path, "context", "model.yaml")
    if not os.path.isfile(model_yaml):
        raise InputError(f"{path}: NeMo 2 checkpoint without context/model.yaml")
    cfg = nemo2_to_nemo1_config(load_context_yaml(model_yaml))
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
