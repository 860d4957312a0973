"""``.qnemo``: quantized TensorRT-LLM checkpoints (``nemo-convert quantize``).

>>> from nemo_convert.qnemo import quantize
>>> rep = quantize("llama-hf/", "llama.qnemo", algo="int4_awq", tp=2)   # doctest: +SKIP

A family opts in by setting ``ModelFamily.trtllm`` to a :class:`TrtllmSpec` (data only);
the core plans, checks, calibrates, quantizes, slices and streams. See docs/qnemo.md.
"""

from __future__ import annotations

from nemo_convert.qnemo.driver import QuantizeReport, quantize
from nemo_convert.qnemo.spec import KvCacheScale, TrtllmSpec, TrtTensor, rope_fields

__all__ = ["KvCacheScale", "QuantizeReport", "TrtTensor", "TrtllmSpec", "quantize", "rope_fields"]
