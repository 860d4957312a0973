"""The conversions run with Python's cyclic garbage collector paused (``gc_paused``,
docs/performance.md "Third round"), and leave it as they found it."""

from __future__ import annotations

import gc

import pytest

from nemo_convert import api
from nemo_convert.convert import hf_to_nemo
from nemo_convert.convert.common import gc_paused
from nemo_convert.errors import NemoConvertError


@pytest.fixture
def gc_restored():  # type: ignore[no-untyped-def]
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_restored_after(gc_restored):  # type: ignore[no-untyped-def]
    seen = []

    @gc_paused
    def work(x: int) -> int:
        seen.append(gc.isenabled())
        return x + 1

    gc.enable()
    assert work(1) == 2
    assert seen == [False]
    assert gc.isenabled()


def test_restored_after_an_error_and_when_nested(gc_restored):  # type: ignore[no-untyped-def]
    seen = []

    @gc_paused
    def inner() -> None:
        seen.append(gc.isenabled())
        raise NemoConvertError("refused")

    @gc_paused
    def outer() -> None:
        with pytest.raises(NemoConvertError):
            inner()
        seen.append(gc.isenabled())  # the inner call must not re-enable it

    gc.enable()
    outer()
    assert seen == [False, False]
    assert gc.isenabled()


def test_a_collector_disabled_by_the_caller_stays_disabled(gc_restored):  # type: ignore[no-untyped-def]
    gc.disable()
    gc_paused(lambda: None)()
    assert not gc.isenabled()


@pytest.mark.slow  # builds a transformers model (~3 s)
def test_import_runs_paused(tiny_llama, tmp_path, monkeypatch, gc_restored):  # type: ignore[no-untyped-def]
    seen = []
    real = hf_to_nemo.open_hf

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(hf_to_nemo, "open_hf", spy)
    gc.enable()
    api.import_hf(tiny_llama(), tmp_path / "m.nemo")
    assert seen == [False]
    assert gc.isenabled()


@pytest.mark.parametrize("fn", [api.import_hf, api.export_hf, api.reshard, api.from_ckpt])
def test_every_conversion_is_wrapped(fn):  # type: ignore[no-untyped-def]
    assert fn.__code__ is gc_paused(len).__code__  # the wrapper's code, not the function's own
    assert callable(fn.__wrapped__)
