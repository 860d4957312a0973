"""``.qnemo``: quantized TensorRT-LLM checkpoints (``nemo-convert quantize``).

>>> from nemo_convert.qnemo import quantize
>>> rep = quantize("llama-hf/", "llama.qnemo", algo="int4_awq", tp=2)   # doctest: +SKIP

A family opts in with ``ModelFamily.trtllm``, a
:class:`~nemo_convert.families.trtllm.TrtllmTable` (the TensorRT-LLM architecture, NeMo
logical names → TensorRT-LLM names, the config fields; a GPT-base family declares the GPT
base's with ``gpt_trtllm``). The core plans it with the one planner over the NeMo tensors
(:func:`~nemo_convert.qnemo.target.plan_target`), adds the quantization tasks, checks,
calibrates, quantizes, slices and streams. See docs/qnemo.md.
"""

from __future__ import annotations

from nemo_convert.qnemo.driver import QuantizeReport, quantize
from nemo_convert.qnemo.target import plan_target

__all__ = ["QuantizeReport", "plan_target", "quantize"]
