"""Mapping rules: what a family plugin declares, as data.

Names are templates: ``{i}`` stands for a layer index and is expanded over
``range(cfg[layers])`` (``{i:PATH}`` over the layers that the Megatron layer pattern at
config ``PATH`` selects — ``moe_layer_freq``: the mixture-of-experts layers of a mixed
stack — and ``{i:!PATH}`` over the others); ``{e}`` stands for an expert and is expanded
over ``range(cfg[experts])`` (``num_moe_experts``). NeMo names here are *logical*: per layer, without the ``model.``
prefix (``decoder.layers.{i}.self_attention.linear_qkv.weight``); the format writers
decide stacking and prefixes. Config references (``heads="num_attention_heads"``) are
dotted paths into the NeMo config, so a rule set can be reused under a prefix
(:meth:`Mapping.nested`) — e.g. LLaVA reuses the Llama rules for its language model.

Each rule has an inverse; export is derived from import and never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Callable, Sequence, Union

import torch

from nemo_convert.errors import ConfigError


class Parallel(str, Enum):
    """How a NeMo tensor is split across tensor-parallel ranks (the sharding strategies
    hold the mechanics; plugins only name the kind)."""

    REPLICATED = "replicated"
    COLUMN = "column"        # dim 0
    ROW = "row"              # dim 1
    VOCAB = "vocab"          # dim 0, padded to a multiple of divisible_by × TP
    QKV = "qkv"              # dim 0 in whole query groups
    GATED_FC1 = "gated_fc1"  # gate and up halves chunked separately: rank r = [gate_r; up_r]


def cfg_get(cfg: dict[str, Any], path: str | None, default: Any = None) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; ``default`` when any part is missing or None."""
    if path is None:
        return default
    cur: Any = cfg
    for part in path.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            return default
        cur = cur[part]
    return cur


def layer_pattern(value: Any, layers: int) -> list[bool]:
    """Megatron's per-layer pattern (``moe_layer_freq``): an int ``N`` selects every N-th
    layer from 0 (1: all), a list gives one 0/1 per layer; None selects none."""
    if value is None:
        return [False] * layers
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise ConfigError(f"layer pattern {value!r} is neither an int nor a list")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"layer pattern {value} is not a positive frequency")
        return [i % value == 0 for i in range(layers)]
    if len(value) != layers:
        raise ConfigError(f"layer pattern {list(value)} has {len(value)} entries for {layers} layers")
    return [bool(v) for v in value]


def condition_holds(cfg: dict[str, Any], when: str | None) -> bool:
    """``when="bias"`` holds when ``cfg.bias`` is truthy; ``"!bias"`` when it is not."""
    if when is None:
        return True
    if when.startswith("!"):
        return not cfg_get(cfg, when[1:], False)
    return bool(cfg_get(cfg, when, False))


def _pre(prefix: str, name: str) -> str:
    return prefix + name if prefix else name


def _pre_cfg(prefix: str, path: str | None) -> str | None:
    if path is None or not prefix:
        return path
    if path.startswith("!"):
        return "!" + prefix + path[1:]
    return prefix + path


@dataclass(frozen=True)
class Rename:
    """One HF tensor is one NeMo tensor, unchanged.

    ``shape`` optionally states the NeMo tensor's shape in config terms: each entry an
    int, a config path, or ``None`` for "any"; the planner checks it before writing.
    """

    hf: str
    nemo: str
    parallel: Parallel = Parallel.REPLICATED
    when: str | None = None
    shape: tuple[Union[int, str, None], ...] | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Rename":
        shape = None if self.shape is None else tuple(
            _pre_cfg(cfg, s) if isinstance(s, str) else s for s in self.shape)
        return replace(self, hf=_pre(hf, self.hf), nemo=_pre(nemo, self.nemo),
                       when=_pre_cfg(cfg, self.when), shape=shape)


@dataclass(frozen=True)
class FuseQKV:
    """HF q, k, v projections (weights or biases) ⇄ Megatron's grouped ``linear_qkv``."""

    q: str
    k: str
    v: str
    nemo: str
    heads: str = "num_attention_heads"
    groups: str = "num_query_groups"
    head_dim: str = "kv_channels"
    hidden: str = "hidden_size"
    parallel: Parallel = Parallel.QKV
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "FuseQKV":
        return replace(self, q=_pre(hf, self.q), k=_pre(hf, self.k), v=_pre(hf, self.v),
                       nemo=_pre(nemo, self.nemo), heads=_pre_cfg(cfg, self.heads),
                       groups=_pre_cfg(cfg, self.groups), head_dim=_pre_cfg(cfg, self.head_dim),
                       hidden=_pre_cfg(cfg, self.hidden), when=_pre_cfg(cfg, self.when))

    def geometry(self, cfg: dict[str, Any]) -> dict[str, int]:
        heads = int(cfg_get(cfg, self.heads))
        groups = int(cfg_get(cfg, self.groups, heads))
        head_dim = cfg_get(cfg, self.head_dim)
        if head_dim is None:
            head_dim = int(cfg_get(cfg, self.hidden)) // heads
        return {"heads": heads, "groups": groups, "head_dim": int(head_dim)}


