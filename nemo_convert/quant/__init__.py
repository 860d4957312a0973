"""Quantization math for TensorRT-LLM (``.qnemo``) checkpoints, as pure torch functions.

Algorithms (one linear weight in, TensorRT-LLM tensors out, and back):

* ``int8_wo``  — :func:`quantize_int8_wo` / :func:`dequantize_int8_wo` (W8A16)
* ``int4_wo``  — :func:`quantize_int4_wo` / :func:`dequantize_int4_wo` (group-wise int4)
* ``fp8``      — :func:`quantize_fp8` / :func:`dequantize_fp8`, and
  :func:`fp8_kv_cache_scaling_factor`
* ``int4_awq`` — :func:`quantize_int4_awq` / :func:`dequantize_int4_awq`

plus :func:`quantize_linear` / :func:`dequantize_linear` by name, calibration in
:mod:`.calibrate`, and TensorRT-LLM names/config data in :mod:`.trtllm_names`.
See docs/quantization.md.
"""

from __future__ import annotations

from nemo_convert.quant.algorithms import (
    ALGORITHMS,
    DEFAULT_GROUP_SIZE,
    dequantize_linear,
    dequantizer,
    quantize_linear,
)
from nemo_convert.quant.awq import (
    AwqSearchResult,
    awq_search,
    dequantize_int4_awq,
    quantize_int4_awq,
)
from nemo_convert.quant.calibrate import (
    Stats,
    builtin_calibration_texts,
    collect_activation_stats,
    merge_stats,
    tokenize_calibration,
)
from nemo_convert.quant.fp8 import (
    FP8_E4M3_MAX,
    dequantize_fp8,
    fake_quantize_fp8,
    fp8_error_bound,
    fp8_kv_cache_scaling_factor,
    quantize_fp8,
)
from nemo_convert.quant.int4 import dequantize_int4_wo, pack_int4, quantize_int4_wo, unpack_int4
from nemo_convert.quant.int8 import dequantize_int8_wo, quantize_int8_wo

__all__ = [
    "ALGORITHMS", "DEFAULT_GROUP_SIZE", "FP8_E4M3_MAX", "AwqSearchResult", "Stats",
    "awq_search", "builtin_calibration_texts", "collect_activation_stats",
    "dequantize_fp8", "dequantize_int4_awq", "dequantize_int4_wo", "dequantize_int8_wo",
    "dequantize_linear", "dequantizer", "fake_quantize_fp8", "fp8_error_bound",
    "fp8_kv_cache_scaling_factor", "merge_stats", "pack_int4", "quantize_fp8",
    "quantize_int4_awq", "quantize_int4_wo", "quantize_int8_wo", "quantize_linear",
    "tokenize_calibration", "unpack_int4",
]
