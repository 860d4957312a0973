"""DeepSeek-V2 in Megatron-Core 0.16.1: the dist ``.nemo`` of a tiny random
``DeepseekV2ForCausalLM`` (the family matrix's row: MLA without the query LoRA, or with it,
group-limited softmax routing (top-3 of 8 experts from 2 of 4 groups) with ``routed_scaling_factor`` 1.5 and no renormalisation, two
shared experts, a dense first layer, YaRN with ``mscale = mscale_all_dim = 0.707`` and an
original context of 8 positions, shorter than the 12 test ids) is loaded into Megatron-Core's
own ``GPTModel`` with the MLA / MoE local spec, on the CPU under gloo, by
``tests/test_family_megatron.py``'s harness (its shims, documented there: MLA's core-attention
head sizes, Transformer Engine's key names for the MoE and MLA norms, fp32 routing), and its
logits are transformers'. No DeepSeek-V2-specific shim is needed: softmax-before-top-k,
group-limited top-k, the scaling factor, shared experts and MLA's YaRN are all Megatron-Core's
own code. The negative controls change one routing or RoPE field of the written config and
must part from transformers' logits.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="needs megatron.core")]

#: The query-LoRA variant (DeepSeek-V2 / V2.5 / Coder-V2 have one, V2-Lite not).
Q_LORA = {"q_lora_rank": 32}


def _ok(proc: Any) -> None:
    assert proc.returncode == 0 and "MCORE-PARITY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("MCORE")], sep="\n")


def _parts(proc: Any) -> float:
    assert proc.returncode != 0 and "MCORE deepseek_v2" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    return max(float(d) for d in re.findall(r"max\|dlogit\| = ([0-9.]+(?:e[-+]?[0-9]+)?)", proc.stdout))


@pytest.mark.parametrize("tp, ep, overrides", [(1, 1, {}), (1, 1, Q_LORA), (2, 1, {}), (2, 1, Q_LORA), (1, 2, {}),
                                               (1, 2, Q_LORA)],
                         ids=["tp1", "tp1-q_lora", "tp2", "tp2-q_lora", "ep2", "ep2-q_lora"])
def test_megatron_core_gives_hf_logits(tmp_path: Any, tp: int, ep: int, overrides: dict[str, Any]) -> None:
    from test_family_megatron import _run

    _ok(_run(tmp_path, "deepseek_v2", tp=tp, ep=ep, **overrides))


@pytest.mark.parametrize("edit, what", [
    ({"moe_router_pre_softmax": False}, "top-k renormalised (softmax over the k logits)"),
    ({"mscale_all_dim": 0.0}, "YaRN's mscale dropped from the softmax scale"),
    ({"moe_router_num_groups": None, "moe_router_group_topk": None}, "greedy instead of group-limited top-k"),
    ({"moe_router_topk_scaling_factor": 1.0}, "routed_scaling_factor dropped"),
])
def test_the_check_sees_a_wrong_routing_or_rope_field(tmp_path: Any, edit: dict[str, Any], what: str) -> None:
    from test_family_megatron import _run

    delta = _parts(_run(tmp_path, "deepseek_v2", edit, **Q_LORA))
    print(f"deepseek_v2, {what}: max|dlogit| = {delta:.3g}")
    assert delta > 1e-3, delta


@pytest.mark.parametrize("experts, groups, keep, topk, same", [
    (8, 4, 2, 2, True),      # the family matrix's row: accepted
    (16, 8, 4, 4, True),     # 4 // 4 = 1: accepted
    (160, 8, 3, 6, False),   # DeepSeek-V2 / V2.5 (6 of 160 from 3 of 8 groups): refused
    (16, 4, 2, 4, False),    # 4 // 2 = 2: refused
])
def test_group_limited_routing_agrees_exactly_where_accepted(experts: int, groups: int, keep: int, topk: int,
                                                             same: bool) -> None:
    """transformers 5.24's ``DeepseekV2TopkRouter`` (``group_limited_greedy``) and
    Megatron-Core 0.16.1's ``topk_routing_with_score_function`` (softmax before top-k, the
    groups, the scaling factor) on the same router logits: the same experts and weights
    exactly when ``topk // topk_group`` is 1 — where the family accepts the config — and other
    experts for DeepSeek-V2 / V2.5's routing, which it refuses."""
    import torch
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from nemo_convert_deepseek_v2.family import _routing_to_nemo
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import (
        DeepseekV2TopkRouter,
    )

    from nemo_convert.errors import UnsupportedError

    cfg = DeepseekV2Config(hidden_size=32, num_attention_heads=4, n_routed_experts=experts, num_experts_per_tok=topk,
                           topk_method="group_limited_greedy", n_group=groups, topk_group=keep,
                           routed_scaling_factor=1.5)
    router = DeepseekV2TopkRouter(cfg)
    g = torch.Generator().manual_seed(experts + topk)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=g))
    x = torch.randn(256, 32, generator=g)
    with torch.no_grad():
        logits, hf_w, hf_i = router(x)
        probs, routing_map = topk_routing_with_score_function(logits, topk, use_pre_softmax=True, num_groups=groups,
                                                              group_topk=keep, scaling_factor=1.5)
    hf = torch.zeros_like(probs).scatter(1, hf_i, hf_w)
    assert torch.equal(hf.ne(0), routing_map) == same
    if same:
        assert torch.equal(hf, probs)
    hf_config = {"num_hidden_layers": 2, "n_routed_experts": experts, "num_experts_per_tok": topk,
                 "topk_method": "group_limited_greedy", "n_group": groups, "topk_group": keep}
    if same:
        assert _routing_to_nemo(hf_config) == {"moe_router_num_groups": groups, "moe_router_group_topk": keep}
    else:
        with pytest.raises(UnsupportedError, match="transformers scores a group by its largest expert score"):
            _routing_to_nemo(hf_config)
