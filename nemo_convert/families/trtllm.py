"""TensorRT-LLM names for ``quantize``, as one rename table from NeMo logical names.

A family's HF ⇄ NeMo mapping already says which HF tensors make each NeMo tensor. A
TensorRT-LLM checkpoint is one more target of the same tensors, so a family describes it
with a :class:`TrtllmTable`: NeMo logical name → TensorRT-LLM name(s), plus the
TensorRT-LLM config fields computed from the NeMo config. ``quantize`` derives the
per-tensor plan (HF sources, TP split, fusion) from the family's mapping and this table
(:func:`nemo_convert.qnemo.spec.derive_spec`); no HF name is spelled here.

The GPT base has one table (:data:`GPT_TRTLLM_NAMES`) and :func:`gpt_trtllm` gives it to
every GPT-base family whose TensorRT-LLM model is confirmed (:data:`GPT_TRTLLM_MODELS`).

Sources (TensorRT-LLM, cited by path):

* ``docs/source/architecture/checkpoint.md`` "Rank Weights": ``transformer.vocab_embedding``,
  ``transformer.layers.{i}.input_layernorm``, ``attention.qkv`` (``[Q; K; V]`` of the rank's
  heads), ``attention.dense``, ``post_layernorm``, ``mlp.fc``, ``mlp.gate``, ``mlp.proj``,
  ``transformer.ln_f``, ``lm_head``;
* ``tensorrt_llm/models/llama/convert.py``: ``mlp.fc`` is HF ``gate_proj`` (the activated
  branch), ``mlp.gate`` is ``up_proj``;
* ``tensorrt_llm/models/qwen/convert.py`` (``convert_hf_qwen``) with ``get_qwen_key_list``
  in ``qwen/utils.py``: the same names for Qwen2/Qwen3 (``mlp.up_proj`` → ``mlp.gate``,
  ``mlp.gate_proj`` → ``mlp.fc``), the q/k/v biases as ``attention.qkv.bias`` (split per
  part like the weight), Qwen3's ``attention.q_layernorm`` / ``attention.k_layernorm``;
* ``tensorrt_llm/models/__init__.py`` ``MODEL_MAP``: ``LlamaForCausalLM`` and
  ``MistralForCausalLM`` → ``LLaMAForCausalLM``; ``Qwen2ForCausalLM`` and
  ``Qwen3ForCausalLM`` → ``QWenForCausalLM``;
* ``tensorrt_llm/models/qwen/config.py`` (``QWenConfig``): ``qwen_type``, ``attn_bias``,
  ``mlp_bias``, ``rotary_base``, ``rotary_scaling``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.spec import Llama3Scaling, Rope, describe_activation, spec_of

Stage = Literal["first", "last"]


@dataclass(frozen=True)
class TrtllmName:
    """One row: a NeMo logical tensor and its TensorRT-LLM name(s).

    :param nemo: NeMo logical name, ``{i}`` for the layer
        (``"decoder.layers.{i}.self_attention.linear_qkv.weight"``).
    :param trtllm: the TensorRT-LLM name, ``{i}`` for the layer within the pipeline stage.
        Several names split the NeMo tensor into its parts along dim 0, in order
        (``linear_fc1`` = ``[gate; up]`` → ``mlp.fc``, ``mlp.gate``).
    :param quantize: a linear weight that the algorithm quantizes.
    :param stage: for tensors outside the decoder layers, the pipeline stage holding them.
    :param fallback: a NeMo name to take the tensor from when ``nemo`` is not produced by
        this config (a tied ``lm_head`` is the embedding).

    A row whose NeMo tensor the family's mapping does not produce for this config (a bias
    the model has not, Qwen3's q/k norms elsewhere) writes nothing.
    """

    nemo: str
    trtllm: tuple[str, ...]
    quantize: bool = False
    stage: Stage | None = None
    fallback: str | None = None


@dataclass(frozen=True)
class TrtllmTable:
    """A family's TensorRT-LLM target (``ModelFamily.trtllm``): names and config.

    :param architecture: the ``architecture`` field of the checkpoint's ``config.json``.
    :param names: the rename table; layer tensors are written in this order.
    :param config: NeMo config → TensorRT-LLM model fields (``vocab_size``, ``hidden_size``,
        ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
        ``head_size``, ``intermediate_size``, …); one-line errors for what the target cannot
        represent. The core adds ``architecture``, ``dtype``, ``mapping`` and ``quantization``.
    :param kv_cache: the TensorRT-LLM name of the FP8 KV-cache scale (``{i}``), or None.
    :param kv_of: the NeMo tensor whose fused K and V sources give the KV-cache amax.
    """

    architecture: str
    names: tuple[TrtllmName, ...]
    config: Callable[[dict[str, Any]], dict[str, Any]]
    kv_cache: str | None = None
    kv_of: str | None = None


D = "decoder.layers.{i}."
T = "transformer.layers.{i}."

#: The GPT base's table: NeMo mcore GPT logical names → TensorRT-LLM names (see the
#: module docstring for the sources).
GPT_TRTLLM_NAMES: tuple[TrtllmName, ...] = (
    TrtllmName("embedding.word_embeddings.weight", ("transformer.vocab_embedding.weight",), stage="first"),
    TrtllmName(D + "self_attention.linear_qkv.layer_norm_weight", (T + "input_layernorm.weight",)),
    TrtllmName(D + "self_attention.linear_qkv.weight", (T + "attention.qkv.weight",), quantize=True),
    TrtllmName(D + "self_attention.linear_qkv.bias", (T + "attention.qkv.bias",)),
    TrtllmName(D + "self_attention.q_layernorm.weight", (T + "attention.q_layernorm.weight",)),
    TrtllmName(D + "self_attention.k_layernorm.weight", (T + "attention.k_layernorm.weight",)),
    TrtllmName(D + "self_attention.linear_proj.weight", (T + "attention.dense.weight",), quantize=True),
    TrtllmName(D + "mlp.linear_fc1.layer_norm_weight", (T + "post_layernorm.weight",)),
    TrtllmName(D + "mlp.linear_fc1.weight", (T + "mlp.fc.weight", T + "mlp.gate.weight"), quantize=True),
    TrtllmName(D + "mlp.linear_fc2.weight", (T + "mlp.proj.weight",), quantize=True),
    TrtllmName("decoder.final_layernorm.weight", ("transformer.ln_f.weight",), stage="last"),
    TrtllmName("output_layer.weight", ("lm_head.weight",), stage="last",
               fallback="embedding.word_embeddings.weight"),
)
GPT_KV_CACHE = T + "attention.kv_cache_scaling_factor"
GPT_KV_OF = D + "self_attention.linear_qkv.weight"

#: The gated MLP's function (:mod:`nemo_convert.spec.activations`) → TensorRT-LLM ``hidden_act``.
_HIDDEN_ACT = {"silu": "silu"}


def _rotary_scaling(rope: Rope) -> dict[str, Any] | None:
    """TensorRT-LLM reads ``rotary_scaling["type"]`` (and the llama3 parameters); the
    parameters follow in the order transformers writes them (sorted)."""
    if isinstance(rope.scaling, Llama3Scaling):
        s = rope.scaling
        return {"type": "llama3", "factor": s.factor, "high_freq_factor": s.high_freq_factor,
                "low_freq_factor": s.low_freq_factor, "original_max_position_embeddings": s.original_max_positions}
    if rope.interpolation:
        return {"type": "linear", "factor": rope.interpolation}
    return None


def gpt_trtllm_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """NeMo mcore GPT config → the TensorRT-LLM decoder fields every GPT target shares
    (a table over its :class:`~nemo_convert.spec.ModelSpec`)."""
    spec = spec_of(cfg)
    missing = [name for name, value in (("ffn_hidden_size", spec.geometry.ffn),
                                        ("nemo_convert.vocab_size", spec.geometry.vocab_size)) if value is None]
    if missing:
        raise ConfigError(f"the model config lacks {', '.join(missing)}, needed for the TensorRT-LLM config")
    g, mlp = spec.geometry, spec.mlp
    if not (mlp.gated and mlp.activation in _HIDDEN_ACT) or mlp.glu_offset or mlp.clamp is not None:
        act = str(cfg.get("activation") or "gelu")
        raise UnsupportedError(f"activation {act!r} ({describe_activation((mlp.gated, mlp.activation))}) has no "
                               "TensorRT-LLM equivalent here (supported: gated SiLU)")
    rope = spec.rope or Rope()
    if rope.fraction != 1.0:
        raise UnsupportedError(f"rotary_percentage={rope.fraction}: partial RoPE is not written "
                               "to TensorRT-LLM checkpoints")
    return {
        "vocab_size": int(g.vocab_size or 0),
        "hidden_size": g.hidden,
        "num_hidden_layers": g.layers,
        "num_attention_heads": g.heads,
        "num_key_value_heads": g.query_groups,
        "head_size": g.head_dim,
        "intermediate_size": int(g.ffn or 0),
        "max_position_embeddings": g.max_positions or 4096,
        "hidden_act": _HIDDEN_ACT[mlp.activation],
        "norm_epsilon": spec.norm.eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": rope.theta,
        "rotary_scaling": _rotary_scaling(rope),
    }


def _llama_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``LLaMAForCausalLM``: no linear biases, one attention window for all layers."""
    spec = spec_of(cfg)
    if spec.attention.qkv_bias or spec.mlp.bias:
        raise UnsupportedError("linear biases are not written to TensorRT-LLM Llama checkpoints")
    keys = spec.attention.window
    if keys is not None:
        raise UnsupportedError(
            f"a sliding attention window (window_size={list(cfg.get('window_size') or [])}: each token sees {keys} "
            "keys) is not part of a TensorRT-LLM Llama checkpoint: TensorRT-LLM applies it when the engine runs "
            f"(run.py --max_attention_window_size={keys}, as its examples/llama/README.md runs Mistral 7B). To write "
            "the checkpoint without it, quantize the Hugging Face folder with --ignore-config-key sliding_window (for "
            "a .nemo, nemo-convert export it first), then run the engine with that window")
    return gpt_trtllm_config(cfg)


