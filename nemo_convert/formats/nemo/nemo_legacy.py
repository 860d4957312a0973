"""NeMo's pre-Megatron-Core GPT checkpoints (``mcore_gpt: false``), read under Megatron-Core names.

Before Megatron-Core, NeMo's ``MegatronGPTModel`` saved its own module tree. Its
``model_weights.ckpt`` (TP1) and per-rank files (``mp_rank_XX/``, ``tp_rank_XX_pp_rank_YYY/``)
hold, after the ``model.`` prefix (NeMo @ ``8cfedd7203``, file:line):

=============================================================  ==========================================
legacy name (``language_model.`` …)                             Megatron-Core name
=============================================================  ==========================================
``embedding.word_embeddings.weight``                           ``embedding.word_embeddings.weight``
``embedding.position_embeddings.weight`` (learned positions)    ``embedding.position_embeddings.weight``
``encoder.layers.N.input_layernorm.{weight,bias}``              ``decoder.layers.N.self_attention.linear_qkv.layer_norm_{weight,bias}``
``encoder.layers.N.self_attention.query_key_value.{w,b}``       ``decoder.layers.N.self_attention.linear_qkv.{w,b}``
``encoder.layers.N.self_attention.dense.{w,b}``                 ``decoder.layers.N.self_attention.linear_proj.{w,b}``
``encoder.layers.N.post_attention_layernorm.{weight,bias}``     ``decoder.layers.N.mlp.linear_fc1.layer_norm_{weight,bias}``
``encoder.layers.N.mlp.dense_h_to_4h.{w,b}`` [+ ``_2``]        ``decoder.layers.N.mlp.linear_fc1.{w,b}``
``encoder.layers.N.mlp.dense_4h_to_h.{w,b}``                    ``decoder.layers.N.mlp.linear_fc2.{w,b}``
``encoder.final_layernorm.{weight,bias}``                       ``decoder.final_layernorm.{weight,bias}``
``output_layer.weight`` (untied)                                ``output_layer.weight``
``rotary_pos_emb.inv_freq`` (a buffer)                          dropped
``word_embeddings.weight`` (no prefix; a tied model's copy on   ``embedding.word_embeddings.weight`` (the
the last pipeline stage)                                        per-rank reader keeps the first stage's)
=============================================================  ==========================================

This is NeMo's own table, ``scripts/checkpoint_converters/convert_gpt_nemo_to_mcore.py``
``build_key_mapping`` (lines 117–166; norm biases unless ``normalization: rmsnorm``, linear
biases unless ``bias: false``, ``output_layer`` unless tied), which drops
``rotary_pos_emb.inv_freq`` (``--ignore_if_missing`` default, lines 75–79) and builds
``linear_fc1`` as ``cat(dense_h_to_4h, dense_h_to_4h_2)`` (lines 234–242). The tied copy is
``MegatronModule.initialize_word_embeddings`` (``nemo/collections/nlp/modules/common/megatron/
module.py`` line 145). The rest follows from the legacy modules:

* **QKV** (``modules/common/megatron/attention.py``): ``query_key_value`` is one
  ``ColumnParallelLinear`` of ``3 × heads × head_dim`` rows (line 193–195: no query groups in the
  legacy attention), its output viewed per head as ``[q_h; k_h; v_h]`` (lines 426–438) — exactly
  Megatron-Core's grouped layout with ``num_query_groups = num_attention_heads``: a rename. With
  ``megatron_legacy: true`` each rank's rows are ``[q_r; k_r; v_r]`` and the attention regroups
  them per head first (``_transpose_last_dim``, lines 337–369 and 431–432): the same regroup
  (``ops.regroup_qkv_lazy``) is applied per rank before the rank slices are merged.
* **MLP** (``modules/common/megatron/mlp.py``): with ``fast-swiglu`` / ``fast-geglu`` /
  ``fast-reglu`` (line 119) ``dense_h_to_4h`` has ``2 × ffn`` rows (lines 122–132) and each
  rank's output is ``torch.chunk``-ed into gate and up halves (line 230): a rank holds
  ``[gate_r; up_r]``, Megatron-Core's gated fc1 per rank (merged as ``Parallel.GATED_FC1``, as
  ``megatron_change_num_partitions.py`` ``compute_tp_merge`` does, lines 270–279). With
  ``swiglu`` / ``geglu`` / ``reglu`` the gate is ``dense_h_to_4h`` and the up projection a
  second ``dense_h_to_4h_2`` (lines 134–145; ``act(h_to_4h) × h_to_4h_2``, line 250): each
  rank's pair is fused ``[gate_r; up_r]`` (``ops.fuse_gated_lazy``), the same per-rank layout.
  Megatron-Core runs both spellings as one gated unit (``megatron_base_model.py`` lines
  513–514: gated when the name ends in ``glu``), so the config is presented with the ``fast-``
  spelling that describes the fused tensor.
* **TP split** (``examples/nlp/language_modeling/megatron_change_num_partitions.py``
  ``compute_tp_splits``, lines 174–242): same shape → replicated (norms, row-parallel biases,
  learned positions: a ``torch.nn.Embedding``, ``language_model.py`` line 288); same first dim →
  along the last dim (``dense``, ``dense_4h_to_h``); otherwise along dim 0 (``query_key_value``,
  ``dense_h_to_4h``, the vocabulary-parallel embedding and ``output_layer``). These kinds are the
  file's own (:func:`legacy_kind`), whatever the model family says.

Only NeMo's standard pre-LN decoder is read (``transformer_block_type: pre_ln``, the default at
``megatron_gpt_model.py`` line 556); other block types, Transformer-Engine layer names
(``transformer_engine: true``), adapters and anything else not in the table are refused by name.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from nemo_convert.errors import InputError, ShapeError, UnsupportedError
from nemo_convert.mapping import ops
from nemo_convert.mapping.rules import Parallel
from nemo_convert.spec import head_dim
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.pieces import Lazy, materialize

if TYPE_CHECKING:
    import torch

#: The stack of a legacy name (``split_layer_name``'s first part) and its Megatron-Core one.
LEGACY_STACK = "language_model.encoder.layers"
_LAYER = re.compile(r"^language_model\.encoder\.layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
    "self_attention.query_key_value.weight": "self_attention.linear_qkv.weight",
    "self_attention.query_key_value.bias": "self_attention.linear_qkv.bias",
    "self_attention.dense.weight": "self_attention.linear_proj.weight",
    "self_attention.dense.bias": "self_attention.linear_proj.bias",
    "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    "post_attention_layernorm.bias": "mlp.linear_fc1.layer_norm_bias",
    "mlp.dense_h_to_4h.weight": "mlp.linear_fc1.weight",
    "mlp.dense_h_to_4h.bias": "mlp.linear_fc1.bias",
    "mlp.dense_4h_to_h.weight": "mlp.linear_fc2.weight",
    "mlp.dense_4h_to_h.bias": "mlp.linear_fc2.bias",
}
_UP_HALF = {"mlp.dense_h_to_4h_2.weight": "mlp.linear_fc1.weight", "mlp.dense_h_to_4h_2.bias": "mlp.linear_fc1.bias"}
_TOP_NAMES = {
    "language_model.embedding.word_embeddings.weight": "embedding.word_embeddings.weight",
    "language_model.embedding.position_embeddings.weight": "embedding.position_embeddings.weight",
    "language_model.encoder.final_layernorm.weight": "decoder.final_layernorm.weight",
    "language_model.encoder.final_layernorm.bias": "decoder.final_layernorm.bias",
    "language_model.output_layer.weight": "output_layer.weight",
    "word_embeddings.weight": "embedding.word_embeddings.weight",
}
#: Buffers recomputed from the config (``rotary_base``), not weights.
DROPPED = ("language_model.rotary_pos_emb.inv_freq",)
#: Legacy activations with a separate up projection → the fused spelling (mlp.py lines 119, 134).
_SEPARATE_GLU = {"swiglu": "fast-swiglu", "geglu": "fast-geglu", "reglu": "fast-reglu"}
_GATED = ("fast-swiglu", "fast-geglu", "fast-reglu", *_SEPARATE_GLU)


def dropped_note(name: str) -> str:
    return f"dropped {name} (a buffer Megatron-Core recomputes from rotary_base)"


def has_legacy_names(names: list[str]) -> bool:
    """Whether ``model.``-less tensor names are NeMo's pre-Megatron-Core GPT names."""
    return any(n.startswith("language_model.") for n in names)


