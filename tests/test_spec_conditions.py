"""Rule conditions and declared shapes read the typed model spec (:class:`SpecField`).

A field path is checked against :class:`ModelSpec`'s dataclass fields when the rule is
built (a typo fails there, never reads as False); the planner builds the spec once per
plan, only when a rule reads it, and of the config section a nested mapping names; the
deprecated config-path strings still plan the same.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import torch

import nemo_convert.mapping.rules.base as rules_base
from nemo_convert.errors import ConfigError, ShapeError
from nemo_convert.families.fields import EXPERTS, HIDDEN, SHARED_GATE, TIED
from nemo_convert.mapping import Mapping, Rename, SpecField, Tied
from nemo_convert.mapping.planner import plan_conversion
from nemo_convert.mapping.rules import condition_holds
from nemo_convert.spec import spec_of
from nemo_convert.tensors.base import TensorInfo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Tensors:
    """An in-memory tensor source (names → shapes, float32)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes

    def keys(self) -> list[str]:
        return list(self.shapes)

    def info(self, key: str) -> TensorInfo:
        return TensorInfo(key, self.shapes[key], torch.float32)

    def load(self, key: str) -> torch.Tensor:
        return torch.zeros(self.shapes[key])

    def group(self, key: str) -> str:
        return ""

    def close(self) -> None:
        pass


def gpt_cfg(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "ffn_hidden_size": 16,
                           "share_embeddings_and_output_weights": False}
    cfg.update(over)
    return cfg


def head_mapping(tied: Any, untied: Any) -> Mapping:
    """The output layer: its own tensor unless tied (then the HF copy must equal the embedding)."""
    return Mapping((Rename("embed.weight", "embedding.word_embeddings.weight"),
                    Rename("lm_head.weight", "output_layer.weight", when=untied, shape=(None, HIDDEN)),
                    Tied("lm_head.weight", "embed.weight", when=tied)))


HEAD = {"embed.weight": (10, 8), "lm_head.weight": (10, 8)}


# -- the field path, checked when the rule is built ----------------------------------------
def test_a_field_path_that_is_not_in_the_spec_fails_when_the_rule_is_built() -> None:
    with pytest.raises(ConfigError, match=r"'embedding\.tide'.*Embedding has no field 'tide' \(it has tied, scaled\)"):
        Rename("a", "b", when=SpecField("embedding.tide"))
    with pytest.raises(ConfigError, match="ModelSpec has no field 'share_embeddings_and_output_weights'"):
        SpecField("share_embeddings_and_output_weights")
    with pytest.raises(ConfigError, match=r"moe\.experts is not a record"):
        SpecField("moe.experts.count")
    # through an optional record (MoE | None, MLA | None) the path is checked too
    with pytest.raises(ConfigError, match="MLA has no field 'q_rank'"):
        SpecField("attention.mla.q_rank")
    assert SpecField("attention.mla.q_lora_rank").path == "attention.mla.q_lora_rank"


def test_a_field_reads_the_spec_and_negation_flips_it() -> None:
    tied, untied = spec_of(gpt_cfg(share_embeddings_and_output_weights=True)), spec_of(gpt_cfg())
    assert TIED.holds(tied) and not TIED.holds(untied)
    assert (~TIED).holds(untied) and not (~TIED).holds(tied) and ~~TIED == TIED
    assert str(~TIED) == "!embedding.tied" and HIDDEN.value(tied) == 8
    # an absent optional record: no value, a condition on it is False, its negation True
    assert EXPERTS.value(untied) is None and not SHARED_GATE.holds(untied) and (~SHARED_GATE).holds(untied)
    moe = spec_of(gpt_cfg(num_moe_experts=4, moe_shared_expert_intermediate_size=8, moe_shared_expert_gate=True))
    assert EXPERTS.value(moe) == 4 and SHARED_GATE.holds(moe)
    with pytest.raises(ConfigError, match="a negated field is a condition, not a value"):
        (~HIDDEN).value(tied)


def test_the_condition_helper_takes_both_forms() -> None:
    cfg = gpt_cfg(share_embeddings_and_output_weights=True)
    assert condition_holds(cfg, TIED) and not condition_holds(cfg, ~TIED)
    assert condition_holds(cfg, "share_embeddings_and_output_weights")
    assert not condition_holds(cfg, "!share_embeddings_and_output_weights") and condition_holds(cfg, None)


# -- the planner --------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["spec", "string"])
@pytest.mark.parametrize("tied", [False, True])
def test_the_planner_chooses_rules_by_the_spec_as_by_the_deprecated_strings(form: str, tied: bool) -> None:
    conds = (TIED, ~TIED) if form == "spec" else ("share_embeddings_and_output_weights",
                                                  "!share_embeddings_and_output_weights")
    plan = plan_conversion(head_mapping(*conds), gpt_cfg(share_embeddings_and_output_weights=tied), Tensors(HEAD),
                           "to_nemo")
    outputs = sorted(o for t in plan.tasks for o in t.outputs)
    checks = [t for t in plan.tasks if t.check_equal]
    # the negative control: the other config flips which rule plans
    if tied:
        assert outputs == ["embedding.word_embeddings.weight"] and len(checks) == 1
    else:
        assert outputs == ["embedding.word_embeddings.weight", "output_layer.weight"] and not checks


