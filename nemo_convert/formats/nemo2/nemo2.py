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

from nemo_convert.errors import InputError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
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


def nemo2_to_nemo1_config(model: dict[str, Any]) -> dict[str, Any]:
    """NeMo 2 ``model.yaml`` (the GPT family of configs) → NeMo 1 ``model_config`` fields."""
    c = model.get("config") if isinstance(model.get("config"), dict) else {}
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
        if vocab:
            source = VocabTrimView(source, {k for k, v in kinds.items() if v is Parallel.VOCAB}, int(vocab))
        return NemoCheckpoint(path, container, "", cfg, "dist", source, list(dist.extra_state_keys))
    except BaseException:
        container.close()
        raise
