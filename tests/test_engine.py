"""The engine: overlapped writing gives the same bytes; errors in the writer surface."""

from __future__ import annotations

import filecmp

import pytest

import nemo_convert.convert.nemo_write as nemo_write
import nemo_convert.engine as engine
from nemo_convert import api
from nemo_convert.examples import make_tiny_llama


@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_overlapped_writer_gives_identical_output(tmp_path, monkeypatch, layout):
    src = make_tiny_llama(str(tmp_path / "hf"), num_hidden_layers=3, tokenizer=False)
    api.import_hf(src, str(tmp_path / "a.nemo"), layout=layout)
    orig = engine.run_plan
    monkeypatch.setattr(nemo_write, "run_plan", lambda *a, **k: orig(*a, **{**k, "overlap": True}))
    monkeypatch.setattr(engine, "QUEUE_DEPTH", 1)
    api.import_hf(src, str(tmp_path / "b.nemo"), layout=layout)
    assert filecmp.cmp(tmp_path / "a.nemo", tmp_path / "b.nemo", shallow=False)


def test_writer_error_stops_the_run(tmp_path):
    from nemo_convert.formats.hf.hf import open_hf_weights
    from nemo_convert.mapping.planner import identity_plan

    src = open_hf_weights(make_tiny_llama(str(tmp_path / "hf"), tokenizer=False))
    plan = identity_plan(src, {})
    seen = []

    def sink(name, tensor):
        seen.append(name)
        if len(seen) == 3:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        engine.run_plan(plan, src, sink, overlap=True)
    assert len(seen) == 3
    src.close()
