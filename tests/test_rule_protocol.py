"""A rule type defined outside the core plans, streams and round-trips with no core edit.

``Transpose`` below is what a third-party plugin would write: a :class:`Rule` subclass
with its two tasks (the deferred form is the eager one: a transpose is a view). A family
made of the Llama rules with ``o_proj`` transposed (square in the tiny model, so nothing
downstream notices) imports and exports bit-exactly through the public API, registered
in-process like any plugin.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import pytest
import torch
from tiny_models import hf_tensors

from nemo_convert import api, hookimpl
from nemo_convert.engine import run_plan
from nemo_convert.errors import ShapeError
from nemo_convert.examples import make_tiny_llama
from nemo_convert.formats.hf.hf import open_hf
from nemo_convert.mapping import Mapping, Parallel, PlanContext, Rename, Rule, Task
from nemo_convert.mapping.planner import nemo_parallel_kinds, plan_conversion
from nemo_convert.mapping.rules.protocol import Direction
from nemo_convert.plugins.manager import Registry, registry_with
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.tensors.base import TensorInfo
from nemo_convert.tensors.pieces import materialize

O_PROJ = "model.layers.{i}.self_attn.o_proj.weight"
LINEAR_PROJ = "decoder.layers.{i}.self_attention.linear_proj.weight"


def _t(ts: Sequence[Any]) -> tuple[Any]:
    return (ts[0].t(),)


@dataclass(frozen=True)
class Transpose(Rule):
    """A 2-d HF tensor is the transpose of its NeMo tensor (both directions)."""

    hf: str
    nemo: str
    parallel: Parallel = Parallel.REPLICATED
    when: str | None = None

    def tasks(self, ctx: PlanContext, direction: Direction) -> list[Task]:
        kind = self.parallel if direction == "to_nemo" else Parallel.REPLICATED
        return [Task((src,), (dst,), _t, (kind,), label="transpose", lazy_fn=_t)
                for src, dst in ctx.pairs(self.hf, self.nemo, direction)]

    def check(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], ctx: PlanContext,
              direction: Direction) -> None:
        for info in inputs:
            if len(info.shape) != 2:
                raise ShapeError(f"{info.name} has shape {list(info.shape)}, not a matrix to transpose")


def transposed(mapping: Mapping) -> Mapping:
    """``mapping`` with the ``o_proj`` rename replaced by a :class:`Transpose`."""
    rules = tuple(Transpose(r.hf, r.nemo, r.parallel, r.when) if isinstance(r, Rename) and r.hf == O_PROJ else r
                  for r in mapping.rules)
    return dataclasses.replace(mapping, rules=rules,
                               sections=tuple(transposed(s) for s in mapping.sections))


def _family() -> ModelFamily:
    from nemo_convert_llama.family import LLAMA

    return dataclasses.replace(LLAMA, name="transposed-llama", hf_architectures=(), hf_model_types=(),
                               mapping=lambda cfg: transposed(LLAMA.mapping(cfg)))


def _registry() -> Registry:
    class Plugin:
        @hookimpl
        def nemo_convert_model_families(self) -> list[ModelFamily]:
            return [_family()]

    return registry_with(("transposed", Plugin()))


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("rule") / "llama"), num_hidden_layers=2, tokenizer=False)


def test_the_toy_rule_plans_and_streams(src: str) -> None:
    fam = _family()
    hf = open_hf(src)
    try:
        cfg, _ = api.plan_import(fam, hf.config, hf.source)
        mapping = fam.mapping(cfg)
        assert any(isinstance(r, Transpose) for r in mapping.rules)
        plan = plan_conversion(mapping, cfg, hf.source, "to_nemo")
        labels = [t.label for t in plan.tasks]
        assert labels.count("transpose") == 2
        assert nemo_parallel_kinds(mapping, cfg)[LINEAR_PROJ.format(i=1)] == Parallel.ROW
        for lazy in (False, True):
            got: dict[str, torch.Tensor] = {}
            run_plan(plan, hf.source, lambda name, t: got.__setitem__(name, materialize(t).clone()), lazy=lazy)
            for i in range(2):
                assert torch.equal(got[LINEAR_PROJ.format(i=i)], hf.source.load(O_PROJ.format(i=i)).t())
    finally:
        hf.source.close()


def test_the_toy_rule_checks_and_nests(src: str) -> None:
    rule = Transpose("a.{i}.w", "b.{i}.w", when="flag")
    nested = rule.prefixed("lm.", "model.", "text.")
    assert (nested.hf, nested.nemo, nested.when) == ("lm.a.{i}.w", "model.b.{i}.w", "text.flag")
    assert rule.hf_names() == ["a.{i}.w"] and rule.renamed(hf=str.upper).hf == "A.{I}.W"
    hf = open_hf(src)
    try:
        cfg, _ = api.plan_import(fam := _family(), hf.config, hf.source)
        norm = "model.layers.{i}.input_layernorm.weight"
        bad = Mapping(tuple(Transpose(norm, "x.{i}") if isinstance(r, Rename) and r.hf == norm else r
                            for r in fam.mapping(cfg).rules))
        with pytest.raises(ShapeError, match="not a matrix"):
            plan_conversion(bad, cfg, hf.source, "to_nemo")
    finally:
        hf.source.close()


def test_the_toy_rule_round_trips_through_import_and_export(src: str, tmp_path: Any) -> None:
    reg = _registry()
    nemo, back = str(tmp_path / "t.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo, family="transposed-llama", registry=reg)
    api.export_hf(nemo, back, registry=reg)
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(b) <= set(a)
    for k in b:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    with open(os.path.join(src, "config.json")) as f1, open(os.path.join(back, "config.json")) as f2:
        assert json.load(f1) == json.load(f2)


def test_mapping_hf_names_and_respelling_cover_sections_and_keep_the_expert_axis() -> None:
    """``Mapping.hf_names`` / ``respelled_hf`` (once helpers of the LLaVA plugin) reach into
    every section and keep each section's layer and expert counts."""
    from nemo_convert.mapping import FuseGated

    inner = Mapping((Rename("a.{i}.w", "x.{i}.w"),), layers="inner_layers", experts="inner_experts",
                    drop_hf=("a.{i}.inv_freq",))
    outer = Mapping((FuseGated("g", "u", "y"),)).combine(inner)
    assert outer.hf_names() == ["g", "u", "a.{i}.w"]
    swapped = outer.respelled_hf(lambda n: "lm." + n)
    assert swapped.hf_names() == ["lm.g", "lm.u", "lm.a.{i}.w"]
    parts = swapped.parts()
    assert [(p.layers, p.experts) for p in parts] == [("num_layers", "num_moe_experts"),
                                                      ("inner_layers", "inner_experts")]
    assert parts[1].drop_hf == ("lm.a.{i}.inv_freq",)
    assert [r.nemo_names() for r in parts[1].rules] == [["x.{i}.w"]]  # the NeMo side is untouched
