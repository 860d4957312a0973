"""Mapping rules: what a family plugin declares, as data — and how each plans itself.

Names are templates (``{i}`` a layer, ``{e}`` an expert: :mod:`.base`). NeMo names here
are *logical*: per layer, without the ``model.`` prefix
(``decoder.layers.{i}.self_attention.linear_qkv.weight``); the format writers decide
stacking and prefixes. Conditions and declared shapes read the typed model spec
(``when=SpecField("embedding.tied")``, ``shape=(SpecField("geometry.hidden"),)``:
:class:`SpecField`); the remaining config references (``heads="num_attention_heads"``, and
the deprecated string conditions and shape dimensions) are dotted paths into the NeMo
config, so a rule set can be reused under a prefix (:meth:`Mapping.nested`) — e.g. LLaVA
reuses the Llama rules for its language model.

Each rule has an inverse; export is derived from import and never written twice. Each
rule type is a :class:`Rule` (:mod:`.protocol`) that expands itself into tasks; the
planner knows none by name. By kind: :mod:`.plain` (one tensor is one tensor),
:mod:`.fused` (QKV, gated fc1, experts), :mod:`.special` (``Custom``, ``Tied``, ``Shared``).
"""

from nemo_convert.mapping.rules.base import (Axes, Condition, Dim, Kind, Parallel, Sections, SpecField, Specs, cfg_get,
                                             condition_holds, layer_pattern, layer_symbols)
from nemo_convert.mapping.rules.fused import FuseGated, FuseQKV, PackedQKV, StackedExperts
from nemo_convert.mapping.rules.mapping import Mapping
from nemo_convert.mapping.rules.plain import Offset, Rename, Reshape, Transposed
from nemo_convert.mapping.rules.protocol import Direction, LazyFn, Origin, PlanContext, Rule, Task, TaskFn, same
from nemo_convert.mapping.rules.special import Custom, Shared, TensorFn, Tied

__all__ = ["Axes", "Condition", "Custom", "Dim", "Direction", "FuseGated", "FuseQKV", "Kind", "LazyFn", "Mapping", "Offset", "Origin",
           "PackedQKV", "Parallel", "PlanContext", "Rename", "Reshape", "Rule", "Sections", "Shared", "SpecField",
           "Specs", "StackedExperts", "Task", "TaskFn", "TensorFn", "Tied", "Transposed", "cfg_get", "condition_holds",
           "layer_pattern", "layer_symbols", "same"]
