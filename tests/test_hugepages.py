"""Large TP merges and fused buffers are allocated on transparent huge pages; values never change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nemo_convert.mapping import ops


# --------------------------------------------------------------------------- concat / huge pages
def test_concat_equals_torch_cat_for_large_and_small_tensors():
    from nemo_convert.tensors import hugepages

    for rows in (3, hugepages.MIN_BYTES // (64 * 2) + 5):  # below and above the huge-page size
        parts = [torch.randn(rows, 64).to(torch.bfloat16) for _ in range(3)]
        for dim in (0, 1, -1):
            got = ops.concat(parts, dim)
            assert torch.equal(got, torch.cat(parts, dim)) and got.dtype == torch.bfloat16
    with pytest.raises(RuntimeError):
        ops.concat([torch.zeros(2, 3), torch.zeros(2, 4)], 0)


def test_concat_of_mixed_dtypes_promotes_like_torch_cat():
    a, b = torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.float32)
    assert ops.concat([a, b], 0).dtype == torch.cat([a, b]).dtype == torch.float32


def test_huge_page_buffers_are_plain_tensors(monkeypatch):
    import mmap

    from nemo_convert.tensors import hugepages

    advised = []
    real = mmap.mmap

    class Recording(real):  # type: ignore[misc,valid-type]
        def madvise(self, advice, *args):  # type: ignore[no-untyped-def]
            advised.append(advice)
            return super().madvise(advice, *args)

    monkeypatch.setattr(mmap, "mmap", Recording)
    n = hugepages.MIN_BYTES // 4 + 123
    t = hugepages.empty((n,), torch.float32)
    assert t.shape == (n,) and t.dtype == torch.float32 and t.is_contiguous()
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * n
    if hugepages.ADVICE is not None:
        assert advised == [hugepages.ADVICE]
    advised.clear()
    small = hugepages.empty((10,), torch.float32)
    assert advised == [] and small.shape == (10,)  # small buffers come from torch's allocator


def _rss_anon_mib() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("RssAnon:"))
    return int(line.split()[1]) // 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_a_freed_buffer_is_returned_at_once():
    """Large buffers are private anonymous maps of their own: freeing the tensor unmaps them
    (no heap growth over many layers), and they count as private memory while alive."""
    from nemo_convert.tensors import hugepages

    before = _rss_anon_mib()
    for _ in range(8):
        t = hugepages.empty((48 << 20,), torch.uint8)
        t.fill_(7)
        assert _rss_anon_mib() - before >= 40
        del t
    assert _rss_anon_mib() - before < 16


@pytest.mark.slow  # a fresh interpreter
def test_the_advice_can_be_turned_off():
    code = "from nemo_convert.tensors import hugepages; print(hugepages.ADVICE is None)"
    env = {**os.environ, "NEMO_CONVERT_NO_HUGEPAGES": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