@dataclass(frozen=True)
class PackedQKV:
    """One HF tensor holding ``[q; k; v]`` one after another (Phi-3's ``qkv_proj``) ⇄
    Megatron's grouped ``linear_qkv`` (interleaved per query group, like :class:`FuseQKV`)."""

    hf: str
    nemo: str
    heads: str = "num_attention_heads"
    groups: str = "num_query_groups"
    head_dim: str = "kv_channels"
    hidden: str = "hidden_size"
    parallel: Parallel = Parallel.QKV
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "PackedQKV":
        return replace(self, hf=_pre(hf, self.hf), nemo=_pre(nemo, self.nemo), heads=_pre_cfg(cfg, self.heads),
                       groups=_pre_cfg(cfg, self.groups), head_dim=_pre_cfg(cfg, self.head_dim),
                       hidden=_pre_cfg(cfg, self.hidden), when=_pre_cfg(cfg, self.when))

    def geometry(self, cfg: dict[str, Any]) -> dict[str, int]:
        return FuseQKV("", "", "", "", self.heads, self.groups, self.head_dim, self.hidden).geometry(cfg)


@dataclass(frozen=True)
class Offset:
    """One HF tensor is one NeMo tensor plus a constant: ``nemo = hf + value`` (NeMo 1
    Gemma's norms store ``1 + w`` where Hugging Face stores ``w``). Not bit-exact in
    general (``(w + 1) - 1`` rounds), so families use it only to *read* such checkpoints."""

    hf: str
    nemo: str
    value: float
    parallel: Parallel = Parallel.REPLICATED
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Offset":
        return replace(self, hf=_pre(hf, self.hf), nemo=_pre(nemo, self.nemo), when=_pre_cfg(cfg, self.when))


@dataclass(frozen=True)
class FuseGated:
    """HF gate and up projections ⇄ Megatron's gated ``linear_fc1`` = ``[gate; up]``."""

    gate: str
    up: str
    nemo: str
    ffn: str | None = "ffn_hidden_size"
    parallel: Parallel = Parallel.GATED_FC1
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "FuseGated":
        return replace(self, gate=_pre(hf, self.gate), up=_pre(hf, self.up), nemo=_pre(nemo, self.nemo),
                       ffn=_pre_cfg(cfg, self.ffn), when=_pre_cfg(cfg, self.when))


@dataclass(frozen=True)
class Reshape:
    """One HF tensor is one NeMo tensor of another shape with the same elements (e.g. a
    class token ``[H]`` ⇄ ``[1, 1, H]``). ``nemo_shape`` entries are ints or config paths;
    the HF shape is restored from the source on export via ``hf_shape``."""

    hf: str
    nemo: str
    nemo_shape: tuple[Union[int, str], ...]
    hf_shape: tuple[Union[int, str], ...]
    parallel: Parallel = Parallel.REPLICATED
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Reshape":
        def fix(shape: tuple[Union[int, str], ...]) -> tuple[Union[int, str], ...]:
            return tuple(_pre_cfg(cfg, s) if isinstance(s, str) else s for s in shape)  # type: ignore[misc]
        return replace(self, hf=_pre(hf, self.hf), nemo=_pre(nemo, self.nemo), nemo_shape=fix(self.nemo_shape),
                       hf_shape=fix(self.hf_shape), when=_pre_cfg(cfg, self.when))

    def resolve(self, cfg: dict[str, Any], which: str) -> tuple[int, ...]:
        shape = self.nemo_shape if which == "nemo" else self.hf_shape
        return tuple(int(cfg_get(cfg, s)) if isinstance(s, str) else int(s) for s in shape)


@dataclass(frozen=True)
class StackedExperts:
    """One HF tensor holding every expert of a layer on dim 0 (transformers v5's fused
    ``experts.gate_up_proj`` / ``experts.down_proj``) ⇄ one NeMo tensor per expert
    (``nemo`` has ``{e}``). ``parallel`` is the kind of each expert's NeMo tensor."""

    hf: str
    nemo: str
    parallel: Parallel = Parallel.REPLICATED
    when: str | None = None
    transpose: bool = False  # HF stores each expert as ``x @ W`` (GPT-OSS)
    interleaved: bool = False  # HF's gate/up rows alternate (GPT-OSS)

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "StackedExperts":
        return replace(self, hf=_pre(hf, self.hf), nemo=_pre(nemo, self.nemo), when=_pre_cfg(cfg, self.when))


