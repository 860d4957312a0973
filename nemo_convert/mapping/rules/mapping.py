"""A family's complete mapping: its rules, in sections, with what may be dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from nemo_convert.mapping.ops import BufferPool
from nemo_convert.mapping.rules.base import Axes, Specs, prefix_name, prefix_path
from nemo_convert.mapping.rules.protocol import PlanContext, Rule


@dataclass(frozen=True)
class Mapping:
    """A family's complete mapping: rules plus the tensors known to be droppable.

    :param rules: the rules, in the order tensors should be written.
    :param layers: config path of the layer count that ``{i}`` ranges over.
    :param experts: config path of the expert count that ``{e}`` ranges over.
    :param drop_hf: HF names (templates, ``*`` globs allowed) that are not weights of the
        model (e.g. ``rotary_emb.inv_freq``): consumed without output on import.
    :param drop_nemo: likewise on the NeMo side for export.
    :param spec_at: the config section whose typed model spec the rules' :class:`SpecField`
        s read (``""``: the whole config); :meth:`nested` under a config prefix sets it.
    """

    rules: tuple[Rule, ...]
    layers: str = "num_layers"
    drop_hf: tuple[str, ...] = ()
    drop_nemo: tuple[str, ...] = ()
    sections: tuple["Mapping", ...] = field(default=())
    experts: str = "num_moe_experts"
    spec_at: str = ""

    def nested(self, *, hf_prefix: str = "", nemo_prefix: str = "", cfg_prefix: str = "") -> "Mapping":
        """This mapping under prefixes: for composing multimodal families."""
        return Mapping(
            rules=tuple(r.prefixed(hf_prefix, nemo_prefix, cfg_prefix) for r in self.rules),
            layers=prefix_path(cfg_prefix, self.layers) or self.layers,
            experts=prefix_path(cfg_prefix, self.experts) or self.experts,
            drop_hf=tuple(prefix_name(hf_prefix, d) for d in self.drop_hf),
            drop_nemo=tuple(prefix_name(nemo_prefix, d) for d in self.drop_nemo),
            sections=tuple(s.nested(hf_prefix=hf_prefix, nemo_prefix=nemo_prefix, cfg_prefix=cfg_prefix)
                           for s in self.sections),
            spec_at=prefix_name(cfg_prefix, self.spec_at),
        )

    def combine(self, *others: "Mapping") -> "Mapping":
        """One mapping made of this one and ``others``, each keeping its own layer count."""
        return Mapping(rules=(), sections=(self, *others))

    def parts(self) -> list["Mapping"]:
        """The flat list of (rules, layers, drops) sections, this one first."""
        out: list[Mapping] = []
        if self.rules or self.drop_hf or self.drop_nemo:
            out.append(Mapping(self.rules, self.layers, self.drop_hf, self.drop_nemo, experts=self.experts,
                               spec_at=self.spec_at))
        for s in self.sections:
            out.extend(s.parts())
        return out

    def hf_names(self) -> list[str]:
        """Every HF name template the rules read, in rule order, sections included."""
        return [n for part in self.parts() for rule in part.rules for n in rule.hf_names()]

    def respelled_hf(self, fn: Callable[[str], str]) -> "Mapping":
        """This mapping with every HF name (rules and drops, sections included) passed
        through ``fn``: for a checkpoint that spells the same model's names another way."""
        return Mapping(rules=tuple(r.renamed(hf=fn) for r in self.rules), layers=self.layers,
                       drop_hf=tuple(fn(d) for d in self.drop_hf), drop_nemo=self.drop_nemo,
                       sections=tuple(s.respelled_hf(fn) for s in self.sections), experts=self.experts,
                       spec_at=self.spec_at)

    def axes(self, cfg: dict[str, Any], specs: Specs | None = None) -> Axes:
        """What this section's ``{i}`` and ``{e}`` range over for the NeMo config ``cfg``
        (a ``{i:@field}`` selector reads the spec from ``specs``; None: a cache of its own)."""
        source, at = specs if specs is not None else Specs(cfg), self.spec_at
        return Axes.of(cfg, self.layers, self.experts, lambda: source.at(at))

    def context(self, cfg: dict[str, Any], specs: Specs | None = None, pool: BufferPool | None = None) -> PlanContext:
        """What this section's rules plan against for the NeMo config ``cfg``: its axes, and
        the plan's one :class:`Specs` (None: a cache of its own)."""
        specs = specs if specs is not None else Specs(cfg)
        return PlanContext(cfg, self.axes(cfg, specs), pool, self.spec_at, specs)
