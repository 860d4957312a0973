"""Sharding strategies come from the plugin registry: a third party's replaces ours."""

from __future__ import annotations

import pytest

import nemo_convert.sharding.builtin as builtin
import nemo_convert_llama
from nemo_convert import ShardingStrategy, api, hookimpl
from nemo_convert.errors import PluginError
from nemo_convert.examples import make_tiny_llama
from nemo_convert.plugins.manager import registry_with
from nemo_convert.sharding.pipeline import PipelineParallel
from nemo_convert.sharding.tensor import TensorParallel


class CountingTP(TensorParallel):
    def __init__(self) -> None:
        self.splits = 0

    def split(self, *a, **k):  # type: ignore[no-untyped-def]
        self.splits += 1
        return super().split(*a, **k)


def plugin(tp: TensorParallel) -> object:
    class Mine:
        @hookimpl
        def nemo_convert_sharding_strategies(self):  # type: ignore[no-untyped-def]
            return [ShardingStrategy("counting-tp", "tp", tp), ShardingStrategy("my-pp", "pp", PipelineParallel())]
    return Mine()


def test_a_registered_strategy_is_the_one_used(tmp_path):
    tp = CountingTP()
    reg = registry_with(("mine", plugin(tp)), ("llama", nemo_convert_llama), entry_points=False)
    src = make_tiny_llama(str(tmp_path / "hf"), num_hidden_layers=2, tokenizer=False)
    api.import_hf(src, str(tmp_path / "m.nemo"), layout="legacy", parallel=api.Parallelism(2, 1), registry=reg)
    assert tp.splits > 0


def test_two_strategies_for_one_axis_is_an_error():
    reg = registry_with(("mine", plugin(CountingTP())), ("sharding", builtin), entry_points=False)
    with pytest.raises(PluginError, match="both handle axis 'tp'"):
        reg.sharding("tp")
