"""YaRN RoPE loaded by Megatron-Core 0.16 with transformers' logits, beyond the original context.

A tiny DeepSeek-V3-shaped model (multi-latent attention: ``MLATransformerConfig``'s
``rope_type: yarn`` and YaRN fields) and a tiny GPT-OSS-shaped one (GPTModel's
``position_embedding_type: yarn`` and ``yarn_*`` fields), each with
``original_max_position_embeddings`` 16 and a 48-token input, are imported to a dist
``.nemo`` and run by Megatron-Core (``tests/test_family_megatron.py``'s worker, which builds
Megatron-Core's config from the ``.nemo``'s fields) at TP1 and TP2 against transformers'
logits. The negative controls edit one YaRN field of the ``.nemo`` and must fail: a wrong
factor, a dropped mscale / mscale_all_dim (DeepSeek's softmax factor and concentration), a
concentration factor of 1 instead of mscale(factor) (GPT-OSS), the correction range rounded
where the source says ``truncate: false``.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import pytest
import torch

# found, not imported, at collection: importing megatron.core costs seconds (tests/conftest.py, test time)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="needs megatron.core")

from test_family_megatron import TOLERANCE, _run  # noqa: E402

IDS = torch.randint(3, 128, (1, 48), generator=torch.Generator().manual_seed(7))  # > 16: beyond the original context
ORIGINAL = 16
#: transformers v5 spelling (what save_pretrained writes); the v4 spellings are the hub
#: configs' (tests/test_yarn.py)
YARN = {
    "deepseek_v3": dict(rope_scaling={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": ORIGINAL, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # head_dim 32 puts the correction range at [0, 1.26]: rounding it to [0, 2] changes one frequency
    "gpt_oss": dict(head_dim=32, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": ORIGINAL, "beta_fast": 32.0,
                                                  "beta_slow": 1.0, "truncate": False}),
}


def _deltas(proc: Any) -> list[float]:
    return [float(m) for m in re.findall(r"max\|dlogit\| = ([0-9.]+(?:e[-+]?[0-9]+)?)", proc.stdout)]


def _passes(proc: Any) -> None:
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("family", sorted(YARN))
def test_megatron_core_runs_yarn_with_hf_logits(tmp_path: Any, family: str, tp: int) -> None:
    proc = _run(tmp_path, family, tp=tp, ids=IDS, **YARN[family])
    _passes(proc)


@pytest.mark.slow
def test_mla_yarn_with_distinct_mscales(tmp_path: Any) -> None:
    """mscale ≠ mscale_all_dim (DeepSeek-V2's kind): cos/sin scale by their ratio and the
    softmax by mscale(factor, mscale_all_dim)², on both sides."""
    rope = {**YARN["deepseek_v3"]["rope_scaling"], "mscale": 0.9, "mscale_all_dim": 0.6}
    _passes(_run(tmp_path, "deepseek_v3", ids=IDS, rope_scaling=rope))


@pytest.mark.slow
@pytest.mark.parametrize("family, edit", [
    ("deepseek_v3", {"rotary_scaling_factor": 5.0}),
    ("deepseek_v3", {"mscale": 1.0, "mscale_all_dim": 0.0}),   # mscale dropped: no softmax factor
    ("gpt_oss", {"yarn_rotary_scaling_factor": 5.0}),
    ("gpt_oss", {"yarn_mscale": 1.0, "yarn_mscale_all_dim": 1.0}),  # concentration 1, not mscale(factor)
    ("gpt_oss", {"yarn_correction_range_round_to_int": True}),
], ids=["mla-factor", "mla-mscale", "gpt-factor", "gpt-mscale", "gpt-truncate"])
def test_the_check_sees_a_wrong_yarn_field(tmp_path: Any, family: str, edit: dict[str, Any]) -> None:
    proc = _run(tmp_path, family, edit, ids=IDS, **YARN[family])
    deltas = _deltas(proc)
    assert proc.returncode != 0 and deltas, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"{family} with {edit}: max|dlogit| = {max(deltas):.3g}")
    assert max(deltas) > 10 * TOLERANCE, deltas  # measured: 0.0059 (GPT-OSS factor 5 for 4) to 0.26
