"""A family's TensorRT-LLM checkpoint mapping for ``quantize``, derived, never declared.

A family declares a :class:`~nemo_convert.families.trtllm.TrtllmTable` (NeMo logical name →
TensorRT-LLM name; the GPT base has one for every GPT-base family). :func:`derive_spec`
joins it with the family's own HF ⇄ NeMo mapping into a :class:`TrtllmSpec`: for every
tensor of a TensorRT-LLM rank file, which Hugging Face tensors it is built from (the
sources of the rule that makes the NeMo tensor), how it is split across tensor-parallel
ranks (the rule's parallel kind) and whether ``quantize`` quantizes it. The core
(:mod:`nemo_convert.qnemo.plan`) does every tensor operation: fusing, casting, quantizing,
slicing and writing.

Names are templates: ``{i}`` is a decoder layer. In HF names it is the global layer index;
in TensorRT-LLM names it becomes the index *within the pipeline stage* (rank files of a
pipeline stage number their layers from 0, as TensorRT-LLM's own converters write them:
``tensorrt_llm/models/llama/convert.py`` uses ``transformer.layers.{l - layers_range[0]}``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nemo_convert.errors import UnsupportedError
from nemo_convert.families.trtllm import TrtllmTable
from nemo_convert.mapping.rules import FuseGated, FuseQKV, Mapping, Parallel, Rename, Rule, condition_holds
from nemo_convert.quant.trtllm_names import DEFAULT_EXCLUDE_MODULES

Stage = Literal["first", "last"]
#: The TensorRT-LLM config keys that count the heads of each fused q, k, v source.
HEADS = ("num_attention_heads", "num_key_value_heads", "num_key_value_heads")


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
    :param config: NeMo config → TensorRT-LLM model fields (the table's ``config``).
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


#: The mapping's parallel kind → the TensorRT-LLM split of the tensor it names: fused and
#: gated tensors are column-parallel there, split source by source.
_SPLIT_OF = {Parallel.REPLICATED: Parallel.REPLICATED, Parallel.COLUMN: Parallel.COLUMN, Parallel.ROW: Parallel.ROW,
             Parallel.VOCAB: Parallel.VOCAB, Parallel.QKV: Parallel.COLUMN, Parallel.GATED_FC1: Parallel.COLUMN}


def _producers(mapping: Mapping, cfg: dict[str, Any]) -> tuple[dict[str, Rule], dict[str, Rule]]:
    """NeMo name → the rule making it: ``(active, declared)``, the rules whose condition
    holds for ``cfg`` and every rule of the mapping."""
    active: dict[str, Rule] = {}
    declared: dict[str, Rule] = {}
    for part in mapping.parts():
        for rule in part.rules:
            name = getattr(rule, "nemo", None)  # Tied has none, Custom a tuple: neither is a target here
            if not isinstance(name, str):
                continue
            declared.setdefault(name, rule)
            if condition_holds(cfg, rule.when):
                active.setdefault(name, rule)
    return active, declared


def _sources(rule: Rule, parts: int, what: str) -> list[tuple[str, ...]]:
    """The HF sources of each of the ``parts`` TensorRT-LLM tensors made from ``rule``'s NeMo tensor."""
    if isinstance(rule, FuseQKV) and parts == 1:
        return [(rule.q, rule.k, rule.v)]
    if isinstance(rule, FuseGated) and parts == 2:
        return [(rule.gate,), (rule.up,)]
    if isinstance(rule, Rename) and parts == 1 and rule.parallel is not Parallel.GATED_FC1:
        return [(rule.hf,)]
    raise UnsupportedError(f"{what}: the family makes it with {type(rule).__name__}"
                           f"{'' if not isinstance(rule, Rename) else f' ({rule.parallel.value})'}, which has no "
                           f"TensorRT-LLM derivation into {parts} tensor(s)")


def derive_spec(table: TrtllmTable, mapping: Mapping, cfg: dict[str, Any]) -> TrtllmSpec:
    """The family's TensorRT-LLM mapping for this NeMo config: ``table`` joined with ``mapping``.

    Each row's NeMo tensor is found among the rules the family's mapping has for ``cfg``;
    the rule gives the HF sources (``FuseQKV``: q, k, v; ``FuseGated``: gate then up, one
    per TensorRT-LLM part) and the parallel kind. A rule that only rearranges values in a
    way TensorRT-LLM does not (an ``Offset``, a packed HF tensor split into parts) is
    refused by name.
    """
    active, declared = _producers(mapping, cfg)
    tensors: list[TrtTensor] = []
    for row in table.names:
        rule = active.get(row.nemo)
        fallback: tuple[str, ...] = ()
        if row.fallback is not None:
            # The tied case: the own tensor first (the HF file may hold it), then the fallback's.
            rule = rule or declared.get(row.nemo)
            other = active.get(row.fallback)
            if other is not None:
                fallback = _sources(other, 1, row.fallback)[0]
                if rule is None:
                    rule, fallback = other, ()
        if rule is None:
            continue  # this config has no such tensor (a bias, a q/k norm)
        kind = getattr(rule, "parallel", Parallel.REPLICATED)
        if kind not in _SPLIT_OF:
            raise UnsupportedError(f"{row.nemo}: parallel kind {kind.value!r} has no TensorRT-LLM split")
        for name, hf in zip(row.trtllm, _sources(rule, len(row.trtllm), row.nemo)):
            tensors.append(TrtTensor(name, hf, _SPLIT_OF[kind], quantize=row.quantize,
                                     units=HEADS if isinstance(rule, FuseQKV) else (), fallback=fallback,
                                     stage=row.stage))
    kv = None
    qkv = active.get(table.kv_of or "")
    if table.kv_cache is not None and isinstance(qkv, FuseQKV):
        kv = KvCacheScale(table.kv_cache, k=qkv.k.removesuffix(".weight"), v=qkv.v.removesuffix(".weight"))
    drop = tuple(d for part in mapping.parts() for d in part.drop_hf)
    return TrtllmSpec(table.architecture, tuple(tensors), table.config, kv_cache=kv, drop_hf=drop)
