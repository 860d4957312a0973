"""``.qnemo``: quantized TensorRT-LLM checkpoints (``nemo-convert quantize``).

>>> from nemo_convert.qnemo import quantize
>>> rep = quantize("llama-hf/", "llama.qnemo", algo="int4_awq", tp=2)   # doctest: +SKIP

A family opts in with ``ModelFamily.trtllm``, a
:class:`~nemo_convert.families.trtllm.TrtllmTable` (NeMo logical names → TensorRT-LLM names;
every confirmed GPT-base family gets the GPT base's); :func:`derive_spec` joins it with the
family's mapping. The core plans, checks, calibrates, quantizes, slices and streams. See
docs/qnemo.md.
"""

from __future__ import annotations

from nemo_convert.qnemo.driver import QuantizeReport, quantize
from nemo_convert.qnemo.spec import KvCacheScale, TrtllmSpec, TrtTensor, derive_spec

__all__ = ["KvCacheScale", "QuantizeReport", "TrtTensor", "TrtllmSpec", "derive_spec", "quantize"]