def legacy_config(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """The config presented with the tensors under Megatron-Core names, and notes; refuses
    (by name) what the legacy reader does not read."""
    block = cfg.get("transformer_block_type") or "pre_ln"
    if block != "pre_ln":
        raise UnsupportedError(f"{where}: transformer_block_type={block!r} (NeMo's legacy GPT layer with other "
                               "norm placement) has no Megatron-Core equivalent here; only pre_ln is read")
    out = dict(cfg)
    notes = ["read NeMo's pre-Megatron-Core (mcore_gpt: false) tensor names as Megatron-Core names "
             "(convert_gpt_nemo_to_mcore.py build_key_mapping)"]
    out["mcore_gpt"] = True
    act = str(cfg.get("activation") or "gelu")
    if act in _SEPARATE_GLU:
        out["activation"] = _SEPARATE_GLU[act]
        notes.append(f"activation {act!r} (gate dense_h_to_4h, up dense_h_to_4h_2) fused as linear_fc1 "
                     f"[gate; up]: {_SEPARATE_GLU[act]!r}")
    heads = int(cfg.get("num_attention_heads") or 0)
    groups = cfg.get("num_query_groups")
    if groups not in (None, heads):
        out["num_query_groups"] = heads
        notes.append(f"num_query_groups={groups} is ignored by NeMo's legacy attention (one query_key_value of "
                     f"3 × heads rows): read as {heads} groups")
    out.pop("megatron_legacy", None)
    return out, notes


def legacy_kind(name: str, gated: bool) -> Parallel:
    """How NeMo's legacy GPT split the tensor Megatron-Core calls ``name`` across TP ranks
    (``megatron_change_num_partitions.py`` ``compute_tp_splits``)."""
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return Parallel.VOCAB
    if name.endswith((".linear_qkv.weight", ".linear_qkv.bias")):
        return Parallel.QKV
    if name.endswith((".linear_fc1.weight", ".linear_fc1.bias")):
        return Parallel.GATED_FC1 if gated else Parallel.COLUMN
    if name.endswith((".linear_proj.weight", ".linear_fc2.weight")):
        return Parallel.ROW
    return Parallel.REPLICATED


def is_gated(cfg: dict[str, Any]) -> bool:
    return str(cfg.get("activation") or "gelu") in _GATED


class LegacyGPTNames:
    """One legacy file's tensors (``model.`` prefix removed) under Megatron-Core names: a
    rank file of TP size ``tp`` (its QKV regrouped per rank where ``megatron_legacy``), or the
    TP1 ``model_weights.ckpt``. ``cfg`` is the checkpoint's own config."""

    def __init__(self, inner: TensorSource, cfg: dict[str, Any], *, where: str, tp: int = 1) -> None:
        self._inner = inner
        self._where = where
        heads = int(cfg.get("num_attention_heads") or 0)
        hidden = int(cfg.get("hidden_size") or 0)
        if heads <= 0 or hidden <= 0 or heads % tp:
            raise InputError(f"{where}: the config's num_attention_heads={heads} / hidden_size={hidden} do not "
                             f"describe a GPT split over {tp} tensor-parallel ranks")
        self._heads = heads // tp
        self._head_dim = head_dim(cfg)
        self._regroup = bool(cfg.get("megatron_legacy"))
        act = str(cfg.get("activation") or "gelu")
        self._separate_up = act in _SEPARATE_GLU
        self._map: dict[str, list[str]] = {}
        self.dropped: list[str] = []
        unknown: list[str] = []
        for k in inner.keys():
            new, second = self._rename(k)
            if k in DROPPED:
                self.dropped.append(k)
            elif new is None:
                unknown.append(k)
            elif second:
                self._map.setdefault(new, [])
                self._map[new].append(k)
            else:
                self._map.setdefault(new, []).insert(0, k)
        if unknown:
            hint = " (Transformer-Engine layers, transformer_engine: true, are not read)" \
                if cfg.get("transformer_engine") else ""
            raise UnsupportedError(f"{where}: {len(unknown)} tensor(s) of NeMo's pre-Megatron-Core GPT are not "
                                   f"understood: {', '.join(unknown[:3])}{', …' if len(unknown) > 3 else ''}{hint}")
        for new, olds in self._map.items():
            fc1 = new.endswith((".linear_fc1.weight", ".linear_fc1.bias"))
            want = 2 if fc1 and self._separate_up else 1
            if len(olds) != want or (want == 2 and not olds[1].split(".mlp.")[-1].startswith("dense_h_to_4h_2")):
                have = ", ".join(olds)
                raise InputError(f"{where}: {new} needs {'dense_h_to_4h and dense_h_to_4h_2' if want == 2 else 'one'}"
                                 f" tensor(s) for activation {act!r}; the file has {have}")
        self._infos: dict[str, TensorInfo] = {}

    @staticmethod
    def _rename(name: str) -> tuple[str | None, bool]:
        if name in _TOP_NAMES:
            return _TOP_NAMES[name], False
        m = _LAYER.match(name)
        if m is None:
            return None, False
        layer, rest = m.groups()
        if rest in _LAYER_NAMES:
            return f"decoder.layers.{layer}.{_LAYER_NAMES[rest]}", False
        if rest in _UP_HALF:
            return f"decoder.layers.{layer}.{_UP_HALF[rest]}", True
        return None, False

    def keys(self) -> list[str]:
        return list(self._map)

    def info(self, key: str) -> TensorInfo:
        if key not in self._infos:
            parts = [self._inner.info(k) for k in self._map[key]]
            shape = parts[0].shape
            if len(parts) == 2:
                if parts[1].shape != shape or parts[1].dtype_name != parts[0].dtype_name:
                    raise ShapeError(f"{self._where}: {self._map[key][0]} {list(shape)} and {self._map[key][1]} "
                                     f"{list(parts[1].shape)} differ")
                shape = (2 * shape[0], *shape[1:])
            if key.endswith((".linear_qkv.weight", ".linear_qkv.bias")) and shape[0] != 3 * self._heads * self._head_dim:
                raise ShapeError(f"{self._where}: {self._map[key][0]} has {shape[0]} rows; NeMo's legacy attention "
                                 f"has 3 × {self._heads} heads × {self._head_dim} = {3 * self._heads * self._head_dim}")
            self._infos[key] = TensorInfo(key, tuple(shape), dtype_name=parts[0].dtype_name)
        return self._infos[key]

    def load_lazy(self, key: str) -> Lazy:
        """The tensor, deferred where it is assembled from rows (:mod:`~nemo_convert.tensors.pieces`)."""
        self.info(key)  # the shape checks
        load = getattr(self._inner, "load_lazy", self._inner.load)
        parts = [load(k) for k in self._map[key]]
        if len(parts) == 2:
            return ops.fuse_gated_lazy(materialize(parts[0]), materialize(parts[1]))
        t = parts[0]
        if self._regroup and key.endswith((".linear_qkv.weight", ".linear_qkv.bias")):
            return ops.regroup_qkv_lazy(t, heads=self._heads, groups=self._heads, head_dim=self._head_dim)
        return t

    def load(self, key: str) -> torch.Tensor:
        return materialize(self.load_lazy(key))

    def group(self, key: str) -> str:
        return self._inner.group(self._map[key][0])

    def close(self) -> None:
        self._inner.close()
