"""Quantization math: names, dtypes, layouts, error bounds, calibration, logit errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from nemo_convert.errors import ConfigError, ShapeError, UnsupportedError
from nemo_convert.quant import (
    ALGORITHMS,
    awq_search,
    builtin_calibration_texts,
    collect_activation_stats,
    dequantize_fp8,
    dequantize_int4_awq,
    dequantize_int4_wo,
    dequantize_int8_wo,
    dequantize_linear,
    fake_quantize_fp8,
    fp8_error_bound,
    fp8_kv_cache_scaling_factor,
    merge_stats,
    pack_int4,
    quantize_fp8,
    quantize_int4_awq,
    quantize_int4_wo,
    quantize_int8_wo,
    quantize_linear,
    tokenize_calibration,
    unpack_int4,
)
from nemo_convert.quant import trtllm_names as tn

FLOATS = [torch.bfloat16, torch.float16, torch.float32]


def _weight(out_f: int, in_f: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out_f, in_f, generator=g) * 0.05).to(dtype)


# ---------------------------------------------------------------- int8 (W8A16)
@pytest.mark.parametrize("dtype", FLOATS)
def test_int8_names_dtypes_shapes_and_bound(dtype: torch.dtype) -> None:
    w = _weight(96, 160, dtype)
    t = quantize_int8_wo(w)
    assert set(t) == {"weight", "per_channel_scale"}
    assert t["weight"].dtype == torch.int8 and t["weight"].shape == (160, 96)
    assert t["per_channel_scale"].dtype == dtype and t["per_channel_scale"].shape == (96,)
    scale = t["per_channel_scale"].float()
    ref = w.float().abs().amax(dim=1) / 127
    assert torch.allclose(scale, ref, rtol=2 ** -7)
    err = (w.float() - dequantize_int8_wo(t)).abs()
    assert bool((err <= scale[:, None] / 2 * (1 + 1e-5)).all())
    assert int(t["weight"].abs().max()) == 127


def test_int8_zero_rows_and_requantization_matches() -> None:
    w = _weight(64, 128, torch.bfloat16)
    w[3] = 0
    t = quantize_int8_wo(w)
    assert float(t["per_channel_scale"][3]) == 1.0 and int(t["weight"][:, 3].abs().max()) == 0
    # Writing the dequantized weight in bf16 and letting TensorRT-LLM re-quantize with
    # amax/127 recovers the same int8 values (up to a rare 1-LSB flip).
    again = quantize_int8_wo(dequantize_int8_wo(t).to(torch.bfloat16))
    diff = (again["weight"].int() - t["weight"].int()).abs()
    assert int(diff.max()) <= 1 and float((diff == 0).float().mean()) > 0.999


# ---------------------------------------------------------------- int4 packing
@pytest.mark.parametrize("src,dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16),
                                       (torch.float16, torch.float16), (torch.float32, torch.float32)])
def test_int8_fake_quantize_equals_the_round_trip_bit_for_bit(src: torch.dtype, dtype: torch.dtype) -> None:
    from nemo_convert.quant.int8 import fake_quantize_int8_wo

    g = torch.Generator().manual_seed(7)
    w = (torch.randn(96, 80, generator=g) * torch.logspace(-4, 1, 80)).to(src)
    w[3] = 0  # an all-zero row (scale 1)
    w[5, :8] = -1e-9  # tiny negatives that round to -0.0 before the int8 cast
    before = w.clone()
    got = fake_quantize_int8_wo(w, dtype=dtype)
    want = dequantize_int8_wo(quantize_int8_wo(w, dtype=dtype)).to(dtype)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == w.shape
    bits = torch.int16 if dtype.itemsize == 2 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))  # -0.0 and +0.0 differ here
    assert torch.equal(w, before)  # the source tensor is never written


def test_pack_int4_nibble_order_and_round_trip() -> None:
    q = torch.tensor([[-8], [7], [1], [-1]], dtype=torch.int8)
    p = pack_int4(q, dim=0)
    assert p.dtype == torch.int8 and p.shape == (2, 1)
    assert int(p.view(torch.uint8)[0, 0]) == 0x78        # low nibble = row 0 (-8 → 0x8)
    assert int(p.view(torch.uint8)[1, 0]) == 0xF1        # high nibble = row 3 (-1 → 0xF)
    every = torch.arange(-8, 8, dtype=torch.int8)
    grid = torch.cartesian_prod(every, every).t().contiguous()   # [2, 256]: all pairs
    assert torch.equal(unpack_int4(pack_int4(grid, 0), 0), grid)
    g = torch.Generator().manual_seed(1)
    r = torch.randint(-8, 8, (10, 6, 4), generator=g, dtype=torch.int8)
    for dim in range(3):
        if r.shape[dim] % 2 == 0:
            assert torch.equal(unpack_int4(pack_int4(r, dim), dim), r)
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([[8], [0]], dtype=torch.int8))
    with pytest.raises(ShapeError):
        pack_int4(torch.zeros(3, 2, dtype=torch.int8))


# ---------------------------------------------------------------- int4 weight-only
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("group", [64, 128])
def test_int4_names_shapes_and_bound(dtype: torch.dtype, group: int) -> None:
    w = _weight(48, 256, dtype)
    t = quantize_int4_wo(w, group_size=group)
    assert set(t) == {"weight", "weights_scaling_factor"}
    assert t["weight"].dtype == torch.int8 and t["weight"].shape == (24, 256)
    s = t["weights_scaling_factor"]
    assert s.dtype == dtype and s.shape == (48, 256 // group)
    q = unpack_int4(t["weight"])
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    err = (w.float() - dequantize_int4_wo(t)).abs()
    bound = s.float().repeat_interleave(group, dim=1) / 2
    assert bool((err <= bound * (1 + 1e-5)).all())
    amax = w.float().abs().reshape(48, -1, group).amax(dim=2)
    assert torch.allclose(s.float(), amax / 7, rtol=2 ** -7)


def test_int4_rejects_partial_groups_and_odd_out() -> None:
    with pytest.raises(UnsupportedError, match="multiple of the group size"):
        quantize_int4_wo(_weight(32, 200, torch.float16), group_size=128)
    with pytest.raises(UnsupportedError, match="even out_features"):
        quantize_int4_wo(_weight(33, 128, torch.float16))
    with pytest.raises(ShapeError):
        quantize_int4_wo(torch.zeros(4, 4, 4))


# ---------------------------------------------------------------- fp8
@pytest.mark.parametrize("dtype", FLOATS)
def test_fp8_names_scales_and_bound(dtype: torch.dtype) -> None:
    w = _weight(64, 96, dtype)
    t = quantize_fp8(w, torch.tensor(5.5))
    assert set(t) == {"weight", "weights_scaling_factor", "activation_scaling_factor"}
    assert t["weight"].dtype == torch.float8_e4m3fn and t["weight"].shape == (64, 96)
    for k in ("weights_scaling_factor", "activation_scaling_factor"):
        assert t[k].dtype == torch.float32 and t[k].shape == (1,)
    assert torch.equal(t["weights_scaling_factor"], (w.float().abs().amax() / 448).reshape(1))
    assert torch.equal(t["activation_scaling_factor"], torch.tensor([5.5 / 448]))
    deq = dequantize_fp8(t)
    err = (w.float() - deq).abs()
    assert bool((err <= fp8_error_bound(w, t["weights_scaling_factor"]) * (1 + 1e-6)).all())
    assert float(t["weight"].float().abs().max()) == 448.0
    int8_bits = dict(t, weight=t["weight"].view(torch.int8))
    assert torch.equal(dequantize_fp8(int8_bits), deq)


def test_fp8_kv_cache_scale() -> None:
    s = fp8_kv_cache_scaling_factor(torch.tensor(8.0), 12.0)
    assert s.dtype == torch.float32 and s.shape == (1,)
    assert torch.equal(s, torch.tensor([12.0 / 448]))
    s2 = fp8_kv_cache_scaling_factor(10.0, 12.0, k_margin=math.sqrt(2))
    assert math.isclose(float(s2), 10 * math.sqrt(2) / 448, rel_tol=1e-6)
    assert float(fp8_kv_cache_scaling_factor(1.0, 2.0, floor=1.0)) == 1.0
    with pytest.raises(ConfigError):
        fp8_kv_cache_scaling_factor(float("nan"), 1.0)


# ---------------------------------------------------------------- AWQ
def _outlier_problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(64, 256, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(128, 256, generator=g)
    x[:, :6] *= 40.0                               # a few salient input channels
    return w, x


def test_awq_names_dtypes_and_bound() -> None:
    w, x = _outlier_problem()
    t = quantize_int4_awq(w, x.abs().mean(0), samples=x, group_size=128)
    assert set(t) == {"weight", "weights_scaling_factor", "prequant_scaling_factor"}
    assert t["weight"].dtype == torch.int8 and t["weight"].shape == (32, 256)
    assert t["weights_scaling_factor"].dtype == torch.bfloat16
    assert t["weights_scaling_factor"].shape == (64, 2)
    pre = t["prequant_scaling_factor"]
    assert pre.dtype == torch.bfloat16 and pre.shape == (256,) and bool((pre > 0).all())
    err = (w.float() - dequantize_int4_awq(t)).abs()
    bound = t["weights_scaling_factor"].float().repeat_interleave(128, 1) / 2 \
        * pre.float()[None, :]
    assert bool((err <= bound * (1 + 1e-5)).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_awq_beats_plain_int4_on_calibration_inputs(seed: int) -> None:
    w, x = _outlier_problem(seed)
    plain = dequantize_int4_wo(quantize_int4_wo(w, group_size=128))
    awq = dequantize_int4_awq(quantize_int4_awq(w, x.abs().mean(0), samples=x))
    ref = x @ w.float().t()
    e_plain = float((x @ plain.t() - ref).pow(2).mean())
    e_awq = float((x @ awq.t() - ref).pow(2).mean())
    assert e_awq <= e_plain
    assert e_awq < 0.7 * e_plain                   # the outliers make AWQ clearly better
    found = awq_search(w, x.abs().mean(0), samples=x)
    assert found.alpha > 0 and len(found.losses) == 20
    # Statistics-only proxy: still never worse than α = 0 on its own objective.
    proxy = awq_search(w, x.abs().mean(0))
    assert proxy.losses[[a for a, _ in proxy.losses].index(proxy.alpha)][1] \
        <= proxy.losses[0][1]


def test_awq_without_outliers_can_stay_plain() -> None:
    w = _weight(32, 128, torch.float16)
    flat = torch.ones(128)
    t = quantize_int4_awq(w, flat)
    assert torch.equal(t["prequant_scaling_factor"], torch.ones(128, dtype=torch.float16))
    assert torch.equal(dequantize_int4_awq(t), dequantize_int4_wo(quantize_int4_wo(w)))


# ---------------------------------------------------------------- registry + TP table
class _S:
    def __init__(self, x: torch.Tensor) -> None:
        self.input_amax = x.abs().amax()
        self.act_mean = x.abs().mean(0)
        self.samples = x


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("parallel", ["column", "row"])
def test_tp_split_table_commutes_with_dequantize(algo: str, parallel: str) -> None:
    w, x = _outlier_problem()
    t = quantize_linear(algo, w, _S(x), group_size=64)
    assert sorted(t) == sorted(tn.LINEAR_TENSORS[algo])
    full = dequantize_linear(algo, t)
    ranks = []
    for r in range(2):
        part = {}
        for suffix, v in t.items():
            d = tn.tp_split_dim(algo, suffix, parallel)     # type: ignore[arg-type]
            part[suffix] = v if d is None else v.chunk(2, dim=d)[r].contiguous()
        ranks.append(dequantize_linear(algo, part))
    assert torch.equal(torch.cat(ranks, dim=0 if parallel == "column" else 1), full)


def test_registry_errors() -> None:
    w = _weight(8, 64, torch.float16)
    with pytest.raises(UnsupportedError):
        quantize_linear("int3", w)
    with pytest.raises(ConfigError):
        quantize_linear("fp8", w)
    with pytest.raises(ConfigError):
        quantize_linear("int4_awq", w)
    with pytest.raises(UnsupportedError):
        quantize_int8_wo(torch.zeros(4, 4, dtype=torch.int32))


def test_trtllm_quantization_section() -> None:
    assert tn.quantization_section("int4_awq") == {
        "quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128,
        "has_zero_point": False, "pre_quant_scale": True,
        "exclude_modules": ["lm_head", "transformer.vocab_embedding"]}
    assert tn.quantization_section("int4_wo", group_size=64)["pre_quant_scale"] is False
    fp8 = tn.quantization_section("fp8", kv_cache_fp8=True)
    assert fp8["quant_algo"] == "FP8" and fp8["kv_cache_quant_algo"] == "FP8"
    assert "group_size" not in fp8
    assert tn.quantization_section("int8_wo")["quant_algo"] == "W8A16"
    assert tn.quantization_section(None, kv_cache_fp8=True)["quant_algo"] is None


# ---------------------------------------------------------------- calibration
class _ByteTokenizer:
    """UTF-8 bytes as token ids (vocab 256); id 1 is BOS, 2 is EOS."""

    bos_token_id = 1
    eos_token_id = 2

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}


def test_builtin_texts_and_tokenize() -> None:
    texts = builtin_calibration_texts()
    assert len(texts) >= 200 and all(isinstance(t, str) and t for t in texts)
    ids = tokenize_calibration(_ByteTokenizer(), texts, max_len=32, n=5)
    assert ids.dtype == torch.int64 and ids.shape == (5, 32)
    assert bool((ids[:, 0] == 1).all())
    assert bytes(ids[0, 1:].tolist()).decode() == texts[0][:31]
    short = tokenize_calibration(_ByteTokenizer(), ["hi"], max_len=16, n=3)
    assert short.shape == (3, 16)
    with pytest.raises(ConfigError):
        tokenize_calibration(_ByteTokenizer(), [""], 8, 1)


def _tiny_llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=128, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():                         # realistic-ish: a few outlier channels
        for layer in model.model.layers:
            layer.input_layernorm.weight[:3] = 8.0
            layer.post_attention_layernorm.weight[5:7] = 6.0
    return model


def _calib_ids(n: int = 8, max_len: int = 48) -> torch.Tensor:
    return tokenize_calibration(_ByteTokenizer(), builtin_calibration_texts(), max_len, n)


def test_collect_activation_stats() -> None:
    model = _tiny_llama()
    ids = _calib_ids()
    stats = collect_activation_stats(model, ids.split(4), max_samples=16)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(stats) == sorted(linears)
    q = stats["model.layers.0.self_attn.q_proj"]
    k = stats["model.layers.0.self_attn.k_proj"]
    assert q.act_mean.shape == (64,) and q.samples.shape == (16, 64)
    assert q.n_tokens == ids.numel() and q.output_amax is None
    assert torch.equal(q.act_mean, k.act_mean) and torch.equal(q.input_amax, k.input_amax)
    assert k.output_amax is not None and float(k.output_amax) > 0
    assert stats["model.layers.1.mlp.down_proj"].act_mean.shape == (128,)
    merged = merge_stats([q, k])
    assert torch.allclose(merged.act_mean, q.act_mean) and merged.n_tokens == 2 * q.n_tokens
    # Right padding under an attention mask does not change the statistics.
    only = collect_activation_stats(model, [ids[:2, :40]], layers=["*.q_proj"])
    padded = torch.cat([ids[:2, :40], torch.zeros(2, 8, dtype=torch.int64)], dim=1)
    mask = torch.cat([torch.ones(2, 40), torch.zeros(2, 8)], dim=1).long()
    masked = collect_activation_stats(model, [{"input_ids": padded, "attention_mask": mask}],
                                      layers=["*.q_proj"])
    assert sorted(masked) == ["model.layers.0.self_attn.q_proj",
                              "model.layers.1.self_attn.q_proj"]
    for name, st in masked.items():
        assert st.n_tokens == 80
        assert torch.allclose(st.act_mean, only[name].act_mean, atol=1e-5)
    with pytest.raises(ConfigError):
        collect_activation_stats(model, [ids], layers=["nothing*"])


# ---------------------------------------------------------------- end to end: logits
_QKV = ("q_proj", "k_proj", "v_proj")


def _fake_quantize_llama(model: torch.nn.Module, algo: str, stats: dict,
                         group_size: int, act_fp8: bool = False) -> torch.nn.Module:
    """Copy of ``model`` whose linears (not lm_head) use dequantized weights.

    q/k/v are quantized fused, as TensorRT-LLM's ``attention.qkv`` is.
    """
    qm = copy.deepcopy(model)
    for i, layer in enumerate(qm.model.layers):
        p = f"model.layers.{i}"
        attn = layer.self_attn
        fused = torch.cat([getattr(attn, n).weight.data for n in _QKV], dim=0)
        groups = [(fused, [getattr(attn, n) for n in _QKV],
                   stats[f"{p}.self_attn.q_proj"])]
        for n in ("o_proj",):
            groups.append((getattr(attn, n).weight.data, [getattr(attn, n)],
                           stats[f"{p}.self_attn.{n}"]))
        for n in ("gate_proj", "up_proj", "down_proj"):
            mod = getattr(layer.mlp, n)
            groups.append((mod.weight.data, [mod], stats[f"{p}.mlp.{n}"]))
        for weight, mods, st in groups:
            t = quantize_linear(algo, weight, st, group_size=group_size)
            deq = dequantize_linear(algo, t).to(weight.dtype)
            for mod, part in zip(mods, deq.split([m.out_features for m in mods]), strict=True):
                mod.weight.data.copy_(part)
                if act_fp8:
                    scale = t["activation_scaling_factor"]
                    mod.register_forward_pre_hook(
                        lambda m, a, s=scale: (fake_quantize_fp8(a[0], s),))
    return qm


def test_tiny_llama_logits_close() -> None:
    model = _tiny_llama()
    ids = _calib_ids(n=16, max_len=48)
    stats = collect_activation_stats(model, ids[:8].split(4), max_samples=64)
    held_out = ids[8:]
    with torch.no_grad():
        ref = model(held_out).logits.float()
    limits = {"int8_wo": 0.02, "fp8": 0.1, "fp8+act": 0.15, "int4_wo": 0.3,
              "int4_awq": 0.3}
    rows = []
    for name, limit in limits.items():
        algo = name.split("+")[0]
        qm = _fake_quantize_llama(model, algo, stats, group_size=64,
                                  act_fp8=name.endswith("+act"))
        with torch.no_grad():
            out = qm(held_out).logits.float()
        max_abs = float((out - ref).abs().max())
        rel = float((out - ref).norm() / ref.norm())
        rows.append((name, max_abs, max_abs / float(ref.abs().max()), rel))
        assert rel < limit, (name, rel)
    by = {r[0]: r for r in rows}
    assert by["int4_awq"][3] <= by["int4_wo"][3] * 1.05
    # captured like any output (pytest -rP shows it): `pytest -q` prints dots, not this table
    print("\nalgo       max|Δlogit|  max|Δ|/max|ref|  ‖Δ‖/‖ref‖")
    for name, a, r, n in rows:
        print(f"{name:10s} {a:11.5f}  {r:15.5f}  {n:10.5f}")
