"""Large TP merges and fused buffers are allocated on transparent huge pages; values never change."""

from __future__ import annotations

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
    from nemo_convert.tensors import hugepages

    advised = []
    monkeypatch.setattr(hugepages, "_MADVISE", lambda addr, n, advice: advised.append((addr, n, advice)) or 0)
    t = hugepages.empty((hugepages.MIN_BYTES // 4 + 123,), torch.float32)
    assert t.shape == (hugepages.MIN_BYTES // 4 + 123,) and t.dtype == torch.float32 and t.is_contiguous()
    (addr, n, advice), = advised
    huge = 2 << 20
    assert addr % huge == 0 and n % huge == 0 and advice == 14
    assert t.data_ptr() <= addr and addr + n <= t.data_ptr() + t.numel() * 4  # only whole pages inside
    advised.clear()
    hugepages.empty((10,), torch.float32)
    assert advised == []  # small buffers are not advised


def test_the_advice_can_be_turned_off():
    import os
    import subprocess
    import sys

    code = "from nemo_convert.tensors import hugepages; print(hugepages._MADVISE is None)"
    env = {**os.environ, "NEMO_CONVERT_NO_HUGEPAGES": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
