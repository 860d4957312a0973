"""Precision ⇄ dtype, once.

NeMo 1 records the weights' dtype as ``precision`` (``bf16`` / ``bf16-mixed``, ``16`` /
``16-mixed``, ``32`` / ``32-true``: PyTorch Lightning's spellings); Megatron-Core,
Megatron-Bridge and NeMo 2 as ``bf16`` / ``fp16`` switches with ``params_dtype``;
Hugging Face as ``torch_dtype`` (v4) or ``dtype`` (v5). Every config here goes through
these three functions, with dtypes named as torch names them (``bfloat16``).
"""

from __future__ import annotations

from typing import Any

#: NeMo ``precision`` (as a string) → the dtype's name; anything else is float32.
DTYPE_OF_PRECISION: dict[str, str] = {
    "bf16": "bfloat16", "bf16-mixed": "bfloat16", "16": "float16", "16-mixed": "float16",
    "32": "float32", "32-true": "float32",
}
#: The dtype's name → the ``precision`` NeMo's converters write.
PRECISION_OF_DTYPE: dict[str, Any] = {"bfloat16": "bf16", "float16": 16, "float32": 32}


def dtype_name_of_precision(precision: Any) -> str:
    """``bfloat16`` / ``float16`` / ``float32`` for a NeMo ``precision``."""
    return DTYPE_OF_PRECISION.get(str(precision), "float32")


def precision_of_dtype_name(name: str | None) -> Any:
    """NeMo ``precision`` for a dtype name (``bfloat16``; anything else, ``torch.``-prefixed
    names included, is 32, as HF's loaders read ``torch_dtype``)."""
    return PRECISION_OF_DTYPE.get(str(name or ""), 32)


def dtype_name_of_flags(bf16: Any, fp16: Any, params_dtype: str | None) -> str:
    """The dtype of a Megatron-Core / Megatron-Bridge / NeMo 2 config: its ``bf16`` or
    ``fp16`` switch, else its ``params_dtype`` (a torch name, ``torch.`` prefix allowed)."""
    dtype = str(params_dtype or "").removeprefix("torch.")
    if bf16 or dtype == "bfloat16":
        return "bfloat16"
    if fp16 or dtype == "float16":
        return "float16"
    return "float32"
