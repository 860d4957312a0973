"""``quantize`` for every GPT-base family whose TensorRT-LLM model is confirmed, table-driven.

The TensorRT-LLM names are derived in the code from the family mapping and one rename
table; here the expected layout is written out by hand from TensorRT-LLM's converters
(``tensorrt_llm/models/llama/convert.py``, ``tensorrt_llm/models/qwen/convert.py``) and
compared with the tiny random models of tests/test_family_matrix.py.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from safetensors import safe_open
from test_family_matrix import make_model
from tiny_models import hf_tensors, write_sentencepiece

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from nemo_convert.hf_config import read_rope
from nemo_convert.qnemo import quantize

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: family → (overrides of the matrix's model, TensorRT-LLM architecture, config fields)
ENABLED: dict[str, tuple[dict, str, dict]] = {
    "llama": (dict(attention_bias=False, mlp_bias=False), "LlamaForCausalLM", {}),
    "mistral": (dict(sliding_window=None), "LlamaForCausalLM", {}),
    "qwen2": (dict(), "Qwen2ForCausalLM", {"qwen_type": "qwen2", "attn_bias": True, "mlp_bias": False}),
    "qwen3": (dict(), "Qwen3ForCausalLM", {"qwen_type": "qwen3", "attn_bias": False, "mlp_bias": False}),
}


def expected(hf: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """TensorRT-LLM name → tensor, written out from TensorRT-LLM's own converters."""
    out = {"transformer.vocab_embedding.weight": hf["model.embed_tokens.weight"],
           "transformer.ln_f.weight": hf["model.norm.weight"],
           "lm_head.weight": hf.get("lm_head.weight", hf["model.embed_tokens.weight"])}
    for i in range(layers):
        h, t = f"model.layers.{i}.", f"transformer.layers.{i}."
        out[t + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[t + "post_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        for s in ("weight", "bias"):
            if h + f"self_attn.q_proj.{s}" in hf:
                out[t + f"attention.qkv.{s}"] = torch.cat([hf[h + f"self_attn.{x}_proj.{s}"] for x in "qkv"])
        out[t + "attention.dense.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[t + "mlp.fc.weight"] = hf[h + "mlp.gate_proj.weight"]      # the activated branch
        out[t + "mlp.gate.weight"] = hf[h + "mlp.up_proj.weight"]
        out[t + "mlp.proj.weight"] = hf[h + "mlp.down_proj.weight"]
        for x in "qk":
            if h + f"self_attn.{x}_norm.weight" in hf:
                out[t + f"attention.{x}_layernorm.weight"] = hf[h + f"self_attn.{x}_norm.weight"]
    return out


def read_rank(folder: str, rank: int) -> dict[str, torch.Tensor]:
    with safe_open(os.path.join(folder, f"rank{rank}.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qfam")
    return {f: make_model(str(root / f), f, **ENABLED[f][0]) for f in ENABLED}


@pytest.mark.parametrize("family", sorted(ENABLED))
def test_none_writes_the_source_under_trtllm_names(tmp_path, models, family):
    src, (_, arch, fields) = models[family], ENABLED[family]
    out = str(tmp_path / "q")
    rep = quantize(src, out, algo="none")
    assert rep.family == family
    hf_cfg = json.load(open(os.path.join(src, "config.json")))
    cfg = json.load(open(os.path.join(out, "config.json")))
    heads = hf_cfg["num_attention_heads"]
    assert cfg["architecture"] == arch and cfg["dtype"] == "float32"
    for k, v in {"vocab_size": hf_cfg["vocab_size"], "hidden_size": hf_cfg["hidden_size"],
                 "num_hidden_layers": hf_cfg["num_hidden_layers"], "num_attention_heads": heads,
                 "num_key_value_heads": hf_cfg["num_key_value_heads"],
                 "head_size": hf_cfg.get("head_dim") or hf_cfg["hidden_size"] // heads,
                 "intermediate_size": hf_cfg["intermediate_size"], "hidden_act": "silu",
                 "max_position_embeddings": hf_cfg["max_position_embeddings"],
                 "norm_epsilon": hf_cfg["rms_norm_eps"], "rotary_base": read_rope(hf_cfg).theta,
                 "rotary_scaling": None, "position_embedding_type": "rope_gpt_neox", **fields}.items():
        assert cfg[k] == v, k
    hf = hf_tensors(src)
    want = expected(hf, hf_cfg["num_hidden_layers"])
    got = read_rank(out, 0)
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_qwen2_int8_wo_tp2_from_a_nemo(tmp_path, models):
    """int8_wo for a new family, from a .nemo, at TP 2: biases split per part like the
    weight, every linear on the int8 grid of its rank's block, within half a step."""
    nemo, out = str(tmp_path / "m.nemo"), str(tmp_path / "q")
    api.import_hf(models["qwen2"], nemo)
    quantize(nemo, out, algo="int8_wo", tp=2, dtype="bf16")
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["quantization"]["quant_algo"] == "W8A16" and cfg["architecture"] == "Qwen2ForCausalLM"
    hf = hf_tensors(models["qwen2"])
    want = expected(hf, 2)
    ranks = [read_rank(out, r) for r in range(2)]
    d, nq, nkv = 16, 4, 2
    for name, w in want.items():
        w = w.to(torch.bfloat16).float()
        column = name.endswith(("qkv.weight", "qkv.bias", "mlp.fc.weight", "mlp.gate.weight"))
        row = name.endswith(("dense.weight", "mlp.proj.weight"))
        if name.endswith(("qkv.weight", "qkv.bias")):
            parts = torch.split(w, [nq * d, nkv * d, nkv * d])
            local = [torch.cat([p.chunk(2)[r] for p in parts]) for r in range(2)]
        elif column:
            local = list(w.chunk(2))
        elif row:
            local = list(w.chunk(2, dim=1))
        elif name.endswith(("vocab_embedding.weight", "lm_head.weight")):
            local = list(w.chunk(2))            # vocabulary 128: no padding at TP 2
        else:
            local = [w, w]
        for r in range(2):
            t = ranks[r][name].float()
            if name.endswith(".weight") and (column or row):
                step = local[r].abs().amax(dim=1, keepdim=True) / 127
                assert bool(((t - local[r]).abs() <= step / 2 * 1.01 + local[r].abs() * 2 ** -7).all()), name
            else:
                assert torch.equal(t, local[r]), name


@pytest.mark.parametrize("family, overrides, message", [
    ("gemma", {}, "model family 'gemma' declares no TensorRT-LLM mapping"),
    ("phi3", {}, "model family 'phi3' declares no TensorRT-LLM mapping"),
    ("mistral", {"sliding_window": 4}, "sliding attention window"),
    ("llama", {}, "linear biases are not written to TensorRT-LLM Llama checkpoints"),
])
def test_unconfirmed_targets_are_refused_by_name(tmp_path, family, overrides, message):
    src = make_model(str(tmp_path / family), family, **overrides)
    out = str(tmp_path / "q")
    with pytest.raises(UnsupportedError, match=message) as ei:
        quantize(src, out, algo="none")
    assert "\n" not in str(ei.value) and not os.path.exists(out)


def test_config_keys_are_translated_as_import_translates_them(tmp_path):
    """The TensorRT-LLM config comes from the NeMo config import would write: a key the
    family does not understand is refused by name, and --ignore-config-key drops it
    knowingly (HF sources only)."""
    from nemo_convert.errors import ConfigError

    src = make_model(str(tmp_path / "mistral"), "mistral")     # sliding_window=4
    with pytest.raises(ConfigError, match="sliding_window=4 is not understood by family llama"):
        quantize(src, str(tmp_path / "a"), algo="none", family="llama")
    rep = quantize(src, str(tmp_path / "b"), algo="none", family="llama", ignore_config_keys=("sliding_window",))
    assert rep.family == "llama"
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, family="llama", ignore_config_keys=("sliding_window",))
    with pytest.raises(UnsupportedError, match="--ignore-config-key applies to a Hugging Face source"):
        quantize(nemo, str(tmp_path / "c"), algo="none", ignore_config_keys=("sliding_window",))
    assert not os.path.exists(str(tmp_path / "a")) and not os.path.exists(str(tmp_path / "c"))


def test_qwen3_fp8_with_kv_cache_calibrates_through_its_own_modules(tmp_path):
    """fp8 and --kv-cache fp8 calibrate with the family's transformers class; the scales sit
    under the derived names, the q/k norms stay exact."""
    src, out = make_model(str(tmp_path / "qwen3"), "qwen3"), str(tmp_path / "q")
    write_sentencepiece(os.path.join(src, "tokenizer.model"), vocab_size=128)
    rep = quantize(src, out, algo="fp8", kv_cache="fp8", tp=2, dtype="bf16",
                   calib_size=2, calib_seq_len=16, calib_batch_size=2)
    assert rep.quant_algo == "FP8" and rep.kv_cache_quant_algo == "FP8"
    hf = hf_tensors(src)
    for r in range(2):
        t = read_rank(out, r)
        for i in range(2):
            p = f"transformer.layers.{i}."
            assert t[p + "attention.kv_cache_scaling_factor"].shape == (1,)
            for lin in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
                assert t[p + lin + ".weight"].dtype == torch.float8_e4m3fn
                assert float(t[p + lin + ".activation_scaling_factor"]) > 0
            for x in "qk":
                assert torch.equal(t[p + f"attention.{x}_layernorm.weight"],
                                   hf[f"model.layers.{i}.self_attn.{x}_norm.weight"].to(torch.bfloat16))


def test_the_target_projects_nemo_tensors_whatever_the_hf_spelling(tmp_path):
    """The target is a projection of NeMo logical tensors, so how the HF side spells them does
    not matter: Phi-3 packs q, k, v into one ``qkv_proj`` and gate, up into one
    ``gate_up_proj``; given the GPT base's target (a test registry: TensorRT-LLM's Phi-3 model
    is not confirmed), its grouped NeMo QKV is written ``[q; k; v]`` — the HF ``qkv_proj`` bit
    for bit — and its fc1 as ``mlp.fc`` / ``mlp.gate``. Only ``--kv-cache fp8`` is refused by
    name: the rule's origin has no separate k and v modules to calibrate."""
    from nemo_convert_phi3.family import PHI3

    from nemo_convert import hookimpl
    from nemo_convert.families.trtllm import LLAMA_FIELDS, gpt_trtllm
    from nemo_convert.plugins.manager import registry_with

    class Phi3Trt:
        @hookimpl
        def nemo_convert_model_families(self):
            # its own HF names: two families listing Phi3ForCausalLM are a registry error
            return [dataclasses.replace(PHI3, name="phi3-trt", hf_architectures=("Phi3TrtForCausalLM",),
                                        hf_model_types=("phi3_trt",),
                                        trtllm=gpt_trtllm("LlamaForCausalLM", LLAMA_FIELDS))]

    reg = registry_with(("phi3-trt", Phi3Trt()))
    src = make_model(str(tmp_path / "phi3"), "phi3", sliding_window=None, partial_rotary_factor=1.0)
    quantize(src, str(tmp_path / "q"), algo="none", family="phi3-trt", registry=reg)
    hf, t = hf_tensors(src), read_rank(str(tmp_path / "q"), 0)
    for i in range(2):
        h, p = f"model.layers.{i}.", f"transformer.layers.{i}."
        assert torch.equal(t[p + "attention.qkv.weight"], hf[h + "self_attn.qkv_proj.weight"])
        gate, up = hf[h + "mlp.gate_up_proj.weight"].chunk(2)
        assert torch.equal(t[p + "mlp.fc.weight"], gate) and torch.equal(t[p + "mlp.gate.weight"], up)
    with pytest.raises(UnsupportedError, match="linear_qkv.weight is not made of separate q, k and v"):
        quantize(src, str(tmp_path / "k"), algo="none", kv_cache="fp8", dtype="bf16", family="phi3-trt",
                 registry=reg)
    assert not os.path.exists(tmp_path / "k")


def test_a_sliding_window_refusal_names_the_way_forward(tmp_path):
    """Issue 20: the refusal said only "a runtime setting there". It now names TensorRT-LLM's
    runtime switch with this model's window (HF sliding_window=4: 4 keys) and the way to
    write the checkpoint without it, and that way works."""
    src = make_model(str(tmp_path / "mistral"), "mistral")     # sliding_window=4
    with pytest.raises(UnsupportedError) as ei:
        quantize(src, str(tmp_path / "a"), algo="none")
    msg = str(ei.value)
    assert "window_size=[3, 0]: each token sees 4 keys" in msg and "--max_attention_window_size=4" in msg
    assert "--ignore-config-key sliding_window" in msg and "nemo-convert export it first" in msg
    rep = quantize(src, str(tmp_path / "b"), algo="none", ignore_config_keys=("sliding_window",))
    assert rep.family == "mistral" and os.path.isfile(tmp_path / "b" / "rank0.safetensors")
