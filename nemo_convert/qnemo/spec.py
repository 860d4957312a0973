"""What a model family declares for ``quantize``: its TensorRT-LLM checkpoint mapping, as data.

A family plugin sets ``ModelFamily.trtllm`` to a :class:`TrtllmSpec`. The spec says, for
every tensor of a TensorRT-LLM rank file, which Hugging Face tensors it is built from, how
it is split across tensor-parallel ranks and whether ``quantize`` quantizes it. It also
gives the function that turns the HF ``config.json`` into the model fields of TensorRT-LLM's
``config.json``. The core (:mod:`nemo_convert.qnemo.plan`) does every tensor operation:
fusing, casting, quantizing, slicing and writing.

Names are templates: ``{i}`` is a decoder layer. In HF names it is the global layer index;
in TensorRT-LLM names it becomes the index *within the pipeline stage* (rank files of a
pipeline stage number their layers from 0, as TensorRT-LLM's own converters write them:
``tensorrt_llm/models/llama/convert.py`` uses ``transformer.layers.{l - layers_range[0]}``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nemo_convert.hf_config import read_rope
from nemo_convert.mapping.rules import Parallel
from nemo_convert.quant.trtllm_names import DEFAULT_EXCLUDE_MODULES

Stage = Literal["first", "last"]


@dataclass(frozen=True)
class TrtTensor:
    """One tensor of a TensorRT-LLM rank file (or, with ``quantize``, one linear layer).

    :param name: TensorRT-LLM name, ``{i}`` for the layer (e.g.
        ``"transformer.layers.{i}.attention.qkv.weight"``).
    :param hf: the HF tensors it is built from. Several are concatenated along dim 0
        (``[q; k; v]``). When the tensor is column-parallel, each one is split across the
        ranks *separately*, so rank ``r`` holds ``[q_r; k_r; v_r]``.
    :param parallel: ``COLUMN`` (dim 0), ``ROW`` (dim 1), ``VOCAB`` (dim 0, zero-padded to a
        multiple of TP) or ``REPLICATED``.
    :param quantize: a linear weight (``[out, in]``, name ending in ``.weight``) that the
        algorithm quantizes; the algorithm's scale tensors are written beside it under the
        same prefix.
    :param units: for each ``hf`` source, the key of the TensorRT-LLM config that counts its
        indivisible units along dim 0 (heads): TP must divide each count.
    :param fallback: HF tensors to use when the ``hf`` ones are absent (a tied ``lm_head``
        is read from the embedding).
    :param stage: for tensors outside the decoder layers, the pipeline stage holding them.
    """

    name: str
    hf: tuple[str, ...]
    parallel: Parallel = Parallel.REPLICATED
    quantize: bool = False
    units: tuple[str, ...] = ()
    fallback: tuple[str, ...] = ()
    stage: Stage | None = None

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name

    @property
    def prefix(self) -> str:
        """The linear's name (``name`` without ``.weight``): the prefix of its scale tensors."""
        return self.name.removesuffix(".weight")


@dataclass(frozen=True)
class KvCacheScale:
    """Where the FP8 KV-cache scale goes, and which HF modules produce K and V.

    ``kv_cache_scaling_factor = max(k_amax, v_amax) / 448`` from the calibrated output
    amax of the ``k`` and ``v`` modules (HF module names, ``{i}`` for the layer).
    """

    name: str
    k: str
    v: str


@dataclass(frozen=True)
class TrtllmSpec:
    """A family's TensorRT-LLM checkpoint mapping (``ModelFamily.trtllm``).

    :param architecture: the ``architecture`` field of ``config.json``.
    :param tensors: every rank-file tensor; layer tensors are written in this order.
    :param config: HF ``config.json`` → TensorRT-LLM model fields (``vocab_size``,
        ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
        ``num_key_value_heads``, ``head_size``, ``intermediate_size`` and the family's own);
        the core adds ``architecture``, ``dtype``, ``mapping`` and ``quantization``.
    :param kv_cache: where an FP8 KV-cache scale goes; None: the family has no KV cache.
    :param drop_hf: HF tensors that are not weights (buffers), ``{i}`` allowed.
    :param exclude_modules: ``quantization.exclude_modules``: modules left unquantized.
    :param layers: the config key holding the number of decoder layers.
    """

    architecture: str
    tensors: tuple[TrtTensor, ...]
    config: Callable[[dict[str, Any]], dict[str, Any]]
    kv_cache: KvCacheScale | None = None
    drop_hf: tuple[str, ...] = ()
    exclude_modules: tuple[str, ...] = DEFAULT_EXCLUDE_MODULES
    layers: str = "num_hidden_layers"


def rope_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """``rotary_base`` and ``rotary_scaling`` from any spelling of HF's RoPE config.

    TensorRT-LLM reads ``rotary_scaling["type"]`` (and ``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings`` for ``llama3``), so the
    block is written with ``type`` whatever the source spelled (``rope_type`` in newer
    transformers); ``None`` when there is no scaling.
    """
    rope = read_rope(hf)
    scaling = None if rope.kind == "default" else {"type": rope.kind, **rope.params}
    return {"rotary_base": rope.theta, "rotary_scaling": scaling}