def _qwen_config(qwen_type: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def config(cfg: dict[str, Any]) -> dict[str, Any]:
        spec = spec_of(cfg)
        if spec.mlp.bias:
            raise UnsupportedError("MLP biases are not written to TensorRT-LLM Qwen checkpoints")
        return {**gpt_trtllm_config(cfg), "qwen_type": qwen_type, "attn_bias": spec.attention.qkv_bias,
                "mlp_bias": False}

    return config


#: HF architecture of a GPT-base family → (TensorRT-LLM ``architecture``, config fields).
#: Gemma (TensorRT-LLM adds 1 to its norms and scales the embedding in its own model) and
#: Phi-3 (its own ``Phi3ForCausalLM`` names) are not confirmed and have no entry.
GPT_TRTLLM_MODELS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "LlamaForCausalLM": ("LlamaForCausalLM", _llama_config),
    "MistralForCausalLM": ("LlamaForCausalLM", _llama_config),
    "Qwen2ForCausalLM": ("Qwen2ForCausalLM", _qwen_config("qwen2")),
    "Qwen3ForCausalLM": ("Qwen3ForCausalLM", _qwen_config("qwen3")),
}


def gpt_trtllm(hf_architecture: str) -> TrtllmTable | None:
    """The GPT base's TensorRT-LLM table for a family, or None when its TensorRT-LLM model
    is not confirmed (``quantize`` then refuses the family by name)."""
    model = GPT_TRTLLM_MODELS.get(hf_architecture)
    if model is None:
        return None
    return TrtllmTable(model[0], GPT_TRTLLM_NAMES, model[1], kv_cache=GPT_KV_CACHE, kv_of=GPT_KV_OF)
