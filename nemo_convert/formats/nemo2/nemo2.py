"""NeMo 2.0 checkpoint folders: ``weights/`` (a Megatron-Core dist checkpoint with the
``module.`` prefix) and ``context/`` (``model.yaml``, ``nemo_tokenizer/``, …).

The model config is fiddle-style YAML (``_target_`` keys); it is read with a safe loader
that turns any Python tag into an inert string, and translated into NeMo 1 field names so
that the model families handle both generations with one config translation. NeMo writes only
the arguments a config class was called with, so an absent field is that class's default: the
families declare their classes' defaults (``NemoTarget.nemo2_configs``); a class none declares
is refused by name.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from nemo_convert.errors import ConfigError, InputError, UnsupportedError
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.sections import join_sections
from nemo_convert.formats.megatron.provider_read import provider_to_nemo
from nemo_convert.formats.megatron.providers import ProviderTable
from nemo_convert.formats.nemo.nemo_checkpoint import KindsFor, NemoCheckpoint, VocabTrimView
from nemo_convert.formats.io.tar_archive import DirectoryContainer
from nemo_convert.mapping.rules import Parallel
from nemo_convert.spec.activations import MCORE_FUNCTIONS
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


_FN = "torch.nn.functional."

#: What an absent field of a NeMo 2 GPT config means before its class's own defaults (which
#: the families declare: ``NemoTarget.nemo2_configs``): NeMo's ``GPTConfig`` (NeMo 8cfedd7
#: ``nemo/collections/llm/gpt/model/base.py`` lines 292-316: tied embeddings, learned absolute
#: positions, context 1024) over Megatron-Core's ``TransformerConfig`` (0.16.1
#: ``transformer/transformer_config.py`` lines 124-237: query groups, FFN size and head size
#: derived, biases, no GLU, GeLU, LayerNorm at line 205, no QK norm, no MLA; ``init_method_std``
#: line 311, ``bias_activation_fusion`` line 354; ``model_parallel_config.py`` lines 106-112:
#: fp32). A ``model.yaml`` holds only the arguments the class was called with (``IOMixin``:
#: NeMo 8cfedd7 ``nemo/lightning/io/mixin.py`` lines 515-545, ``bind_partial`` without
#: ``apply_defaults``), so every other field is its class's default.
GPT_CONFIG_DEFAULTS: dict[str, Any] = {
    "share_embeddings_and_output_weights": True, "make_vocab_size_divisible_by": 128,
    "position_embedding_type": "learned_absolute", "rotary_base": 10000, "rotary_percent": 1.0,
    "seq_len_interpolation_factor": None, "seq_length": 1024, "vocab_size": None,
    "num_query_groups": None, "ffn_hidden_size": None, "kv_channels": None,
    "apply_residual_connection_post_layernorm": False, "layernorm_epsilon": 1e-5,
    "layernorm_zero_centered_gamma": False, "add_bias_linear": True, "add_qkv_bias": False,
    "gated_linear_unit": False, "activation_func": {"_target_": _FN + "gelu", "_call_": False},
    "num_moe_experts": None, "rotary_interleaved": False, "window_size": None, "normalization": "LayerNorm",
    "qk_layernorm": False, "multi_latent_attention": False, "init_method_std": 0.02, "bias_activation_fusion": False,
    "fp16": False, "bf16": False, "params_dtype": {"_target_": "torch.float32", "_call_": False},
}

#: Megatron-Core's name for each activation function (the first of its spellings in
#: :data:`~nemo_convert.spec.activations.MCORE_FUNCTIONS`): NeMo's ``openai_gelu`` is the tanh
#: GeLU Megatron-Core calls ``fast_gelu``.
_MCORE_NAME: dict[str, str] = {fn: name for name, fn in reversed(MCORE_FUNCTIONS.items())}


def _declared(model: dict[str, Any], c: dict[str, Any], providers: ProviderTable) -> dict[str, Any]:
    """The field defaults of ``c``'s config class as the installed families declare it under
    ``model``'s class (:attr:`ProviderTable.nemo2`): a class none declares, or one declared as a
    refusal, is refused by name — never read with guessed defaults."""
    cls, owner = _target(c), _target(model)
    short = cls.rsplit(".", 1)[-1] or "(none)"
    everything = {k: v for classes in providers.nemo2.values() for k, v in classes.items()}
    declared = providers.nemo2.get(owner, everything)
    found = declared.get(cls)
    if found is None:
        names = ", ".join(sorted(k.rsplit(".", 1)[-1] for k in declared)) or "none"
        raise UnsupportedError(f"context/model.yaml: NeMo 2 config class {cls or '(no _target_)'} "
                               f"{'under ' + owner.rsplit('.', 1)[-1] + ' ' if owner else ''}is declared by no "
                               f"installed family, so its defaults are not known (declared: {names})")
    if isinstance(found, str):
        raise UnsupportedError(f"context/model.yaml: NeMo 2's {short} is not read: {found}")
    return dict(found)


#: A declaration's key for its class's own spelling: a function from the provider-shaped
#: values (defaults under the fields written) to the provider's, where the NeMo 2 class
#: reads a field otherwise than the provider it is read as (it may refuse by name).
READ_HOOK = "_read_"


def _provider_values(c: dict[str, Any], declared: dict[str, Any]) -> dict[str, Any]:
    """A NeMo 2 GPT config as the provider-shaped values it is (NeMo 2's configs are
    Megatron-Core ``TransformerConfig`` subclasses, the fields Megatron-Bridge's providers
    have): ``GPTConfig``'s defaults under the class's declared ones under the fields written
    (then the declaration's :data:`READ_HOOK`, if any),
    the context length under ``seq_length``, and ``activation_func`` by Megatron-Core's name
    (fiddle may spell it as a Python tag, read inert)."""
    provider = declared.pop("_target_", None)
    reads = declared.pop(READ_HOOK, None)
    values = {**GPT_CONFIG_DEFAULTS, **declared, **{k: v for k, v in c.items() if k != "_target_"}}
    if reads is not None:
        try:
            values = reads(values)
        except UnsupportedError as exc:
            raise UnsupportedError(f"context/model.yaml: {exc}") from None
    values["_target_"] = provider or _target(c)
    values["seq_length"] = values.get("seq_length") or values.get("max_position_embeddings") or 1024
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _target(values.get("activation_func")))
    if names:
        fn = MCORE_FUNCTIONS.get(names[-1])
        values["activation_func"] = _MCORE_NAME[fn] if fn is not None else names[-1]
    return values


def nemo2_to_nemo1_config(model: dict[str, Any], providers: ProviderTable) -> dict[str, Any]:
    """NeMo 2 ``model.yaml`` (the GPT family of configs) → NeMo 1 ``model_config`` fields,
    through the one provider table (:func:`~nemo_convert.formats.megatron.provider_read.provider_to_nemo`)."""
    c = model.get("config")
    if not isinstance(c, dict):
        raise InputError("context/model.yaml: config is not a mapping (num_layers, hidden_size, … under it)")
    values = _provider_values(c, _declared(model, c, providers))
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if values.get(k) is None]
    if missing:
        raise InputError(f"context/model.yaml lacks {', '.join(missing)} under config")
    try:
        cfg = provider_to_nemo(values, "context/model.yaml", providers)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"context/model.yaml: a model field is not understood ({type(exc).__name__}: {exc})") \
            from None
    cfg.pop("target", None)  # a NeMo 2 class: the family is NeMo 2's (nemo2_targets)
    if isinstance(values.get("window_size"), (list, tuple)):
        # NeMo 2's importers write HF's W as ``[W, 0]`` (``mistral.py``'s HFMistralImporter): read as
        # NeMo meant it (window_size[0] keys, docs/families/mistral.md), not as Megatron-Bridge's [W-1, 0]
        (cfg.get("nemo_convert") or {}).pop("sliding_window", None)
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
        cfg["nemo_convert"] = {**(cfg.get("nemo_convert") or {}), **ours}  # the provider's records too (post-norms)
        kinds = kinds_for(cfg) if kinds_for is not None else {}
        source = join_sections(source, kinds)
        if vocab:
            source = VocabTrimView(source, {k for k, v in kinds.items() if v is Parallel.VOCAB}, int(vocab))
        return NemoCheckpoint(path, container, "", cfg, "dist", source, list(dist.extra_state_keys))
    except BaseException:
        container.close()
        raise
