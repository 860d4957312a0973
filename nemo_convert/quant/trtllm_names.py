"""TensorRT-LLM's per-algorithm tensors, their TP split and the ``quantization`` config section.

The names of the model's own tensors are not here: they come from the family's mapping and
its TensorRT-LLM table (:mod:`nemo_convert.families.trtllm`).

Sources (cited below by key):

* **[T]** TensorRT-LLM ``docs/source/architecture/checkpoint.md`` (@01c4ece9): sections
  "Config" (fields and defaults, algorithm lists), "Rank Weights" (``attention.qkv``,
  ``attention.dense``, ``mlp.fc``, ``mlp.proj``, ``input_layernorm``,
  ``post_layernorm``), "KV Cache Quantization Scaling Factors", "FP8 Quantization
  Scaling Factors", "AWQ Quantization Scaling Factors", and the note that linear
  weights are ``(out_feature, in_feature)``.
* **[L]** ``tensorrt_llm/quantization/layers.py`` (@2340c776): parameter names, shapes
  and dtypes of ``WeightOnlyQuantLinear`` (``weight (in, out) int8``,
  ``per_channel_scale (out,)``), ``WeightOnlyGroupwiseQuantLinear``
  (``weights_scaling_factor (in//g, out)``, ``prequant_scaling_factor (1, in)``),
  ``FP8Linear`` (``weights_scaling_factor``/``activation_scaling_factor`` ``(1,)`` f32).
* **[P]** ``tensorrt_llm/models/modeling_utils.py`` ``preprocess_perlayer_weights``:
  W4A16_AWQ int8-packed weights are transposed and interleaved by TensorRT-LLM,
  ``weights_scaling_factor`` transposed and cast to the model dtype,
  ``prequant_scaling_factor`` reshaped to ``(1, -1)``; FP8 int8 weights viewed as
  fp8; W8A16/W4A16 float weights quantized by TensorRT-LLM itself.
* **[Q]** ``tensorrt_llm/quantization/quantize.py``: default ``exclude_modules``
  (``*lm_head``, ``*vocab_embedding``, ...) used only when the config gives none;
  ``kv_cache_scaling_factor`` ``(1,)`` f32 per attention.
* **[M]** ``tensorrt_llm/quantization/mode.py`` ``QuantMode.from_quant_algo``: ``W4A16``
  is per-channel int4, ``W4A16_AWQ`` group-wise (``per_group``).
* **[O]** ModelOpt ``modelopt/torch/export/quant_utils.py``
  ``process_layer_quant_config``: ``int4_awq`` → ``W4A16_AWQ`` with ``group_size``,
  ``has_zero_point: false``, ``pre_quant_scale: true``; ``fp8`` → ``FP8``;
  ``int8_wo`` → ``W8A16``.
"""

from __future__ import annotations

from typing import Any, Literal

from nemo_convert.errors import UnsupportedError
from nemo_convert.quant.algorithms import ALGORITHMS, DEFAULT_GROUP_SIZE

Parallel = Literal["column", "row"]


#: nemo-convert algorithm → TensorRT-LLM ``quant_algo`` [T "Config"; O; M].
#: Group-wise int4 weight-only is ``W4A16_AWQ`` without a pre-quant scale: TensorRT-LLM's
#: ``W4A16`` is per-channel int4 (no ``per_group`` in its QuantMode) [M].
QUANT_ALGO: dict[str, str] = {
    "int8_wo": "W8A16",
    "int4_wo": "W4A16_AWQ",
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
}

#: Tensor suffixes each algorithm writes per quantized linear [L, T].
LINEAR_TENSORS: dict[str, tuple[str, ...]] = {
    "int8_wo": ("weight", "per_channel_scale"),
    "int4_wo": ("weight", "weights_scaling_factor"),
    "fp8": ("weight", "weights_scaling_factor", "activation_scaling_factor"),
    "int4_awq": ("weight", "weights_scaling_factor", "prequant_scaling_factor"),
}

#: Modules left unquantized. Exact module names satisfy both of TensorRT-LLM's
#: matchers (fnmatch in ``quantize_layers``, equality/prefix in ``_get_quant_cfg``).
#: The embedding is listed because an explicit list replaces TensorRT-LLM's default
#: one, and W8A16's quantizer would otherwise turn the embedding into a quantized
#: embedding that needs a ``per_channel_scale`` [Q].
DEFAULT_EXCLUDE_MODULES: tuple[str, ...] = ("lm_head", "transformer.vocab_embedding")

#: Split axis of each tensor (HF orientation noted per algorithm in the quant modules)
#: for ("column" | "row") parallel linears; ``None`` means replicated on every rank.
_SPLIT: dict[str, dict[str, tuple[int | None, int | None]]] = {
    # weight is [in, out] for W8A16 [L]; per_channel_scale [out].
    "int8_wo": {"weight": (1, 0), "per_channel_scale": (0, None)},
    # weight [out/2, in] packed along out; scales [out, in/g].
    "int4_wo": {"weight": (0, 1), "weights_scaling_factor": (0, 1)},
    "int4_awq": {"weight": (0, 1), "weights_scaling_factor": (0, 1),
                 "prequant_scaling_factor": (None, 0)},
    # weight [out, in]; per-tensor scales replicated.
    "fp8": {"weight": (0, 1), "weights_scaling_factor": (None, None),
            "activation_scaling_factor": (None, None)},
}


def _check_algo(algo: str) -> None:
    if algo not in ALGORITHMS:
        raise UnsupportedError(f"unknown quantization algorithm {algo!r}; "
                               f"expected one of {', '.join(ALGORITHMS)}")


def tp_split_dim(algo: str, suffix: str, parallel: Parallel) -> int | None:
    """Axis along which tensor ``suffix`` of a quantized linear is split across TP ranks.

    ``None``: the tensor is replicated. Row-parallel int4 needs ``in/tp`` to be a
    multiple of the group size; column-parallel int4 needs an even ``out/tp``.
    """
    _check_algo(algo)
    table = _SPLIT[algo]
    if suffix not in table:
        raise UnsupportedError(f"{algo} has no tensor {suffix!r}")
    col, row = table[suffix]
    return col if parallel == "column" else row


def quantization_section(algo: str | None, *, kv_cache_fp8: bool = False,
                         group_size: int = DEFAULT_GROUP_SIZE,
                         exclude_modules: tuple[str, ...] | list[str] | None = None
                         ) -> dict[str, Any]:
    """The ``quantization`` object of the checkpoint's ``config.json``.

    Field names and meaning per [T "Config"]; the group-wise fields are written only for
    the int4 algorithms, as ModelOpt does [O]. ``algo=None`` with ``kv_cache_fp8`` gives
    an FP8-KV-only checkpoint.
    """
    kv = "FP8" if kv_cache_fp8 else None
    if algo is None:
        return {"quant_algo": None, "kv_cache_quant_algo": kv}
    _check_algo(algo)
    excl = list(DEFAULT_EXCLUDE_MODULES if exclude_modules is None else exclude_modules)
    section: dict[str, Any] = {"quant_algo": QUANT_ALGO[algo], "kv_cache_quant_algo": kv}
    if algo in ("int4_wo", "int4_awq"):
        section["group_size"] = group_size
        section["has_zero_point"] = False
        section["pre_quant_scale"] = algo == "int4_awq"
    section["exclude_modules"] = excl
    return section