TensorFn = Callable[[Sequence[torch.Tensor], dict[str, Any]], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class Custom:
    """The escape hatch: a pure function pair over several tensors.

    ``to_nemo(hf_tensors, cfg)`` returns the NeMo tensors in ``nemo`` order and
    ``to_hf(nemo_tensors, cfg)`` the HF tensors in ``hf`` order. Both must work on meta
    tensors (the planner learns shapes that way) and be exact inverses.
    """

    hf: tuple[str, ...]
    nemo: tuple[str, ...]
    to_nemo: TensorFn
    to_hf: TensorFn
    parallel: tuple[Parallel, ...] | Parallel = Parallel.REPLICATED
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Custom":
        if cfg:
            # Functions see the config of their own section.
            def sub(c: dict[str, Any]) -> dict[str, Any]:
                return cfg_get(c, cfg.rstrip("."), {}) or {}
            to_nemo, to_hf = self.to_nemo, self.to_hf
            wrapped_nemo: TensorFn = lambda ts, c: to_nemo(ts, sub(c))  # noqa: E731
            wrapped_hf: TensorFn = lambda ts, c: to_hf(ts, sub(c))  # noqa: E731
        else:
            wrapped_nemo, wrapped_hf = self.to_nemo, self.to_hf
        return replace(self, hf=tuple(_pre(hf, k) for k in self.hf),
                       nemo=tuple(_pre(nemo, k) for k in self.nemo), to_nemo=wrapped_nemo,
                       to_hf=wrapped_hf, when=_pre_cfg(cfg, self.when))


@dataclass(frozen=True)
class Tied:
    """An HF tensor that must equal another (``lm_head`` of a tied model): on import it
    is checked and consumed when present; on export it is not written (HF re-ties)."""

    hf: str
    same_as: str
    when: str | None = None

    def prefixed(self, hf: str, nemo: str, cfg: str) -> "Tied":
        return replace(self, hf=_pre(hf, self.hf), same_as=_pre(hf, self.same_as),
                       when=_pre_cfg(cfg, self.when))


Rule = Union[Rename, Reshape, FuseQKV, PackedQKV, FuseGated, Offset, StackedExperts, Custom, Tied]


@dataclass(frozen=True)
class Mapping:
    """A family's complete mapping: rules plus the tensors known to be droppable.

    :param rules: the rules, in the order tensors should be written.
    :param layers: config path of the layer count that ``{i}`` ranges over.
    :param experts: config path of the expert count that ``{e}`` ranges over.
    :param drop_hf: HF names (templates, ``*`` globs allowed) that are not weights of the
        model (e.g. ``rotary_emb.inv_freq``): consumed without output on import.
    :param drop_nemo: likewise on the NeMo side for export.
    """

    rules: tuple[Rule, ...]
    layers: str = "num_layers"
    drop_hf: tuple[str, ...] = ()
    drop_nemo: tuple[str, ...] = ()
    sections: tuple["Mapping", ...] = field(default=())
    experts: str = "num_moe_experts"

    def nested(self, *, hf_prefix: str = "", nemo_prefix: str = "", cfg_prefix: str = "") -> "Mapping":
        """This mapping under prefixes: for composing multimodal families."""
        return Mapping(
            rules=tuple(r.prefixed(hf_prefix, nemo_prefix, cfg_prefix) for r in self.rules),
            layers=_pre_cfg(cfg_prefix, self.layers) or self.layers,
            experts=_pre_cfg(cfg_prefix, self.experts) or self.experts,
            drop_hf=tuple(_pre(hf_prefix, d) for d in self.drop_hf),
            drop_nemo=tuple(_pre(nemo_prefix, d) for d in self.drop_nemo),
            sections=tuple(s.nested(hf_prefix=hf_prefix, nemo_prefix=nemo_prefix, cfg_prefix=cfg_prefix)
                           for s in self.sections),
        )

    def combine(self, *others: "Mapping") -> "Mapping":
        """One mapping made of this one and ``others``, each keeping its own layer count."""
        return Mapping(rules=(), sections=(self, *others))

    def parts(self) -> list["Mapping"]:
        """The flat list of (rules, layers, drops) sections, this one first."""
        out: list[Mapping] = []
        if self.rules or self.drop_hf or self.drop_nemo:
            out.append(Mapping(self.rules, self.layers, self.drop_hf, self.drop_nemo, experts=self.experts))
        for s in self.sections:
            out.extend(s.parts())
        return out