def test_a_declared_shape_reads_the_spec() -> None:
    mapping = head_mapping(TIED, ~TIED)
    plan_conversion(mapping, gpt_cfg(), Tensors(HEAD), "to_nemo")
    with pytest.raises(ShapeError, match=re.escape("output_layer.weight has shape [10, 8], but the config implies "
                                                   "[None, geometry.hidden=6]")):
        plan_conversion(mapping, gpt_cfg(hidden_size=6), Tensors(HEAD), "to_nemo")


def test_the_spec_is_built_once_per_plan_and_only_when_a_rule_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = rules_base.spec_of
    monkeypatch.setattr(rules_base, "spec_of", lambda cfg: calls.append(1) or real(cfg))
    two_sections = head_mapping(TIED, ~TIED).combine(Mapping((Rename("x.{i}", "y.{i}", shape=(HIDDEN,)),)))
    plan_conversion(two_sections, gpt_cfg(), Tensors({**HEAD, "x.0": (8,), "x.1": (8,)}), "to_nemo")
    assert len(calls) == 1
    calls.clear()
    # string conditions and shapes only: no spec, so a config that is no decoder's plans
    strings = Mapping((Rename("a", "b", when="flag", shape=("width",)),), layers="depth")
    plan = plan_conversion(strings, {"flag": True, "width": 3}, Tensors({"a": (3,)}), "to_nemo")
    assert [t.outputs for t in plan.tasks] == [("b",)] and calls == []


def test_a_mapping_nested_under_a_config_prefix_reads_that_sections_spec() -> None:
    inner = head_mapping(TIED, ~TIED)
    nested = inner.nested(hf_prefix="lm.", nemo_prefix="lm.", cfg_prefix="text.")
    assert nested.spec_at == "text." and nested.parts()[0].spec_at == "text."
    assert nested.nested(cfg_prefix="outer.").spec_at == "outer.text."
    cfg = {"text": gpt_cfg(share_embeddings_and_output_weights=True), "share_embeddings_and_output_weights": False}
    source = Tensors({"lm." + k: v for k, v in HEAD.items()})
    plan = plan_conversion(nested, cfg, source, "to_nemo")
    assert sorted(o for t in plan.tasks for o in t.outputs) == ["lm.embedding.word_embeddings.weight"]
    # the spec field is kept as is under the prefix; a config-path string is prefixed
    assert nested.rules[1].when == ~TIED
    assert Rename("a", "b", when="flag").prefixed("", "", "text.").when == "text.flag"


def test_no_built_in_rule_declares_a_config_string_condition() -> None:
    """Every built-in ``when=`` is a spec field (a config-path string is for third-party
    plugins written against the older form)."""
    found = []
    for root in ("nemo_convert", "plugins"):
        for folder, _, files in os.walk(os.path.join(REPO, root)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        found += [f"{os.path.relpath(path, REPO)}: {line.strip()}" for line in f
                                  if re.search(r"(?<!`)\bwhen=[\"']", line)]
    assert found == []


# -- layer selectors in name templates ---------------------------------------------------
def test_a_per_layer_spec_field_selects_the_layers_of_a_template() -> None:
    from nemo_convert.families.fields import LAYER_KINDS, MOE_LAYER_PATTERN
    from nemo_convert.mapping.rules import Axes

    assert MOE_LAYER_PATTERN.layers() == "{i:@moe.layer_pattern}"
    assert (~MOE_LAYER_PATTERN).layers() == "{i:!@moe.layer_pattern}"
    assert LAYER_KINDS.layers("ME") == "{i:@layer_kinds=ME}"
    with pytest.raises(ConfigError, match="name the symbols to keep"):
        (~LAYER_KINDS).layers("M")
    with pytest.raises(ConfigError, match="MoE has no field 'layer_patern'"):
        SpecField("moe.layer_patern").layers()

    def names(cfg: dict[str, Any], template: str) -> list[str]:
        spec = spec_of(cfg)
        return [n for _, n in Axes.of(cfg, "num_layers", "num_moe_experts", lambda: spec).expand(template)]

    mixed = gpt_cfg(num_layers=3, num_moe_experts=2, moe_layer_freq=[0, 1, 1])
    assert names(mixed, "l.{i:@moe.layer_pattern}.e{e}") == ["l.1.e0", "l.1.e1", "l.2.e0", "l.2.e1"]
    assert names(mixed, "l.{i:!@moe.layer_pattern}") == ["l.0"]
    # the spec's default where the config is silent (Megatron's moe_layer_freq 1: every layer)
    assert names(gpt_cfg(num_layers=3, num_moe_experts=2), "l.{i:!@moe.layer_pattern}") == []
    assert names(gpt_cfg(num_layers=3), "l.{i:@moe.layer_pattern}") == []  # a dense model has none
    assert names(gpt_cfg(num_layers=3), "l.{i:!@moe.layer_pattern}") == ["l.0", "l.1", "l.2"]
    hybrid = gpt_cfg(num_layers=6, hybrid_override_pattern="M-*ME-")
    assert spec_of(hybrid).layer_kinds == "M-*ME-" and spec_of(gpt_cfg()).layer_kinds is None
    assert names(hybrid, "l.{i:@layer_kinds=ME}") == ["l.0", "l.3", "l.4"]
    assert names(hybrid, "l.{i:@layer_kinds=-}") == ["l.1", "l.5"]
    # the deprecated config-path selector reads the same pattern
    assert names(hybrid, "l.{i:hybrid_override_pattern=ME}") == ["l.0", "l.3", "l.4"]
