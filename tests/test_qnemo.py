"""``quantize`` → ``.qnemo`` (TensorRT-LLM checkpoint) on tiny random Llamas.

Everything the test compares against is built here independently of nemo_convert.qnemo:
the expected per-rank names/shapes/dtypes come from the TensorRT-LLM layout written out
below, rank files are un-sliced by hand, and the logits come from a transformers model
whose weights were rebuilt from the rank files alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tarfile

import pytest
import torch
from safetensors import safe_open
from tiny_models import make_tiny_llama

from nemo_convert import api
from nemo_convert.errors import NemoConvertError, OutputExistsError, UnsupportedError
from nemo_convert.formats.hf.hf import open_hf_weights
from nemo_convert.qnemo import quantize
from nemo_convert.quant import (
    dequantize_fp8,
    dequantize_int4_wo,
    fp8_error_bound,
    quantize_linear,
)

#: A GQA Llama whose vocabulary (321) needs padding at TP 2, whose layers split into two
#: stages, with llama3 RoPE scaling; hidden/ffn fit int4 groups of 64 at TP 2.
GEOMETRY = {"vocab_size": 321, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 128}}
CALIB = {"calib_size": 4, "calib_seq_len": 32, "calib_batch_size": 4}
ALGOS = ["int8_wo", "int4_wo", "fp8", "int4_awq"]


# --------------------------------------------------------------------------- fixtures
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("hf") / "llama"), dtype=torch.bfloat16, **GEOMETRY)


@pytest.fixture(scope="module")
def outs(tmp_path_factory, src):
    """Lazily quantized outputs, shared by the tests: ``outs(algo, tp, pp, **kw) -> folder``."""
    root = tmp_path_factory.mktemp("q")
    done: dict[tuple, str] = {}

    def get(algo: str, tp: int, pp: int, **kw) -> str:
        key = (algo, tp, pp, tuple(sorted(kw.items())))
        if key not in done:
            out = str(root / f"{algo}_tp{tp}_pp{pp}_{len(done)}.qnemo")
            quantize(src, out, algo=algo, tp=tp, pp=pp, group_size=64, **CALIB, **kw)
            done[key] = out
        return done[key]

    return get


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def hf_state(folder: str) -> dict[str, torch.Tensor]:
    s = open_hf_weights(folder)
    return {k: s.load(k).clone() for k in list(s.keys())}


def read_ranks(folder: str) -> list[dict[str, torch.Tensor]]:
    cfg = read_json(os.path.join(folder, "config.json"))
    out = []
    for r in range(cfg["mapping"]["world_size"]):
        with safe_open(os.path.join(folder, f"rank{r}.safetensors"), "pt") as f:
            out.append({k: f.get_tensor(k) for k in list(f.keys())})
    return out


def geometry(hf_cfg: dict) -> dict:
    h, nq, nkv = hf_cfg["hidden_size"], hf_cfg["num_attention_heads"], hf_cfg["num_key_value_heads"]
    return {"H": h, "F": hf_cfg["intermediate_size"], "nq": nq, "nkv": nkv,
            "d": hf_cfg.get("head_dim") or h // nq, "V": hf_cfg["vocab_size"], "L": hf_cfg["num_hidden_layers"]}


# --------------------------------------------------------------------------- expected layout
def expected_rank(algo: str, g: dict, tp: int, pp: int, rank: int, *, dt=torch.bfloat16, group=64,
                  kv=False) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """TensorRT-LLM's per-rank tensors for a Llama, written out from the layout rules."""
    H, F, nq, nkv, d, V, L = (g[k] for k in ("H", "F", "nq", "nkv", "d", "V", "L"))
    pp_rank = rank // tp
    vp = -(-V // tp) * tp
    exp: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    linears = {  # name: (out_local, in_local, column?)
        "attention.qkv": ((nq + 2 * nkv) * d // tp, H, True),
        "attention.dense": (H, nq * d // tp, False),
        "mlp.fc": (F // tp, H, True),
        "mlp.gate": (F // tp, H, True),
        "mlp.proj": (H, F // tp, False),
    }
    for j in range(L // pp):
        p = f"transformer.layers.{j}."
        exp[p + "input_layernorm.weight"] = ((H,), dt)
        exp[p + "post_layernorm.weight"] = ((H,), dt)
        if kv:
            exp[p + "attention.kv_cache_scaling_factor"] = ((1,), torch.float32)
        for name, (o, i, col) in linears.items():
            q = p + name + "."
            if algo in ("none", "int8_wo"):
                exp[q + "weight"] = ((o, i), dt)
            elif algo in ("int4_wo", "int4_awq"):
                exp[q + "weight"] = ((o // 2, i), torch.int8)
                exp[q + "weights_scaling_factor"] = ((o, i // group), dt)
                if algo == "int4_awq":
                    exp[q + "prequant_scaling_factor"] = ((i,), dt)
            else:
                exp[q + "weight"] = ((o, i), torch.float8_e4m3fn)
                exp[q + "weights_scaling_factor"] = ((1,), torch.float32)
                exp[q + "activation_scaling_factor"] = ((1,), torch.float32)
    if pp_rank == 0:
        exp["transformer.vocab_embedding.weight"] = ((vp // tp, H), dt)
    if pp_rank == pp - 1:
        exp["transformer.ln_f.weight"] = ((H,), dt)
        exp["lm_head.weight"] = ((vp // tp, H), dt)
    return exp


# --------------------------------------------------------------------------- rebuild from rank files
LINEARS = {"attention.qkv": "col", "attention.dense": "row", "mlp.fc": "col", "mlp.gate": "col",
           "mlp.proj": "row"}


def dequant(quant_algo: str | None, t: dict[str, torch.Tensor]) -> torch.Tensor:
    if quant_algo == "W4A16_AWQ":
        return dequantize_int4_wo(t)
    if quant_algo == "FP8":
        return dequantize_fp8(t)
    return t["weight"].float()


def rebuild(folder: str, hf_cfg: dict) -> dict[str, torch.Tensor]:
    """HF float32 state dict rebuilt from the rank files alone (dequantized, un-sliced)."""
    cfg = read_json(os.path.join(folder, "config.json"))
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    qa = cfg["quantization"]["quant_algo"]
    g = geometry(hf_cfg)
    lps = g["L"] // pp
    ranks = read_ranks(folder)
    out: dict[str, torch.Tensor] = {}
    emb, head = [], []
    for pp_rank in range(pp):
        group = ranks[pp_rank * tp:(pp_rank + 1) * tp]
        for j in range(lps):
            li = pp_rank * lps + j
            p, h = f"transformer.layers.{j}.", f"model.layers.{li}."
            for norm, hn in (("input_layernorm", "input_layernorm"), ("post_layernorm", "post_attention_layernorm")):
                assert all(torch.equal(r[p + norm + ".weight"], group[0][p + norm + ".weight"]) for r in group)
                out[h + hn + ".weight"] = group[0][p + norm + ".weight"].float()
            for name, kind in LINEARS.items():
                pre = p + name + "."
                parts = [dequant(qa, {k[len(pre):]: v for k, v in r.items() if k.startswith(pre)}) for r in group]
                if name == "attention.qkv":
                    qs, ks, vs = zip(*[torch.split(x, [g["nq"] * g["d"] // tp, g["nkv"] * g["d"] // tp,
                                                       g["nkv"] * g["d"] // tp]) for x in parts])
                    out[h + "self_attn.q_proj.weight"] = torch.cat(qs)
                    out[h + "self_attn.k_proj.weight"] = torch.cat(ks)
                    out[h + "self_attn.v_proj.weight"] = torch.cat(vs)
                    continue
                full = torch.cat(parts, dim=0 if kind == "col" else 1)
                hn = {"attention.dense": "self_attn.o_proj", "mlp.fc": "mlp.gate_proj", "mlp.gate": "mlp.up_proj",
                      "mlp.proj": "mlp.down_proj"}[name]
                out[h + hn + ".weight"] = full
        if pp_rank == 0:
            emb = [r["transformer.vocab_embedding.weight"] for r in group]
        if pp_rank == pp - 1:
            head = [r["lm_head.weight"] for r in group]
            out["model.norm.weight"] = group[0]["transformer.ln_f.weight"].float()
    V = g["V"]
    e, hd = torch.cat(emb), torch.cat(head)
    assert e.shape[0] == hd.shape[0] == -(-V // tp) * tp
    assert not e[V:].any() and not hd[V:].any(), "vocabulary padding must be zero rows"
    out["model.embed_tokens.weight"] = e[:V].float()
    out["lm_head.weight"] = hd[:V].float()
    return out


def logits_of(hf_folder: str, state: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    from transformers import AutoConfig, LlamaForCausalLM

    cfg = AutoConfig.from_pretrained(hf_folder)
    model = LlamaForCausalLM(cfg).float().eval()
    src = state if state is not None else {k: v.float() for k, v in hf_state(hf_folder).items()}
    missing, unexpected = model.load_state_dict(src, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    ids = torch.tensor([[1, 5, 9, 33, 2, 77, 100, 3, 250, 17, 42, 8, 120, 64, 200, 11]])
    with torch.no_grad():
        return model(ids).logits


# --------------------------------------------------------------------------- none: layout and exactness
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("pp", [1, 2])
def test_plain_checkpoint_layout_slices_and_logits(src, outs, tp, pp):
    folder = outs("none", tp, pp)
    hf_cfg = read_json(os.path.join(src, "config.json"))
    cfg = read_json(os.path.join(folder, "config.json"))
    # config.json
    assert cfg["architecture"] == "LlamaForCausalLM" and cfg["dtype"] == "bfloat16"
    for k, v in {"vocab_size": 321, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 256, "head_size": 32,
                 "max_position_embeddings": 256, "position_embedding_type": "rope_gpt_neox",
                 "rotary_base": 10000.0, "norm_epsilon": 1e-5, "hidden_act": "silu"}.items():
        assert cfg[k] == v, k
    assert cfg["rotary_scaling"] == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    assert cfg["mapping"] == {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}
    # names, shapes, dtypes per rank
    g = geometry(hf_cfg)
    ranks = read_ranks(folder)
    assert len(ranks) == tp * pp
    for r, tensors in enumerate(ranks):
        exp = expected_rank("none", g, tp, pp, r)
        assert {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} == exp
    # un-sliced rank tensors are the source tensors, bit for bit
    want = hf_state(src)
    got = rebuild(folder, hf_cfg)
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v.float()), k
    assert torch.equal(logits_of(src, got), logits_of(src))
    # tokenizer: NeMo's tokenizer_config.yaml + the file it names
    import yaml

    tok = yaml.safe_load(read_bytes(os.path.join(folder, "tokenizer_config.yaml")))
    assert tok["library"] == "sentencepiece" and tok["model"] == "tokenizer.model"
    assert read_bytes(os.path.join(folder, "tokenizer.model")) == \
        read_bytes(os.path.join(src, "tokenizer.model"))


def test_pp_rank_files_number_layers_from_zero(outs):
    ranks = read_ranks(outs("none", 1, 2))
    layers = [sorted({int(k.split(".")[2]) for k in r if k.startswith("transformer.layers.")}) for r in ranks]
    assert layers == [[0, 1], [0, 1]]
    assert "transformer.vocab_embedding.weight" in ranks[0] and "lm_head.weight" not in ranks[0]
    assert "lm_head.weight" in ranks[1] and "transformer.ln_f.weight" in ranks[1]
    assert "transformer.vocab_embedding.weight" not in ranks[1]


# --------------------------------------------------------------------------- quantized algorithms
def _local_source(want: dict[str, torch.Tensor], g: dict, name: str, layer: int, tp: int, r: int) -> torch.Tensor:
    """Rank ``r``'s slice of one linear's HF weight, sliced here by hand."""
    h = f"model.layers.{layer}."

    def rows(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0] // tp
        return t[r * n:(r + 1) * n]

    if name == "attention.qkv":
        return torch.cat([rows(want[h + f"self_attn.{x}_proj.weight"]) for x in "qkv"])
    if name in ("mlp.fc", "mlp.gate"):
        return rows(want[h + ("mlp.gate_proj.weight" if name == "mlp.fc" else "mlp.up_proj.weight")])
    full = want[h + ("self_attn.o_proj.weight" if name == "attention.dense" else "mlp.down_proj.weight")]
    n = full.shape[1] // tp
    return full[:, r * n:(r + 1) * n]


@pytest.mark.parametrize("algo", ALGOS)
def test_algorithm_layout_bounds_and_logits(src, outs, algo):
    tp, pp = 2, 2
    kv = algo in ("fp8", "int4_awq")
    folder = outs(algo, tp, pp, **({"kv_cache": "fp8"} if kv else {}))
    hf_cfg = read_json(os.path.join(src, "config.json"))
    cfg = read_json(os.path.join(folder, "config.json"))
    quant = cfg["quantization"]
    assert quant["quant_algo"] == {"int8_wo": "W8A16", "int4_wo": "W4A16_AWQ", "fp8": "FP8",
                                   "int4_awq": "W4A16_AWQ"}[algo]
    assert quant["kv_cache_quant_algo"] == ("FP8" if kv else None)
    assert quant["exclude_modules"] == ["lm_head", "transformer.vocab_embedding"]
    if algo.startswith("int4"):
        assert quant["group_size"] == 64 and quant["has_zero_point"] is False
        assert quant["pre_quant_scale"] is (algo == "int4_awq")
    else:
        assert "group_size" not in quant
    g = geometry(hf_cfg)
    ranks = read_ranks(folder)
    for r, tensors in enumerate(ranks):
        assert {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} == \
            expected_rank(algo, g, tp, pp, r, kv=kv), r
    # every rank's linear dequantizes within the algorithm's bound of its source slice
    want = hf_state(src)
    lps = g["L"] // pp
    for rank, tensors in enumerate(ranks):
        tp_rank, pp_rank = rank % tp, rank // tp
        for j in range(lps):
            for name in LINEARS:
                pre = f"transformer.layers.{j}.{name}."
                t = {k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre)}
                w = _local_source(want, g, name, pp_rank * lps + j, tp, tp_rank).float()
                if algo == "int8_wo":
                    scale = (w.abs().amax(dim=1) / 127).to(torch.bfloat16).float()
                    deq = t["weight"].float()
                    bound = scale[:, None] / 2 * (1 + 1e-5) + deq.abs() * 2 ** -8
                    # on the int8 grid (up to the bf16 rounding of q·scale)
                    k = deq / scale[:, None]
                    assert bool(((k - k.round()).abs() <= k.abs() * 2 ** -8 + 1e-3).all()), pre
                    assert int(k.round().abs().max()) <= 127
                elif algo == "fp8":
                    deq = dequantize_fp8(t)
                    bound = fp8_error_bound(w, t["weights_scaling_factor"]) * (1 + 1e-6)
                else:
                    deq = dequantize_int4_wo(t)
                    s = t["weights_scaling_factor"].float().repeat_interleave(64, dim=1)
                    pre_s = t.get("prequant_scaling_factor")
                    bound = s / 2 * (1 + 1e-5) * (1 if pre_s is None else pre_s.float()[None, :])
                assert bool(((w - deq).abs() <= bound).all()), pre
    # logits of a transformers Llama rebuilt from the rank files
    ref = logits_of(src)
    got = logits_of(src, rebuild(folder, hf_cfg))
    diff = (got - ref).abs()
    rel = float((got - ref).norm() / ref.norm())
    print(f"\n{algo}: max |Δlogit| = {float(diff.max()):.5f}, ‖Δ‖/‖ref‖ = {rel:.5f}")
    assert rel < {"int8_wo": 0.03, "fp8": 0.1, "int4_wo": 0.3, "int4_awq": 0.3}[algo]


@pytest.mark.parametrize("algo", ["int8_wo", "int4_wo", "fp8"])
def test_rank_slices_concatenate_to_the_full_quantized_tensors(src, outs, algo):
    """Un-slicing the rank files gives the quantization of the whole fused weight."""
    tp = 2
    folder = outs(algo, tp, 1, **({"kv_cache": "fp8"} if algo == "fp8" else {}))
    want = hf_state(src)
    g = geometry(read_json(os.path.join(src, "config.json")))
    ranks = read_ranks(folder)
    h = "model.layers.1."
    fused = {
        "attention.qkv": (torch.cat([want[h + f"self_attn.{x}_proj.weight"] for x in "qkv"]), "col",
                          [g["nq"] * g["d"], g["nkv"] * g["d"], g["nkv"] * g["d"]]),
        "attention.dense": (want[h + "self_attn.o_proj.weight"], "row", None),
        "mlp.fc": (want[h + "mlp.gate_proj.weight"], "col", None),
        "mlp.proj": (want[h + "mlp.down_proj.weight"], "row", None),
    }
    for name, (w, kind, sections) in fused.items():
        if algo == "int8_wo":
            # The float weight on the int8 grid TensorRT-LLM re-quantizes to per rank: per
            # output channel over the rank's columns (all columns when column-parallel).
            from nemo_convert.quant import dequantize_int8_wo

            blocks = w.chunk(tp, dim=1) if kind == "row" else [w]
            full = {"weight": torch.cat([dequantize_int8_wo(quantize_linear("int8_wo", b, dtype=torch.bfloat16))
                                         .to(torch.bfloat16) for b in blocks], dim=1)}
        else:
            full = quantize_linear(algo, w, _Amax() if algo == "fp8" else None, dtype=torch.bfloat16,
                                   group_size=64)
        pre = f"transformer.layers.1.{name}."
        for suffix, ref in full.items():
            if suffix == "activation_scaling_factor":
                continue
            parts = [r[pre + suffix] for r in ranks]
            if ref.dim() == 1 and ref.numel() == 1:
                assert all(torch.equal(p, ref) for p in parts), (name, suffix)
                continue
            if kind == "row":
                got = torch.cat(parts, dim=1)
            elif sections is None:
                got = torch.cat(parts, dim=0)
            else:
                scale = ref.shape[0] / sum(sections)
                local = [int(s * scale) // tp for s in sections]
                split = [torch.split(p, local) for p in parts]
                got = torch.cat([split[r][s] for s in range(len(sections)) for r in range(tp)])
            if ref.dtype == torch.float8_e4m3fn:
                got, ref = got.view(torch.uint8), ref.view(torch.uint8)
            assert torch.equal(got, ref), (name, suffix)


class _Amax:
    """Any activation amax: only the weight tensors are compared."""

    input_amax = torch.tensor(1.0)
    act_mean = torch.ones(1)
    samples = None


def test_fp8_scales_are_calibrated_amax_over_448(src, outs):
    """Activation and KV-cache scales against amax measured here with plain hooks."""
    from transformers import AutoModelForCausalLM

    from nemo_convert.qnemo.calibration import calibration_tokens
    from nemo_convert.quant import builtin_calibration_texts

    folder = outs("fp8", 2, 2, kv_cache="fp8")
    ids = calibration_tokens(src, builtin_calibration_texts(), n=CALIB["calib_size"],
                             seq_len=CALIB["calib_seq_len"])
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    amax: dict[str, float] = {}

    def hook(name, output=False):
        def fn(mod, args, out=None):
            x = out if output else args[0]
            amax[name] = max(amax.get(name, 0.0), float(x.detach().float().abs().max()))
        return fn

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.startswith("model.layers."):
            mod.register_forward_pre_hook(hook(name))
            if name.endswith(("k_proj", "v_proj")):
                mod.register_forward_hook(lambda m, a, o, n=name: hook(n + ":out", True)(m, a, o))
    with torch.no_grad():
        for b in range(0, ids.shape[0], CALIB["calib_batch_size"]):
            model(ids[b:b + CALIB["calib_batch_size"]], use_cache=False)
    ranks = read_ranks(folder)
    tp, lps = 2, 2
    for rank, tensors in enumerate(ranks):
        for j in range(lps):
            li = (rank // tp) * lps + j
            h, p = f"model.layers.{li}.", f"transformer.layers.{j}."
            inputs = {"attention.qkv": "self_attn.q_proj", "attention.dense": "self_attn.o_proj",
                      "mlp.fc": "mlp.gate_proj", "mlp.gate": "mlp.up_proj", "mlp.proj": "mlp.down_proj"}
            for name, mod in inputs.items():
                got = tensors[p + name + ".activation_scaling_factor"]
                assert got.dtype == torch.float32 and got.shape == (1,)
                assert math.isclose(float(got), amax[h + mod] / 448, rel_tol=1e-6), (rank, name)
            kv = tensors[p + "attention.kv_cache_scaling_factor"]
            k, v = amax[h + "self_attn.k_proj:out"], amax[h + "self_attn.v_proj:out"]
            assert math.isclose(float(kv), max(math.sqrt(2) * k, v) / 448, rel_tol=1e-6)


# --------------------------------------------------------------------------- sources and containers
def _files(folder: str) -> dict[str, bytes]:
    return {n: read_bytes(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}


def test_nemo_source_gives_the_same_files(tmp_path, src, outs):
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    for algo, kw in (("none", {}), ("int4_awq", {"kv_cache": "fp8"})):
        out = str(tmp_path / f"{algo}.qnemo")
        quantize(nemo, out, algo=algo, tp=2, pp=2, group_size=64, **CALIB, **kw)
        assert _files(out) == _files(outs(algo, 2, 2, **kw)), algo
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")], "temporary export left behind"


def test_quantize_writes_through_the_registered_trtllm_target(tmp_path, src, outs, monkeypatch):
    """``quantize`` is a command over the one output step: the registered ``trtllm``
    record's writer gets one :class:`OutputJob` with the settings as one frozen
    ``QuantSettings``; a third party's target of the same kind is not called; with the
    ``trtllm`` plugin blocked, quantize has no target (negative control)."""
    from types import SimpleNamespace

    from nemo_convert import hookimpl
    from nemo_convert.plugins.manager import DISABLE_ENV, registry_with
    from nemo_convert.plugins.records import OutputTarget, QuantSettings
    from nemo_convert.qnemo import target_writer

    expected = _files(outs("int4_awq", 2, 2, kv_cache="fp8"))  # quantized before the spy is in place
    seen: list = []
    real = target_writer.write_trtllm_target
    monkeypatch.setattr(target_writer, "write_trtllm_target", lambda job: seen.append(job) or real(job))

    def never(job):
        raise AssertionError("a target quantize did not choose was called")

    other = SimpleNamespace(nemo_convert_targets=hookimpl(
        lambda: [OutputTarget("other-qnemo", "qnemo", never, frozenset({"packed", "workers", "quantization"}))]))
    reg = registry_with(("other", other))
    assert [t.name for t in reg.targets()][-2:] == ["trtllm", "other-qnemo"]
    out = str(tmp_path / "q.qnemo")
    quantize(src, out, algo="int4_awq", tp=2, pp=2, group_size=64, kv_cache="fp8", registry=reg, **CALIB)
    assert _files(out) == expected  # byte-identical to the run with the default registry
    [job] = seen
    assert job.command == "quantize" and (job.tp, job.pp, job.packed) == (2, 2, False)
    assert job.quantization == QuantSettings("int4_awq", kv_cache="fp8", group_size=64, device=torch.device("cpu"),
                                             calib_size=4, calib_seq_len=32, calib_batch_size=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.quantization.algo = "fp8"  # type: ignore[misc]
    assert job.model is not None and job.model.config["vocab_size"] == GEOMETRY["vocab_size"]
    monkeypatch.setenv(DISABLE_ENV, "trtllm")
    with pytest.raises(UnsupportedError, match="unknown target 'trtllm'"):
        quantize(src, str(tmp_path / "blocked.qnemo"), algo="none", registry=registry_with())
    assert len(seen) == 1 and not os.path.exists(tmp_path / "blocked.qnemo")


def test_compress_writes_a_plain_tar_with_the_same_members(tmp_path, src, outs):
    out = str(tmp_path / "m.qnemo")
    rep = quantize(src, out, algo="int4_awq", tp=2, pp=2, group_size=64, kv_cache="fp8", compress=True, **CALIB)
    assert rep.compressed and os.path.isfile(out)
    with tarfile.open(out, "r:") as tar:  # plain, uncompressed
        members = {m.name[2:]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        assert all(m.name.startswith("./") for m in tar.getmembers() if m.isfile())
    assert members == _files(outs("int4_awq", 2, 2, kv_cache="fp8"))


def test_tied_embeddings_write_the_embedding_as_lm_head(tmp_path):
    src = make_tiny_llama(str(tmp_path / "tied"), dtype=torch.bfloat16, tie_word_embeddings=True, **GEOMETRY)
    assert "lm_head.weight" not in hf_state(src)
    out = str(tmp_path / "t.qnemo")
    quantize(src, out, algo="none", tp=2)
    ranks = read_ranks(out)
    for r in ranks:
        assert torch.equal(r["lm_head.weight"], r["transformer.vocab_embedding.weight"])
    hf_cfg = read_json(os.path.join(src, "config.json"))
    assert torch.equal(logits_of(src, rebuild(out, hf_cfg)), logits_of(src))


def test_cli_quantize_json(tmp_path, src, capsys):
    from nemo_convert.cli.main import main

    out = str(tmp_path / "c.qnemo")
    rc = main(["quantize", src, "-o", out, "--algo", "int4_wo", "--tp", "2", "--group-size", "64", "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["quant_algo"] == "W4A16_AWQ" and rep["tp"] == 2 and rep["calibration"] is None
    assert rep["files"][-2:] == ["rank0.safetensors", "rank1.safetensors"]
    assert sorted(os.listdir(out)) == sorted(rep["files"])


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw, message", [
    ({"algo": "int4_wo", "tp": 2, "group_size": 128}, "not a multiple of the group size 128"),
    ({"algo": "int4_awq", "tp": 1, "group_size": 32}, "group size 32"),
    ({"algo": "none", "tp": 4}, "TP 4 does not divide num_key_value_heads=2"),
    ({"algo": "none", "pp": 3}, "do not split evenly into 3 pipeline stages"),
    ({"algo": "int8_wo", "tp": 3, "dtype": "bf16"}, "TP 3 does not divide num_attention_heads=4"),
    ({"algo": "int3"}, "unknown --algo 'int3'"),
    ({"algo": "fp8", "kv_cache": "int8"}, "unknown --kv-cache"),
])
def test_unsupported_combinations_fail_before_writing(tmp_path, src, kw, message):
    out = str(tmp_path / "x.qnemo")
    with pytest.raises(NemoConvertError, match=message.replace("(", r"\(")):
        quantize(src, out, **kw)
    assert os.listdir(tmp_path) == []


def test_quantized_algorithms_need_a_16_bit_dtype(tmp_path):
    src = make_tiny_llama(str(tmp_path / "f32"), dtype=torch.float32, **GEOMETRY)
    with pytest.raises(UnsupportedError, match="float16 or bfloat16"):
        quantize(src, str(tmp_path / "x.qnemo"), algo="int8_wo")
    rep = quantize(src, str(tmp_path / "y.qnemo"), algo="int8_wo", dtype="bf16")
    assert rep.dtype == "bfloat16"
    rep = quantize(src, str(tmp_path / "z.qnemo"), algo="none")
    assert rep.dtype == "float32"


def test_family_without_trtllm_mapping_is_refused(tmp_path, src):
    from nemo_convert_llama.family import LLAMA

    from nemo_convert import hookimpl
    from nemo_convert.plugins.manager import registry_with

    class Plain:
        @hookimpl
        def nemo_convert_model_families(self):
            # its own HF names: two families listing LlamaForCausalLM are a registry error
            return [dataclasses.replace(LLAMA, name="plain-llama", hf_architectures=("PlainLlamaForCausalLM",),
                                        hf_model_types=("plain_llama",), trtllm=None)]

    reg = registry_with(("plain", Plain()))
    with pytest.raises(UnsupportedError, match="'plain-llama' declares no TensorRT-LLM mapping"):
        quantize(src, str(tmp_path / "x.qnemo"), algo="none", family="plain-llama", registry=reg)


def test_existing_output_is_refused_then_overwritten(tmp_path, src):
    out = str(tmp_path / "o.qnemo")
    os.mkdir(out)
    with pytest.raises(OutputExistsError):
        quantize(src, out, algo="none")
    quantize(src, out, algo="none", overwrite=True)
    assert os.path.isfile(os.path.join(out, "rank0.safetensors"))


@pytest.mark.parametrize("where", ["same", "inside"])
def test_output_onto_its_input_is_refused(src, where):
    out = src if where == "same" else os.path.join(src, "q.qnemo")
    before = sorted(os.listdir(src))
    with pytest.raises(NemoConvertError, match="would overwrite or sit inside the input"):
        quantize(src, out, algo="none", overwrite=True)
    assert sorted(os.listdir(src)) == before


def test_cli_error_is_one_line(tmp_path, src, capsys):
    from nemo_convert.cli.main import main

    rc = main(["quantize", src, "-o", str(tmp_path / "x"), "--algo", "int4_wo", "--tp", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "group size 128" in err[0]
