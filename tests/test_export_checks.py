"""Export checks the architecture: a NeMo config whose math the chosen family's HF class
does not compute is refused by name, before anything is written; a NeMo-native config is
given the family that computes it, or an error listing why each family does not.

The NeMo semantics (``families/architecture.py``) are NeMo's and Megatron-Core's: a gated
MLP when ``activation`` ends in ``glu``; ``openai_gelu`` before everything; a GeLU under
``bias_activation_fusion`` (NeMo's default) runs the fused tanh-approximation kernel;
``layernorm1p`` is a zero-centred LayerNorm; ``position_embedding_type`` defaults to
``learned_absolute``."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import yaml

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from nemo_convert.families import mlp_activation, signature
from nemo_convert.plugins.manager import get_registry

TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"


@pytest.mark.parametrize("fields, want", [
    ({"activation": "fast-swiglu"}, (True, "silu")),
    ({"activation": "swiglu"}, (True, "silu")),
    ({"activation": "geglu", "bias_activation_fusion": False}, (True, "gelu")),
    ({"activation": "geglu"}, (True, "gelu_tanh")),  # NeMo's default fusion: Megatron's bias_geglu kernel
    ({"activation": "fast-geglu", "openai_gelu": True, "bias_activation_fusion": False}, (True, "gelu_tanh")),
    ({"activation": "gelu"}, (False, "gelu_tanh")),  # bias_gelu kernel, the 2022 GPT-3 models
    ({"activation": "gelu", "bias_activation_fusion": False}, (False, "gelu")),
    ({}, (False, "gelu_tanh")),  # NeMo's defaults: gelu, fused
    ({"activation": "squared-relu", "bias_activation_fusion": False}, (False, "squared_relu")),
    ({"activation": "fast-reglu"}, (True, "relu")),
    ({"activation": "fast-swiglu", "openai_gelu": True}, (True, "gelu_tanh")),  # openai_gelu wins, as in NeMo
    ({"activation": "quick-geglu"}, (True, "quick_gelu")),
])
def test_what_nemo_computes_for_an_activation(fields, want):
    assert mlp_activation(fields) == want


def test_signature_reads_nemo_defaults():
    sig = signature({"num_layers": 2, "num_attention_heads": 4, "hidden_size": 64})
    assert sig["position_embedding_type"] == "learned_absolute" and sig["normalization"] == "layernorm"
    assert sig["rotary_percentage"] is None and sig["activation"] == (False, "gelu_tanh")
    one_p = signature({"num_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "normalization": "layernorm1p"})
    flag = signature({"num_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "normalization": "layernorm",
                      "layernorm_zero_centered_gamma": True})
    assert one_p == flag and one_p["layernorm_zero_centered_gamma"]


@pytest.fixture(scope="module")
def llama_nemo(tmp_path_factory):
    """A tiny Llama imported, as an unpacked folder (its config is edited per test)."""
    from test_family_matrix import make_model

    root = tmp_path_factory.mktemp("checks")
    src = make_model(str(root / "hf"), "llama", attention_bias=False, mlp_bias=False)
    nemo = str(root / "m")
    api.import_hf(src, nemo, packed=False)
    return nemo


def _edited(base: str, dst: str, native: bool, **fields) -> str:
    """A copy of ``base`` whose config has ``fields`` (None deletes one); ``native``:
    without our record of the source (as NeMo writes it)."""
    shutil.copytree(base, dst)
    path = os.path.join(dst, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    if native:
        for k in ("hf_config", "family", "linear_biases"):
            cfg["nemo_convert"].pop(k, None)
    for k, v in fields.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return dst


def test_a_gated_geglu_rmsnorm_config_is_refused_not_exported_as_silu(tmp_path, llama_nemo):
    """The bug: a gated GeLU config went out as ``hidden_act: silu``. Now refused, with our
    record (family llama) or without it (NeMo's own config), naming the activation."""
    for native in (False, True):
        nemo = _edited(llama_nemo, str(tmp_path / f"geglu{native}"), native, activation="geglu",
                       bias_activation_fusion=False)
        out = str(tmp_path / f"out{native}")
        with pytest.raises(UnsupportedError) as ei:
            api.export_hf(nemo, out, family="llama")
        msg = str(ei.value)
        assert "activation='geglu' (gated GeLU (erf))" in msg and "LlamaForCausalLM computes gated SiLU" in msg, msg
        assert "\n" not in msg and not os.path.exists(out)


@pytest.mark.parametrize("fields, words", [
    (dict(activation="squared-relu"), "activation='squared-relu' (squared ReLU)"),
    (dict(activation="fast-geglu", openai_gelu=True), "activation='fast-geglu' (gated GeLU (tanh approximation))"),
    (dict(openai_gelu=True), "activation='fast-swiglu' (gated GeLU (tanh approximation))"),
    (dict(normalization="layernorm"), "normalization='layernorm'"),
    (dict(normalization="layernorm1p"), "normalization='layernorm1p'"),
    (dict(layernorm_zero_centered_gamma=True), "layernorm_zero_centered_gamma=True"),
    (dict(position_embedding_type="learned_absolute"), "position_embedding_type='learned_absolute'"),
    (dict(position_embedding_type=None), "position_embedding_type='learned_absolute'"),  # NeMo's default
    (dict(rotary_percentage=0.5), "rotary_percentage=0.5"),
    (dict(qkv_bias=True), "linear biases on q/k/v=True, o_proj=False, MLP=False"),
    (dict(qk_layernorm=True), "qk_layernorm=True"),
    (dict(window_size=[3, 0]), "window_size=[3, 0] (a sliding window of 3 keys)"),
    (dict(apply_embedding_scaling=True), "apply_embedding_scaling=True"),
    (dict(softmax_type="learnable"), "softmax_type='learnable'"),
    (dict(glu_linear_offset=1.0), "glu_linear_offset=1.0"),
    (dict(transformer_block_type="post_ln"), "transformer_block_type='post_ln'"),
    (dict(normalize_attention_scores=False), "normalize_attention_scores=False"),
    (dict(headscale=True), "headscale=True"),
    (dict(rotary_interleaved=True), "rotary_interleaved=True"),
    (dict(num_moe_experts=4, moe_router_topk=2), "num_moe_experts=4 with its routing"),
])
def test_each_field_llama_does_not_compute_is_refused_by_name(tmp_path, llama_nemo, fields, words):
    nemo = _edited(llama_nemo, str(tmp_path / "m"), True, **fields)
    out = str(tmp_path / "out")
    with pytest.raises(UnsupportedError) as ei:
        api.export_hf(nemo, out, family="llama")
    assert words in str(ei.value) and "family llama" in str(ei.value), str(ei.value)
    assert not os.path.exists(out)


def test_biases_a_family_cannot_hold_are_refused(tmp_path, llama_nemo):
    """Llama's ``attention_bias`` / ``mlp_bias`` hold every linear's bias (the mapping then
    asks for the tensors); Mistral's class has none."""
    nemo = _edited(llama_nemo, str(tmp_path / "m"), True, bias=True)
    with pytest.raises(UnsupportedError, match="linear biases on q/k/v=True, o_proj=True, MLP=True: "
                                               "MistralForCausalLM computes linear biases on q/k/v=False"):
        api.export_hf(nemo, str(tmp_path / "out"), family="mistral")


def test_the_unedited_config_exports(tmp_path, llama_nemo):
    """The control: the same copy, unedited, exports (native and recorded)."""
    for native in (False, True):
        nemo = _edited(llama_nemo, str(tmp_path / f"m{native}"), native)
        assert api.export_hf(nemo, str(tmp_path / f"out{native}")).family == "llama"


def test_a_config_no_family_computes_lists_every_family_and_why(tmp_path, llama_nemo):
    nemo = _edited(llama_nemo, str(tmp_path / "m"), True, activation="geglu", bias_activation_fusion=False)
    with pytest.raises(UnsupportedError) as ei:
        api.export_hf(nemo, str(tmp_path / "out"))
    msg = str(ei.value)
    assert "no installed model family computes this NeMo config" in msg and "\n" not in msg
    for fam, words in (("llama", "LlamaForCausalLM computes gated SiLU"), ("gemma", "GemmaForCausalLM"),
                       ("nemotron", "NemotronForCausalLM"), ("gpt2", "has no activation_function"),
                       ("phi3", "Phi3ForCausalLM computes gated SiLU")):
        assert f"{fam}: " in msg, (fam, msg)
        assert words in msg.split(f"{fam}: ", 1)[1].split("; ")[0], (fam, msg)


def test_a_family_that_fits_but_is_never_guessed_is_named(tmp_path, llama_nemo):
    """Partial RoPE with Llama's block: only Phi-3's class computes it, and NeMo 1 never
    wrote Phi-3 (``claims=never``): the error says to pass ``--family phi3``, which works."""
    nemo = _edited(llama_nemo, str(tmp_path / "m"), True, rotary_percentage=0.5)
    with pytest.raises(UnsupportedError, match=r"phi3: fits, but is never guessed \(pass --family phi3\)"):
        api.export_hf(nemo, str(tmp_path / "out"))
    assert api.export_hf(nemo, str(tmp_path / "out"), family="phi3").family == "phi3"


def test_the_refusal_keeps_inspect_working(tmp_path, llama_nemo):
    """``inspect`` still reads a config no family computes (family: none)."""
    nemo = _edited(llama_nemo, str(tmp_path / "m"), True, activation="geglu", bias_activation_fusion=False)
    info = api.inspect_checkpoint(nemo)
    assert info["family"] is None and info["num_tensors"] > 0


@pytest.mark.parametrize("config, family", [
    ({"normalization": "layernorm1p", "activation": "squared-relu", "position_embedding_type": "rope",
      "rotary_percentage": 0.5, "bias": False, "bias_activation_fusion": False}, "nemotron"),
    ({"normalization": "layernorm", "activation": "gelu", "position_embedding_type": "learned_absolute",
      "bias": True, "share_embeddings_and_output_weights": True}, "gpt2"),
    ({"normalization": "layernorm", "activation": "gelu", "bias": True,
      "share_embeddings_and_output_weights": True}, "gpt2"),  # no position type: NeMo's learned_absolute
    ({"normalization": "rmsnorm", "activation": "fast-swiglu", "position_embedding_type": "rope", "bias": False},
     "llama"),
])
def test_a_nemo_native_config_gets_the_family_that_computes_it(config, family):
    cfg = {"target": TARGET, "mcore_gpt": True, "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96,
           "num_attention_heads": 4, "max_position_embeddings": 64, "encoder_seq_length": 64, **config}
    assert get_registry().family_for_nemo_config(cfg).name == family


def test_rules_for_conv1d_weights_round_trip_and_match_hf():
    """GPT-2's ``Conv1D``: ``x @ W`` with ``W`` ``[in, out]``. The planner's transposed
    ``PackedQKV`` gives Megatron's grouped ``linear_qkv`` rows, and back."""
    from nemo_convert.mapping import ops
    from nemo_convert.tensors.pieces import materialize

    heads, d, hidden = 4, 8, 32
    w = torch.randn(hidden, 3 * hidden)  # c_attn [H, 3H] = [q | k | v]
    fused = materialize(ops.regroup_qkv_lazy(ops.transpose_2d(w), heads=heads, groups=heads, head_dim=d))
    grouped = fused.view(heads, 3, d, hidden)  # Megatron: per head (group) [q_h; k_h; v_h] rows
    for i in range(3):  # HF: x @ w[:, i*H:(i+1)*H] is q, k, v; head h its columns h*d:(h+1)*d
        assert torch.equal(grouped[:, i], w[:, i * hidden:(i + 1) * hidden].t().reshape(heads, d, hidden))
    x = torch.randn(5, hidden)
    assert torch.allclose(x @ fused.t(), (x @ w).view(5, 3, heads, d).transpose(1, 2).reshape(5, -1), atol=1e-5)
    back = ops.transpose_2d(ops.ungroup_qkv_lazy(fused, heads=heads, groups=heads, head_dim=d))
    assert torch.equal(back, w)
    assert ops.transpose_2d(torch.empty(3, 5, device="meta")).shape == (5, 3)
