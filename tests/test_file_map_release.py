"""Mapped inputs' pages are given back while streaming (``FileMap.release``,
``release_pages``): the resident set stops growing with every byte read, and tensors
still viewing a released map read the same bytes."""

from __future__ import annotations

import mmap

import pytest
import torch

from nemo_convert import engine
from nemo_convert.tensors import file_map
from nemo_convert.tensors.file_map import FileMap, release_pages

needs_madvise = pytest.mark.skipif(file_map._DONTNEED is None, reason="no mmap.madvise here")


def _resident_kib(fmap: FileMap) -> int:
    """Rss of the mapping that starts at the map's address, from /proc/self/smaps."""
    start = f"{fmap.address:x}-"
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(start):
            for rest in lines[i + 1:]:
                if rest.startswith("Rss:"):
                    return int(rest.split()[1])
    raise AssertionError("mapping not found")


@needs_madvise
def test_release_drops_resident_pages_and_keeps_the_bytes(tmp_path):
    data = torch.arange(256 * 1024, dtype=torch.int32)  # 1 MiB
    path = tmp_path / "data.bin"
    path.write_bytes(data.numpy().tobytes())
    fmap = FileMap(str(path))
    try:
        t = fmap.tensor(0, (data.numel(),), torch.int32)
        assert int(t.sum()) == int(data.sum())  # every page touched
        before = _resident_kib(fmap)
        assert before >= 1000  # the control: reading made the file's pages resident
        fmap.release()
        assert _resident_kib(fmap) < before // 4
        assert torch.equal(t, data)  # the view reads the same bytes again from the file
        assert release_pages() >= 1  # the live map is found and released again
    finally:
        fmap.close()


def test_the_engine_releases_pages_as_it_streams(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from nemo_convert.mapping.planner import identity_plan
    from nemo_convert.tensors.safetensors_source import SafetensorsFile

    save_file({f"w{i}": torch.full((4, 8), float(i)) for i in range(5)}, str(tmp_path / "m.safetensors"))
    src = SafetensorsFile(str(tmp_path / "m.safetensors"))
    plan = identity_plan(src, {})
    calls: list[int] = []
    monkeypatch.setattr(engine, "release_pages", lambda **kw: calls.append(kw["touched_only"]) or 0)
    monkeypatch.setattr(engine, "RELEASE_BYTES", 1)
    got = {}
    engine.run_plan(plan, src, lambda n, t: got.__setitem__(n, t.clone()))
    assert calls == [True] * (len(plan.tasks) + 1)  # every task crosses the (tiny) threshold; and the end
    assert len(got) == 5
    for k, t in got.items():
        assert torch.equal(t, src.load(k))
    calls.clear()
    monkeypatch.setattr(engine, "RELEASE_BYTES", 1 << 40)
    engine.run_plan(plan, src, lambda n, t: None)
    assert calls == [True]  # the negative control: below the threshold only the plan's end releases
    src.close()


@needs_madvise
def test_release_of_the_touched_range_only(tmp_path):
    """``touched_only`` advises the range handed out since the last release (nothing when
    none was): the pages read before stay released, the ones read since are dropped, and
    a map that was not read is left alone."""
    data = torch.arange(1024 * 1024, dtype=torch.int32)  # 4 MiB
    path = tmp_path / "data.bin"
    path.write_bytes(data.numpy().tobytes())
    fmap, other = FileMap(str(path)), FileMap(str(path))
    try:
        assert not fmap.release(touched_only=True)  # nothing handed out yet
        whole = fmap.tensor(0, (data.numel(),), torch.int32)
        assert int(whole.sum()) == int(data.sum())
        assert fmap.release()  # all of it
        assert not fmap.release(touched_only=True)  # the release forgot the range
        quarter = data.numel() // 4
        part = fmap.tensor(4 * quarter + 12, (quarter,), torch.int32)  # the second quarter, not page-aligned
        assert int(part.sum()) == int(data[quarter + 3:2 * quarter + 3].sum())
        touched = _resident_kib(fmap)
        assert touched >= 900  # the control: that quarter is resident
        assert release_pages(touched_only=True) == 1  # this map only: the other handed out nothing
        assert _resident_kib(fmap) < touched // 4
        assert torch.equal(part, data[quarter + 3:2 * quarter + 3])
    finally:
        fmap.close()
        other.close()


def test_dontneed_is_the_platform_constant():
    if hasattr(mmap.mmap, "madvise"):
        assert file_map._DONTNEED == mmap.MADV_DONTNEED
