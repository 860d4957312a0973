"""``quantize`` for a mixture of experts: Mixtral, whose TensorRT-LLM model is confirmed.

The expected rank files are written out here by hand from TensorRT-LLM's own converter
(``tensorrt_llm/models/llama/convert.py``, ``convert_hf_llama``, MoE branch, @04a2cacb): a
rank's experts (``mapping.ep_experts``: contiguous, EP rank ``tp_rank % moe_ep_size``) stacked
on dim 0, ``w3`` and ``w1`` split on dim 1 and ``w2`` on dim 2 for the MoE TP rank
(``tp_rank // moe_ep_size``, ``tensorrt_llm/mapping.py``), ``mlp.fc`` = ``concat([w3, w1],
dim=-2)``, ``mlp.proj`` = ``w2``, ``mlp.router`` = ``block_sparse_moe.gate`` in float32. The
quantized weights are checked against the source without TensorRT-LLM: dequantized per
expert, within each algorithm's bound; the FP8 activation scales against ranges measured
here with plain hooks, every token through every expert.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from test_family_matrix import make_model
from tiny_models import hf_tensors, write_sentencepiece

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from nemo_convert.qnemo import quantize
from nemo_convert.quant import fp8_error_bound

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CALIB = {"calib_size": 2, "calib_seq_len": 16, "calib_batch_size": 2}
LAYERS, EXPERTS = 2, 4


def read_rank(folder: str, rank: int) -> dict[str, torch.Tensor]:
    with safe_open(os.path.join(folder, f"rank{rank}.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def header(folder: str, rank: int) -> list[str]:
    with safe_open(os.path.join(folder, f"rank{rank}.safetensors"), "pt") as f:
        return list(f.keys())


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    folder = make_model(str(tmp_path_factory.mktemp("mixtral") / "hf"), "mixtral", sliding_window=None)
    write_sentencepiece(os.path.join(folder, "tokenizer.model"), vocab_size=128)
    return folder


@pytest.fixture(scope="module")
def hf(src) -> dict[str, torch.Tensor]:
    return hf_tensors(src)


def expected_rank(hf: dict[str, torch.Tensor], tp: int, ep: int, r: int) -> dict[str, torch.Tensor]:
    """Rank ``r``'s tensors as TensorRT-LLM's converter builds them (module docstring)."""
    moe_tp, ep_rank, moe_tp_rank = tp // ep, r % ep, r // ep
    local = range(ep_rank * EXPERTS // ep, (ep_rank + 1) * EXPERTS // ep)

    def split(t: torch.Tensor, n: int, k: int, dim: int) -> torch.Tensor:
        return t.chunk(n, dim)[k]

    out = {"transformer.vocab_embedding.weight": split(hf["model.embed_tokens.weight"], tp, r, 0),
           "lm_head.weight": split(hf["lm_head.weight"], tp, r, 0),
           "transformer.ln_f.weight": hf["model.norm.weight"]}
    for i in range(LAYERS):
        h, t, b = f"model.layers.{i}.", f"transformer.layers.{i}.", f"model.layers.{i}.block_sparse_moe."
        out[t + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[t + "post_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[t + "attention.qkv.weight"] = torch.cat([split(hf[h + f"self_attn.{x}_proj.weight"], tp, r, 0)
                                                     for x in "qkv"])
        out[t + "attention.dense.weight"] = split(hf[h + "self_attn.o_proj.weight"], tp, r, 1)
        w = {x: torch.stack([hf[b + f"experts.{e}.{x}.weight"] for e in local]) for x in ("w1", "w2", "w3")}
        out[t + "mlp.fc.weight"] = torch.cat([split(w["w3"], moe_tp, moe_tp_rank, 1),
                                              split(w["w1"], moe_tp, moe_tp_rank, 1)], dim=-2)
        out[t + "mlp.proj.weight"] = split(w["w2"], moe_tp, moe_tp_rank, 2)
        out[t + "mlp.router.weight"] = hf[b + "gate.weight"].float()
    return out


@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 1), (2, 2)])
def test_none_writes_tensorrt_llms_moe_layout(tmp_path, src, hf, tp, ep):
    out = str(tmp_path / "q")
    rep = quantize(src, out, algo="none", tp=tp, ep=ep)
    assert rep.family == "mixtral" and rep.ep == ep
    cfg = json.load(open(os.path.join(out, "config.json")))
    hf_cfg = json.load(open(os.path.join(src, "config.json")))
    assert cfg["architecture"] == "MixtralForCausalLM" and cfg["hidden_act"] == "swiglu"
    assert cfg["intermediate_size"] == hf_cfg["intermediate_size"]
    assert cfg["moe"] == {"num_experts": EXPERTS, "top_k": hf_cfg["num_experts_per_tok"], "normalization_mode": 1}
    assert cfg["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1, "moe_tp_size": tp // ep,
                              "moe_ep_size": ep}
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}
    for r in range(tp):
        got, want = read_rank(out, r), expected_rank(hf, tp, ep, r)
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), (r, k)


def test_the_untouched_checkpoint_computes_the_source_model(tmp_path, src, hf):
    """Rebuilt into transformers' Mixtral from rank0 alone (fc = [up; gate] per expert), the
    model's logits equal the source's."""
    from transformers import MixtralForCausalLM

    out, back = str(tmp_path / "q"), tmp_path / "back"
    quantize(src, out, algo="none")
    t, sd = read_rank(out, 0), {}
    inter = json.load(open(os.path.join(src, "config.json")))["intermediate_size"]
    sd.update({"model.embed_tokens.weight": t["transformer.vocab_embedding.weight"],
               "lm_head.weight": t["lm_head.weight"], "model.norm.weight": t["transformer.ln_f.weight"]})
    for i in range(LAYERS):
        p, h = f"transformer.layers.{i}.", f"model.layers.{i}."
        q, k, v = t[p + "attention.qkv.weight"].split([64, 32, 32])
        sd.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                   h + "self_attn.v_proj.weight": v, h + "self_attn.o_proj.weight": t[p + "attention.dense.weight"],
                   h + "input_layernorm.weight": t[p + "input_layernorm.weight"],
                   h + "post_attention_layernorm.weight": t[p + "post_layernorm.weight"],
                   h + "block_sparse_moe.gate.weight": t[p + "mlp.router.weight"]})
        for e in range(EXPERTS):
            x = h + f"block_sparse_moe.experts.{e}."
            sd[x + "w3.weight"], sd[x + "w1.weight"] = t[p + "mlp.fc.weight"][e].split([inter, inter])
            sd[x + "w2.weight"] = t[p + "mlp.proj.weight"][e]
    assert set(sd) == set(hf)
    back.mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(back / "model.safetensors"))
    (back / "config.json").write_text(open(os.path.join(src, "config.json")).read())
    ids = torch.tensor([[1, 5, 9, 33, 70, 2, 101, 64]])
    with torch.no_grad():
        ref = MixtralForCausalLM.from_pretrained(src).eval()(ids).logits
        got = MixtralForCausalLM.from_pretrained(str(back)).eval()(ids).logits
    assert torch.equal(got, ref)


@pytest.mark.parametrize("tp, ep", [(2, 1), (2, 2)])
def test_int8_wo_puts_every_expert_on_its_rank_grid(tmp_path, src, hf, tp, ep):
    """W8A16 is written as each rank's float weight on TensorRT-LLM's int8 grid (per output
    channel over the rank's own input columns, expert by expert): each value within half an
    int8 step of the independently sliced bf16 source; the router stays float32, exact, and
    unquantized (exclude_modules)."""
    out = str(tmp_path / "q")
    quantize(src, out, algo="int8_wo", tp=tp, ep=ep, dtype="bf16")
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["quantization"]["quant_algo"] == "W8A16"
    assert "transformer.layers.*.mlp.router" in cfg["quantization"]["exclude_modules"]
    bf = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in hf.items()}
    for r in range(tp):
        got, want = read_rank(out, r), expected_rank(bf, tp, ep, r)
        for k, v in want.items():
            if k.endswith(("mlp.fc.weight", "mlp.proj.weight")):
                g, w = got[k].float(), v.float()
                step = w.abs().amax(dim=-1, keepdim=True) / 127   # per expert and output row, rank's columns
                assert got[k].dtype == torch.bfloat16 and got[k].shape == v.shape
                assert bool(((g - w).abs() <= step / 2 * 1.01 + w.abs() * 2 ** -7).all()), (r, k)
            elif k.endswith("router.weight"):
                assert got[k].dtype == torch.float32 and torch.equal(got[k], hf[k.replace(
                    "transformer.layers.", "model.layers.").replace("mlp.router", "block_sparse_moe.gate")]), k
            elif not k.endswith(("qkv.weight", "dense.weight", "lm_head.weight")):
                assert torch.equal(got[k], v), (r, k)


def _measured_ranges(src: str) -> dict[str, float]:
    """Input ranges of each layer's experts (every token through every expert) and K/V output
    ranges, measured on the calibration tokens with plain hooks on transformers' Mixtral."""
    from transformers import MixtralForCausalLM

    from nemo_convert.qnemo.calibration import calibration_tokens
    from nemo_convert.quant import builtin_calibration_texts

    ids = calibration_tokens(src, builtin_calibration_texts(), n=CALIB["calib_size"], seq_len=CALIB["calib_seq_len"])
    model = MixtralForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    amax: dict[str, float] = {}

    def keep(name: str, x: torch.Tensor) -> None:
        amax[name] = max(amax.get(name, 0.0), float(x.detach().float().abs().max()))

    for i, layer in enumerate(model.model.layers):
        def experts_in(mod, args, i=i):
            x = args[0]
            keep(f"{i}.fc", x)
            for e in range(EXPERTS):  # w1 = gate, w3 = up: silu(x w1ᵀ) · x w3ᵀ is w2's input
                gate, up = torch.nn.functional.linear(x, mod.gate_up_proj[e]).chunk(2, dim=-1)
                keep(f"{i}.proj", torch.nn.functional.silu(gate) * up)
        layer.mlp.experts.register_forward_pre_hook(experts_in)
        layer.self_attn.k_proj.register_forward_hook(lambda m, a, o, i=i: keep(f"{i}.k", o))
        layer.self_attn.v_proj.register_forward_hook(lambda m, a, o, i=i: keep(f"{i}.v", o))
    with torch.no_grad():
        for b in range(0, ids.shape[0], CALIB["calib_batch_size"]):
            model(ids[b:b + CALIB["calib_batch_size"]], use_cache=False)
    return amax


def test_fp8_quantizes_each_expert_with_its_own_weight_scale(tmp_path, src, hf):
    """FP8 as TensorRT-LLM's MoE layer holds it (``tensorrt_llm/layers/moe.py``,
    ``MOEWeightWrapper``): weights E4M3 ``[E, out, in]``, ``weights_scaling_factor`` one per
    expert ``(E, 1)``, one ``activation_scaling_factor`` ``(1,)`` for all experts = the max of
    their input ranges / 448; each expert dequantizes within the E4M3 bound of its source. The
    KV-cache scale is Llama's."""
    out = str(tmp_path / "q")
    rep = quantize(src, out, algo="fp8", kv_cache="fp8", tp=2, ep=2, dtype="bf16", **CALIB)
    assert rep.quant_algo == "FP8" and rep.calibration is not None
    amax = _measured_ranges(src)
    for r in range(2):
        got, want = read_rank(out, r), expected_rank(hf, 2, 2, r)   # quantized from the float32 source
        for i in range(LAYERS):
            p = f"transformer.layers.{i}."
            for lin, rng in (("mlp.fc", f"{i}.fc"), ("mlp.proj", f"{i}.proj")):
                w, s = got[p + lin + ".weight"], got[p + lin + ".weights_scaling_factor"]
                assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (EXPERTS // 2, 1)
                a = got[p + lin + ".activation_scaling_factor"]
                assert a.shape == (1,) and math.isclose(float(a), amax[rng] / 448, rel_tol=1e-6), (r, lin)
                ref = want[p + lin + ".weight"].float()
                for e in range(EXPERTS // 2):
                    deq = w[e].float() * s[e]
                    assert math.isclose(float(s[e]), float(ref[e].abs().max()) / 448, rel_tol=1e-6)
                    assert bool(((deq - ref[e]).abs() <= fp8_error_bound(ref[e], s[e]) * 1.001).all()), (r, lin, e)
            kv = got[p + "attention.kv_cache_scaling_factor"]
            assert math.isclose(float(kv), max(math.sqrt(2) * amax[f"{i}.k"], amax[f"{i}.v"]) / 448, rel_tol=1e-6)
            assert torch.equal(got[p + "mlp.router.weight"], want[p + "mlp.router.weight"])


@pytest.mark.slow
def test_nemo_source_gives_the_same_files(tmp_path, src):
    """A .nemo calibrates through a temporary HF export (per-expert layout) that transformers
    loads with fused experts: the family reads that spelling, and the files are the same."""
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    kw = dict(algo="fp8", kv_cache="fp8", tp=2, ep=2, dtype="bf16", **CALIB)
    quantize(src, str(tmp_path / "a"), **kw)
    quantize(nemo, str(tmp_path / "b"), **kw)
    for name in sorted(os.listdir(tmp_path / "a")):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_int4_wo_packs_each_expert(tmp_path):
    """Group-wise int4 per expert: ``weight`` ``[E, out/2, in]`` int8, ``weights_scaling_factor``
    ``[E, out, in/g]`` — each expert within half a step of its source."""
    from nemo_convert.quant import dequantize_int4_wo

    src = make_model(str(tmp_path / "hf"), "mixtral", sliding_window=None, intermediate_size=128)
    hf = hf_tensors(src)
    out = str(tmp_path / "q")
    quantize(src, out, algo="int4_wo", group_size=64, dtype="bf16")
    t = read_rank(out, 0)
    for i in range(LAYERS):
        b = f"model.layers.{i}.block_sparse_moe.experts."
        for lin, parts in (("mlp.fc", ("w3", "w1")), ("mlp.proj", ("w2",))):
            w, s = t[f"transformer.layers.{i}.{lin}.weight"], t[f"transformer.layers.{i}.{lin}.weights_scaling_factor"]
            assert w.dtype == torch.int8 and w.shape[0] == EXPERTS and s.shape[:2] == (EXPERTS, w.shape[1] * 2)
            for e in range(EXPERTS):
                ref = torch.cat([hf[b + f"{e}.{x}.weight"] for x in parts]).float()   # the float32 source
                deq = dequantize_int4_wo({"weight": w[e], "weights_scaling_factor": s[e]})
                step = s[e].float().repeat_interleave(64, dim=1)
                assert bool(((deq - ref).abs() <= step / 2 * 1.01 + 1e-6).all()), (i, lin, e)


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss", "qwen2_moe", "qwen3_moe"])
def test_moe_families_without_a_confirmed_model_are_refused_by_name(tmp_path, family):
    src = make_model(str(tmp_path / family), family)
    with pytest.raises(UnsupportedError, match=f"model family '{family}' declares no TensorRT-LLM mapping") as ei:
        quantize(src, str(tmp_path / "q"), algo="none")
    assert "mixtral" in str(ei.value) and not os.path.exists(tmp_path / "q")


@pytest.mark.parametrize("kw, message", [
    ({"algo": "int4_awq", "group_size": 64, "dtype": "bf16"},
     "TensorRT-LLM's MoE layer takes one prequant_scaling_factor for all of them"),
    ({"algo": "none", "tp": 1, "ep": 2}, "--ep 2 must divide --tp 1"),
    ({"algo": "none", "tp": 4, "ep": 4}, "TP 4 does not divide num_key_value_heads=2"),
])
def test_moe_combinations_it_cannot_write_are_refused(tmp_path, src, kw, message):
    out = str(tmp_path / "q")
    with pytest.raises(UnsupportedError, match=message.replace("(", r"\(")):
        quantize(src, out, **kw)
    assert not os.path.exists(out)


def test_pipeline_stages_renumber_moe_layers(tmp_path, src, hf):
    """TP 2 × EP 2 × PP 2: the second stage's rank files hold layer 1 as layer 0, with the
    final norm and lm_head; its experts split as at PP 1."""
    out = str(tmp_path / "q")
    quantize(src, out, algo="none", tp=2, ep=2, pp=2)
    for r in range(2):
        want = expected_rank(hf, 2, 2, r)
        got = read_rank(out, 2 + r)
        stage = {k.replace("layers.1.", "layers.0."): v for k, v in want.items()
                 if "layers.1." in k or k in ("transformer.ln_f.weight", "lm_head.weight")}
        assert sorted(got) == sorted(stage)
        assert all(torch.equal(got[k], v) for k, v in stage.items())
        assert "transformer.vocab_embedding.weight" in read_rank(out, r)


def test_ep_needs_experts(tmp_path):
    src = make_model(str(tmp_path / "llama"), "llama", attention_bias=False, mlp_bias=False)
    with pytest.raises(UnsupportedError, match="--ep 2 for a model without experts"):
        quantize(src, str(tmp_path / "q"), algo="none", tp=2, ep=2)
