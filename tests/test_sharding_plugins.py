"""Sharding strategies come from the plugin registry, for readers and writers alike: a
third party's replaces ours, and one that does not satisfy its axis's protocol is refused
when the registry is built."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from typing import Any, Sequence

import pytest

import nemo_convert.sharding.builtin as builtin
from nemo_convert import ShardingStrategy, api, hookimpl
from nemo_convert.errors import PluginError
from nemo_convert.examples import make_tiny_llama
from nemo_convert.plugins.manager import DISABLE_ENV, Registry, registry_with
from nemo_convert.sharding.protocol import PipelineSharding, TensorSharding, protocol_problem


def builtins() -> dict[str, Any]:
    """The built-in implementations, by axis, as the built-in plugin registers them."""
    return {s.axis: s.implementation for s in builtin.nemo_convert_sharding_strategies()}


class CountingTP:
    """Wraps a tensor-parallel strategy and counts the calls. Not a subclass of the
    built-in: it satisfies :class:`TensorSharding` structurally, and has no deferred forms,
    so every split and merge goes through it."""

    def __init__(self, inner: TensorSharding) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def split(self, t: Any, kind: Any, tp: int, rank: int, *, name: str = "tensor",
              padded_vocab: int | None = None) -> Any:
        self.calls["split"] += 1
        return self.inner.split(t, kind, tp, rank, name=name, padded_vocab=padded_vocab)

    def merge(self, parts: Sequence[Any], kind: Any, *, name: str = "tensor", vocab: int | None = None) -> Any:
        self.calls["merge"] += 1
        return self.inner.merge(parts, kind, name=name, vocab=vocab)

    def local_shape(self, shape: tuple[int, ...], kind: Any, tp: int, *,
                    padded_vocab: int | None = None) -> tuple[int, ...]:
        self.calls["local_shape"] += 1
        return self.inner.local_shape(shape, kind, tp, padded_vocab=padded_vocab)


class CountingPP:
    def __init__(self, inner: PipelineSharding) -> None:
        self.inner = inner
        self.calls = 0

    def stage_layers(self, num_layers: int, pp: int, sizes: Sequence[int] | None = None) -> list[range]:
        self.calls += 1
        return self.inner.stage_layers(num_layers, pp, sizes)


class Counting:
    """An in-process plugin registering the counting wrappers of TP and PP, and the
    built-in expert-parallel strategy (the built-in ``sharding`` plugin is blocked)."""

    def __init__(self) -> None:
        impl = builtins()
        self.tp, self.pp, self.ep = CountingTP(impl["tp"]), CountingPP(impl["pp"]), impl["ep"]

    @hookimpl
    def nemo_convert_sharding_strategies(self) -> list[ShardingStrategy]:
        return [ShardingStrategy("counting-tp", "tp", self.tp), ShardingStrategy("counting-pp", "pp", self.pp),
                ShardingStrategy("plain-ep", "ep", self.ep)]


def counting_registry(monkeypatch: pytest.MonkeyPatch) -> tuple[Registry, Counting]:
    """The installed plugins with the built-in ``sharding`` blocked (the disable list) and
    :class:`Counting` registered in its place."""
    monkeypatch.setenv(DISABLE_ENV, "sharding")
    mine = Counting()
    reg = registry_with(("counting", mine))
    assert {p.plugin for p in reg.sharding_strategies.values()} == {"counting"}
    return reg, mine


def tree_hashes(path: str) -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.mark.slow  # two imports, two exports, a verify (~10 s)
def test_the_registered_strategies_are_used_by_writers_and_readers(tmp_path, monkeypatch):
    src = make_tiny_llama(str(tmp_path / "hf"), num_hidden_layers=2, tokenizer=False)
    ref_nemo, ref_back = str(tmp_path / "ref.nemo"), str(tmp_path / "ref-back")
    api.import_hf(src, ref_nemo, layout="legacy", parallel=api.Parallelism(2, 2), packed=False)  # built-ins
    api.export_hf(ref_nemo, ref_back)
    reg, mine = counting_registry(monkeypatch)

    # writer: a legacy TP2×PP2 import splits every tensor with the registered strategy
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, layout="legacy", parallel=api.Parallelism(2, 2), packed=False, registry=reg)
    assert mine.tp.calls["split"] > 0 and mine.tp.calls["local_shape"] > 0 and mine.pp.calls > 0
    assert mine.tp.calls["merge"] == 0
    assert tree_hashes(nemo) == tree_hashes(ref_nemo)  # the same bytes as the built-ins write

    # reader: export of the per-rank .nemo merges the rank slices with it
    mine.tp.calls.clear()
    mine.pp.calls = 0
    back = str(tmp_path / "back")
    api.export_hf(nemo, back, registry=reg)
    assert mine.tp.calls["merge"] > 0 and mine.pp.calls > 0 and mine.tp.calls["split"] == 0
    assert tree_hashes(back) == tree_hashes(ref_back)

    # verify and open_checkpoint read per-rank layouts through it too
    mine.tp.calls.clear()
    assert api.verify(src, nemo, registry=reg).ok
    assert mine.tp.calls["merge"] > 0
    mine.tp.calls.clear()
    with api.open_checkpoint(nemo, registry=reg) as ck:
        ck.source.load("decoder.layers.0.self_attention.linear_qkv.weight")
    assert mine.tp.calls["merge"] > 0


def test_two_strategies_for_one_axis_is_an_error():
    reg = registry_with(("mine", Counting()), ("sharding", builtin), entry_points=False)
    with pytest.raises(PluginError, match="both handle axis 'tp'"):
        reg.sharding("tp")


class _NoMerge:
    def split(self, t: Any, kind: Any, tp: int, rank: int, *, name: str = "tensor",
              padded_vocab: int | None = None) -> Any:
        return t

    def local_shape(self, shape: tuple[int, ...], kind: Any, tp: int, *,
                    padded_vocab: int | None = None) -> tuple[int, ...]:
        return shape


class _NarrowSplit(_NoMerge):
    def split(self, t: Any, kind: Any, tp: int, rank: int) -> Any:  # type: ignore[override]
        return t

    def merge(self, parts: Sequence[Any], kind: Any, *, name: str = "tensor", vocab: int | None = None) -> Any:
        return parts[0]


def _plugin(*records: ShardingStrategy) -> object:
    class Plugin:
        @hookimpl
        def nemo_convert_sharding_strategies(self) -> list[ShardingStrategy]:
            return list(records)
    return Plugin()


@pytest.mark.parametrize("record, why", [
    (ShardingStrategy("no-merge", "tp", _NoMerge()), r"_NoMerge has no merge\(parts, kind, \*, name, vocab\)"),
    (ShardingStrategy("narrow", "tp", _NarrowSplit()),
     r"_NarrowSplit\.split cannot be called as split\(t, kind, tp, rank, \*, name, padded_vocab\)"),
    (ShardingStrategy("wrong-axis", "pp", builtins()["tp"]), r"TensorParallel has no stage_layers"),
    (ShardingStrategy("dp", "dp", builtins()["tp"]), r"axis 'dp' is not one of tp, pp, ep"),
])
def test_a_strategy_that_misses_its_protocol_is_refused_in_one_line(record, why):
    with pytest.raises(PluginError, match=why) as ei:
        registry_with(("bad", _plugin(record)), entry_points=False)
    msg = str(ei.value)
    assert "\n" not in msg and f"sharding strategy {record.name!r} of plugin 'bad'" in msg


def test_the_builtins_satisfy_their_protocols():
    for axis, impl in builtins().items():
        assert protocol_problem(axis, impl) is None
    assert isinstance(builtins()["tp"], TensorSharding) and isinstance(CountingTP(builtins()["tp"]), TensorSharding)
