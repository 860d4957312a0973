"""The TensorRT-LLM target of ``quantize``: a name projection and a config projection.

A family's HF ⇄ NeMo mapping already says which HF tensors make each NeMo tensor. A
TensorRT-LLM checkpoint is one more target of the same NeMo logical tensors, so a family
describes it with a :class:`TrtllmTable`: NeMo logical name → TensorRT-LLM name(s) (the
name projection, with ``{i}`` and ``{e}`` as in the family's rules), the TensorRT-LLM config
fields computed from the NeMo config (the config projection), and the ``architecture``
written to ``config.json``. ``quantize`` plans the table with the one planner
(:mod:`nemo_convert.qnemo.target`); no HF name is spelled here, and no family is named:
each family plugin declares its table (``gpt_family(..., trtllm=gpt_trtllm(ARCH, FIELDS))``).

The GPT base has one name table (:data:`GPT_TRTLLM_NAMES`, dense and mixture-of-experts
rows) and config projections per TensorRT-LLM model (:data:`LLAMA_FIELDS`,
:func:`qwen_fields`, :data:`LLAMA_MOE_FIELDS`).

Sources (TensorRT-LLM, cited by path):

* ``docs/source/architecture/checkpoint.md`` "Rank Weights": ``transformer.vocab_embedding``,
  ``transformer.layers.{i}.input_layernorm``, ``attention.qkv`` (``[Q; K; V]`` of the rank's
  heads), ``attention.dense``, ``post_layernorm``, ``mlp.fc``, ``mlp.gate``, ``mlp.proj``,
  ``transformer.ln_f``, ``lm_head``;
* ``tensorrt_llm/models/llama/convert.py``: ``mlp.fc`` is HF ``gate_proj`` (the activated
  branch), ``mlp.gate`` is ``up_proj``; for a mixture of experts (``convert_hf_llama``, MoE
  branch, @04a2cacb): the rank's experts (``mapping.ep_experts``) stacked on dim 0, each
  expert's ``w3`` (up) and ``w1`` (gate) split for the MoE TP rank on dim 1 and concatenated
  ``[w3; w1]`` into ``mlp.fc.weight``, ``w2`` split on dim 2 into ``mlp.proj.weight``, the
  router ``block_sparse_moe.gate`` in float32 as ``mlp.router.weight`` ("Router should never
  be quantized");
* ``tensorrt_llm/models/qwen/convert.py`` (``convert_hf_qwen``) with ``get_qwen_key_list``
  in ``qwen/utils.py``: the same names for Qwen2/Qwen3 (``mlp.up_proj`` → ``mlp.gate``,
  ``mlp.gate_proj`` → ``mlp.fc``), the q/k/v biases as ``attention.qkv.bias`` (split per
  part like the weight), Qwen3's ``attention.q_layernorm`` / ``attention.k_layernorm``;
* ``tensorrt_llm/models/__init__.py`` ``MODEL_MAP``: ``LlamaForCausalLM``,
  ``MistralForCausalLM`` and ``MixtralForCausalLM`` → ``LLaMAForCausalLM``;
  ``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM`` → ``QWenForCausalLM``;
* ``tensorrt_llm/models/qwen/config.py`` (``QWenConfig``): ``qwen_type``, ``attn_bias``,
  ``mlp_bias``, ``rotary_base``, ``rotary_scaling``;
* ``tensorrt_llm/models/llama/config.py`` (``LLaMAConfig.from_hugging_face``, @04100fd0):
  Mixtral's ``hidden_act`` is ``"swiglu"`` ("with our MoE implementation, we must make it
  explicit"), ``moe`` = ``MoeConfig(num_experts, top_k, normalization_mode=RENORMALIZE)``;
  ``tensorrt_llm/layers/moe.py`` (``MoeConfig``: ``num_experts``, ``top_k``,
  ``normalization_mode`` — ``NONE = 0``, ``RENORMALIZE = 1``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.mapping.rules import Condition, SpecField
from nemo_convert.spec import Llama3Scaling, MoE, Rope, describe_activation, spec_of

Stage = Literal["first", "last"]


@dataclass(frozen=True)
class TrtllmName:
    """One row of the name projection: a NeMo logical tensor and its TensorRT-LLM name(s).

    :param nemo: NeMo logical name, ``{i}`` for the layer and ``{e}`` for an expert
        (``"decoder.layers.{i}.self_attention.linear_qkv.weight"``).
    :param trtllm: the TensorRT-LLM name, ``{i}`` for the layer (within the pipeline stage
        in the rank files). Several names split the NeMo tensor into its parts along dim 0,
        in order (``linear_fc1`` = ``[gate; up]`` → ``mlp.fc``, ``mlp.gate``); the parts are
        those of the tensor's tensor-parallel kind (a gated fc1: gate, up; a grouped QKV:
        one ``[q; k; v]`` tensor).
    :param quantize: a linear weight that the algorithm quantizes.
    :param stage: for tensors outside the decoder layers, the pipeline stage holding them.
    :param when: a condition on the typed model spec, as for rules
        (``SpecField("embedding.tied")``; a NeMo config path still works, deprecated).
    :param shares: the tensor is written again from ``nemo`` without consuming it (a tied
        ``lm_head`` is the embedding).
    :param experts: ``nemo`` has ``{e}``: one TensorRT-LLM tensor per layer holds every
        expert, stacked on a new dim 0 (expert parallelism splits that dim).
    :param order: the NeMo tensor's parts in the order one TensorRT-LLM tensor stores them
        (``(1, 0)``: a gated fc1 ``[gate; up]`` written ``[up; gate]``, TensorRT-LLM's MoE
        ``mlp.fc``); None: as NeMo stores them.
    :param dtype: a dtype the tensor keeps whatever the checkpoint's (``"float32"``: the MoE
        router); None: the checkpoint dtype.
    :param keep: a linear TensorRT-LLM must never quantize (the MoE router): its module is
        listed in ``quantization.exclude_modules``.

    A row whose NeMo tensor this config does not have (a bias the model has not, Qwen3's
    q/k norms, a MoE layer's tensors in a dense layer) writes nothing.
    """

    nemo: str
    trtllm: tuple[str, ...]
    quantize: bool = False
    stage: Stage | None = None
    when: Condition = None
    shares: bool = False
    experts: bool = False
    order: tuple[int, ...] | None = None
    dtype: str | None = None
    keep: bool = False


@dataclass(frozen=True)
class TrtllmTable:
    """A family's TensorRT-LLM target (``ModelFamily.trtllm``): the architecture, the name
    projection and the config projection.

    :param architecture: the ``architecture`` field of the checkpoint's ``config.json`` (a
        key of TensorRT-LLM's ``MODEL_MAP``).
    :param names: the name projection; layer tensors are written in this order.
    :param config: NeMo config → TensorRT-LLM model fields (``vocab_size``, ``hidden_size``,
        ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
        ``head_size``, ``intermediate_size``, ``moe``, …); one-line errors for what the target
        cannot represent. The core adds ``architecture``, ``dtype``, ``mapping`` and
        ``quantization``.
    :param kv_cache: the TensorRT-LLM name of the FP8 KV-cache scale (``{i}``), or None.
    :param kv_of: the NeMo tensor whose K and V parts (its origin's q, k, v) give the
        KV-cache amax.
    :param layers: the NeMo config path of the layer count ``{i}`` ranges over.
    :param experts: the NeMo config path of the expert count ``{e}`` ranges over.
    """

    architecture: str
    names: tuple[TrtllmName, ...]
    config: Callable[[dict[str, Any]], dict[str, Any]]
    kv_cache: str | None = None
    kv_of: str | None = None
    layers: str = "num_layers"
    experts: str = "num_moe_experts"


D = "decoder.layers.{i}."
E = D + "mlp.experts.local_experts.{e}."
T = "transformer.layers.{i}."

#: The output layer is the word embedding (the spec's :attr:`Embedding.tied`).
TIED = SpecField("embedding.tied")

#: The GPT base's table: NeMo mcore GPT logical names → TensorRT-LLM names (see the
#: module docstring for the sources). A MoE layer's rows (``pre_mlp_layernorm``, the router,
#: the stacked experts) write nothing for a dense layer, and the dense MLP's nothing for a
#: MoE layer.
GPT_TRTLLM_NAMES: tuple[TrtllmName, ...] = (
    TrtllmName("embedding.word_embeddings.weight", ("transformer.vocab_embedding.weight",), stage="first"),
    TrtllmName(D + "self_attention.linear_qkv.layer_norm_weight", (T + "input_layernorm.weight",)),
    TrtllmName(D + "self_attention.linear_qkv.weight", (T + "attention.qkv.weight",), quantize=True),
    TrtllmName(D + "self_attention.linear_qkv.bias", (T + "attention.qkv.bias",)),
    TrtllmName(D + "self_attention.q_layernorm.weight", (T + "attention.q_layernorm.weight",)),
    TrtllmName(D + "self_attention.k_layernorm.weight", (T + "attention.k_layernorm.weight",)),
    TrtllmName(D + "self_attention.linear_proj.weight", (T + "attention.dense.weight",), quantize=True),
    TrtllmName(D + "mlp.linear_fc1.layer_norm_weight", (T + "post_layernorm.weight",)),
    TrtllmName(D + "pre_mlp_layernorm.weight", (T + "post_layernorm.weight",)),
    TrtllmName(D + "mlp.linear_fc1.weight", (T + "mlp.fc.weight", T + "mlp.gate.weight"), quantize=True),
    TrtllmName(D + "mlp.linear_fc2.weight", (T + "mlp.proj.weight",), quantize=True),
    TrtllmName(D + "mlp.router.weight", (T + "mlp.router.weight",), dtype="float32", keep=True),
    TrtllmName(E + "linear_fc1.weight", (T + "mlp.fc.weight",), quantize=True, experts=True, order=(1, 0)),
    TrtllmName(E + "linear_fc2.weight", (T + "mlp.proj.weight",), quantize=True, experts=True),
    TrtllmName("decoder.final_layernorm.weight", ("transformer.ln_f.weight",), stage="last"),
    TrtllmName("output_layer.weight", ("lm_head.weight",), stage="last", when=~TIED),
    TrtllmName("embedding.word_embeddings.weight", ("lm_head.weight",), stage="last", shares=True, when=TIED),
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


def _moe_fields(cfg: dict[str, Any], moe: MoE) -> dict[str, Any]:
    """TensorRT-LLM's ``MoeConfig`` for a mixture of experts whose routing its MoE layer
    computes: softmax scores, top-k, renormalised over the k (Megatron's
    ``moe_router_pre_softmax: false``, ``RENORMALIZE``) or not (``true``, ``NONE``); one-line
    errors naming the NeMo field of what it does not compute (a table over the spec's
    :class:`~nemo_convert.spec.MoE`)."""
    reasons = []
    if not all(moe.layer_pattern):
        reasons.append(f"moe_layer_freq={cfg.get('moe_layer_freq', 1)} (dense and MoE layers mixed; TensorRT-LLM's "
                       "model makes every layer MoE)")
    for key, computed in (("moe_router_score_function", moe.score_function == "softmax"),
                          ("moe_router_topk_scaling_factor", moe.topk_scaling == 1.0),
                          ("moe_router_num_groups", moe.groups == 1),
                          ("moe_router_enable_expert_bias", not moe.expert_bias),
                          ("moe_shared_expert_intermediate_size", not moe.shared_ffn)):
        if not computed:
            reasons.append(f"{key}={cfg.get(key)!r}")
    if reasons:
        raise UnsupportedError(f"{'; '.join(reasons)}: not computed by TensorRT-LLM's MoE layer as this checkpoint "
                               "would be written")
    return {"num_experts": moe.experts, "top_k": moe.topk, "normalization_mode": 0 if moe.pre_softmax else 1}


def _llama_moe_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``LLaMAForCausalLM`` with a mixture of experts on every layer (Mixtral): the Llama
    fields, ``hidden_act: swiglu``, the experts' FFN as ``intermediate_size`` and ``moe``."""
    out = _llama_config(cfg)
    moe = spec_of(cfg).moe
    if moe is None:
        return out
    return {**out, "hidden_act": "swiglu", "intermediate_size": moe.ffn, "moe": _moe_fields(cfg, moe)}


#: TensorRT-LLM's ``LLaMAForCausalLM`` (Llama, Mistral): the config projection a family names.
LLAMA_FIELDS: Callable[[dict[str, Any]], dict[str, Any]] = _llama_config
#: ``LLaMAForCausalLM`` with a mixture of experts (Mixtral).
LLAMA_MOE_FIELDS: Callable[[dict[str, Any]], dict[str, Any]] = _llama_moe_config


def qwen_fields(qwen_type: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """TensorRT-LLM's ``QWenForCausalLM`` of ``qwen_type`` (``"qwen2"``, ``"qwen3"``)."""
    return _qwen_config(qwen_type)


def gpt_trtllm(architecture: str, fields: Callable[[dict[str, Any]], dict[str, Any]]) -> TrtllmTable:
    """The GPT base's TensorRT-LLM target for a family whose TensorRT-LLM model is confirmed:
    ``architecture`` (``config.json``; a ``MODEL_MAP`` key) and its config projection. A
    family declares it on its record (``gpt_family(..., trtllm=gpt_trtllm(...))``); a family
    without one is refused by name."""
    return TrtllmTable(architecture, GPT_TRTLLM_NAMES, fields, kv_cache=GPT_KV_CACHE, kv_of=GPT_KV_OF)
