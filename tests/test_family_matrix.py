"""Every GPT-base family through one table: tiny random HF model → .nemo (dist and legacy)
→ reshard TP2×PP2 → export, bit-exact tensors, the same config.json and identical
transformers logits; each family's NeMo fields; config strictness and refusals by name."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import yaml
from tiny_models import hf_tensors, randomize_, read_json

from nemo_convert import api
from nemo_convert.errors import ConfigError, InputError, UnsupportedError

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)

#: family → (transformers config class, overrides that exercise the family's features,
#: NeMo fields its import must write, NeMo tensors that must exist)
FAMILIES: dict[str, tuple[str, dict, dict, tuple[str, ...]]] = {
    "llama": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True),
              {"bias": True, "qkv_bias": True, "activation": "fast-swiglu"},
              ("decoder.layers.0.self_attention.linear_qkv.bias", "decoder.layers.1.mlp.linear_fc2.bias")),
    "mistral": ("MistralConfig", dict(sliding_window=4),
                {"window_size": [3, 0], "qkv_bias": False},
                ("output_layer.weight",)),
    "qwen2": ("Qwen2Config", dict(), {"qkv_bias": True, "bias": False},
              ("decoder.layers.0.self_attention.linear_qkv.bias",
               "!decoder.layers.0.self_attention.linear_proj.bias")),
    "qwen3": ("Qwen3Config", dict(head_dim=32), {"qk_layernorm": True, "kv_channels": 32},
              ("decoder.layers.0.self_attention.q_layernorm.weight",
               "decoder.layers.1.self_attention.k_layernorm.weight")),
    "gemma": ("GemmaConfig", dict(head_dim=32),
              {"layernorm_zero_centered_gamma": True, "activation": "geglu", "openai_gelu": True,
               "apply_embedding_scaling": True, "share_embeddings_and_output_weights": True, "kv_channels": 32},
              ("embedding.word_embeddings.weight", "!output_layer.weight")),
    "gemma2": ("Gemma2Config", dict(head_dim=32, sliding_window=4, query_pre_attn_scalar=24,
                                    attn_logit_softcapping=1.5, final_logit_softcapping=3.0),
               {"window_size": [3, 0], "window_attn_skip_freq": [1, 0], "query_pre_attn_scalar": 24,
                "attn_logit_softcapping": 1.5, "final_logit_softcapping": 3.0, "activation": "geglu",
                "openai_gelu": True, "layernorm_zero_centered_gamma": True, "apply_embedding_scaling": True,
                "kv_channels": 32},
               ("decoder.layers.0.self_attention.linear_proj.post_layernorm.weight",
                "decoder.layers.1.mlp.linear_fc2.post_layernorm.weight",
                "decoder.layers.1.mlp.linear_fc1.layer_norm_weight", "!output_layer.weight")),
    # a window on layer 0, the global layer 1 with a linearly scaled RoPE of its own base and
    # the local layer with another (small bases: 12 positions tell them apart)
    "gemma3": ("Gemma3TextConfig", dict(head_dim=32, sliding_window=4, query_pre_attn_scalar=24,
                                        sliding_window_pattern=2, rope_parameters={
                                            "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                               "rope_theta": 1000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}),
               {"window_size": [3, 0], "window_attn_skip_freq": [1, 0], "query_pre_attn_scalar": 24,
                "qk_layernorm": True, "rotary_base": 1000.0, "rotary_base_local": 10.0,
                "seq_len_interpolation_factor": 4.0, "activation": "geglu", "openai_gelu": True,
                "layernorm_zero_centered_gamma": True, "apply_embedding_scaling": True, "kv_channels": 32},
               ("decoder.layers.0.self_attention.q_layernorm.weight",
                "decoder.layers.1.self_attention.k_layernorm.weight",
                "decoder.layers.0.self_attention.linear_proj.post_layernorm.weight",
                "decoder.layers.1.mlp.linear_fc2.post_layernorm.weight", "!output_layer.weight")),
    "phi3": ("Phi3Config", dict(sliding_window=4, partial_rotary_factor=0.5), {"window_size": [3, 0],
             "rotary_percentage": 0.5}, ("decoder.layers.0.mlp.linear_fc1.weight",)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4),
                {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 96, "moe_layer_freq": 1,
                 "moe_router_pre_softmax": False, "window_size": [3, 0]},
                ("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight", "decoder.layers.0.mlp.router.weight",
                 "decoder.layers.0.pre_mlp_layernorm.weight", "!decoder.layers.0.mlp.linear_fc1.weight")),
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=32, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                         norm_topk_prob=True),
                  {"num_moe_experts": 4, "moe_ffn_hidden_size": 48, "moe_router_pre_softmax": False,
                   "qk_layernorm": True, "moe_layer_freq": 1},
                  ("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
                   "decoder.layers.1.self_attention.q_layernorm.weight")),
    "qwen2_moe": ("Qwen2MoeConfig", dict(moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                         shared_expert_intermediate_size=80),
                  {"num_moe_experts": 4, "moe_shared_expert_intermediate_size": 80, "moe_shared_expert_gate": True,
                   "moe_router_pre_softmax": True, "qkv_bias": True},
                  ("decoder.layers.1.mlp.shared_experts.gate_weight",
                   "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
                   "decoder.layers.0.self_attention.linear_qkv.bias")),
    # V2-Lite's shape (no query LoRA) with group-limited routing where Megatron-Core agrees
    # (top-3 of 8 experts from 2 of 4 groups: greedy would often pick from a third) and YaRN
    # exercised (original 8 < the 12 ids)
    "deepseek_v2": ("DeepseekV2Config", dict(num_hidden_layers=4, num_key_value_heads=4, moe_intermediate_size=48,
                                             q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16,
                                             qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                                             num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
                                             topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                             routed_scaling_factor=1.5, rope_parameters={
                                                 "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 8, "mscale": 0.707,
                                                 "mscale_all_dim": 0.707}),
                    {"multi_latent_attention": True, "moe_layer_freq": [0, 1, 1, 1], "kv_channels": 16,
                     "moe_router_score_function": "softmax", "moe_router_pre_softmax": True,
                     "moe_router_topk_scaling_factor": 1.5, "moe_shared_expert_intermediate_size": 96,
                     "q_lora_rank": None, "moe_router_num_groups": 4, "moe_router_group_topk": 2,
                     "moe_router_enable_expert_bias": False, "rope_type": "yarn", "rotary_scaling_factor": 4.0,
                     "mscale": 0.707, "mscale_all_dim": 0.707},
                    ("decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.self_attention.linear_q_proj.weight",
                     "decoder.layers.2.mlp.shared_experts.linear_fc2.weight",
                     "decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.weight",
                     "decoder.layers.1.self_attention.linear_kv_up_proj.layer_norm_weight",
                     "!decoder.layers.1.self_attention.linear_q_down_proj.weight",
                     "!decoder.layers.1.mlp.router.expert_bias", "!decoder.layers.0.mlp.router.weight")),
    "deepseek_v3": ("DeepseekV3Config", dict(num_hidden_layers=4, num_key_value_heads=4, moe_intermediate_size=48,
                                             q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                             v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                                             n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                                             routed_scaling_factor=2.5, rope_scaling=None,
                                             num_nextn_predict_layers=1),  # with the hub's MTP layer: add_mtp_layers
                    {"multi_latent_attention": True, "moe_layer_freq": [0, 1, 1, 1], "kv_channels": 16,
                     "moe_router_score_function": "sigmoid", "moe_router_topk_scaling_factor": 2.5,
                     "moe_shared_expert_intermediate_size": 48, "q_lora_rank": 32, "mtp_num_layers": 1},
                    ("decoder.layers.1.mlp.router.expert_bias", "decoder.layers.0.mlp.linear_fc1.weight",
                     "decoder.layers.2.self_attention.linear_kv_up_proj.layer_norm_weight",
                     "decoder.layers.2.mlp.shared_experts.linear_fc1.weight", "!decoder.layers.0.mlp.router.weight",
                     "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
                     "mtp.layers.0.final_layernorm.weight", "mtp.layers.0.transformer_layer.mlp.router.expert_bias",
                     "mtp.layers.0.transformer_layer.mlp.experts.local_experts.3.linear_fc2.weight",
                     "mtp.layers.0.transformer_layer.self_attention.linear_q_up_proj.layer_norm_weight",
                     "!decoder.layers.4.input_layernorm.weight")),
    "glm4_moe": ("Glm4MoeConfig", dict(head_dim=32, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                                       moe_intermediate_size=48, n_routed_experts=4, num_experts_per_tok=2,
                                       n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                                       routed_scaling_factor=2.5, num_hidden_layers=4,
                                       num_nextn_predict_layers=1),  # with GLM-4.5's MTP layer: add_mtp_layers
                 {"qkv_bias": True, "bias": False, "qk_layernorm": True, "rotary_percentage": 0.5, "kv_channels": 32,
                  "moe_layer_freq": [0, 1, 1, 1], "moe_router_score_function": "sigmoid",
                  "moe_router_enable_expert_bias": True, "moe_router_topk_scaling_factor": 2.5,
                  "moe_shared_expert_intermediate_size": 48, "mtp_num_layers": 1, "moe_router_dtype": "fp32"},
                 ("decoder.layers.0.self_attention.linear_qkv.bias", "!decoder.layers.0.self_attention.linear_proj.bias",
                  "decoder.layers.1.self_attention.q_layernorm.weight", "decoder.layers.0.mlp.linear_fc1.weight",
                  "decoder.layers.2.mlp.router.expert_bias", "decoder.layers.1.mlp.shared_experts.linear_fc1.weight",
                  "!decoder.layers.0.mlp.router.weight", "mtp.layers.0.eh_proj.weight",
                  "mtp.layers.0.transformer_layer.self_attention.linear_qkv.bias",
                  "mtp.layers.0.transformer_layer.self_attention.k_layernorm.weight",
                  "mtp.layers.0.transformer_layer.mlp.router.expert_bias", "mtp.layers.0.final_layernorm.weight")),
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                                     swiglu_limit=0.5,
                                     rope_parameters={"rope_type": "default", "rope_theta": 150000.0}),
                {"softmax_type": "learnable", "window_size": [7, 0], "window_attn_skip_freq": [1, 0], "bias": True,
                 "activation_func_clamp_value": 0.5, "glu_linear_offset": 1.0, "expert_tensor_parallel_size": 1},
                ("decoder.layers.0.self_attention.core_attention.softmax_offset", "decoder.layers.1.mlp.router.bias",
                 "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.bias",
                 "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.bias",
                 "decoder.layers.0.self_attention.linear_proj.bias")),
    "nemotron": ("NemotronConfig", dict(head_dim=32, attention_bias=True, mlp_bias=True),
                 {"normalization": "layernorm1p", "layernorm_zero_centered_gamma": True, "activation": "squared-relu",
                  "rotary_percentage": 0.5, "bias": True, "kv_channels": 32, "num_query_groups": 2},
                 ("decoder.layers.0.self_attention.linear_qkv.layer_norm_bias", "decoder.layers.1.mlp.linear_fc1.bias",
                  "decoder.layers.0.mlp.linear_fc1.layer_norm_bias", "decoder.final_layernorm.bias",
                  "output_layer.weight")),
    "gpt2": ("GPT2Config", dict(),
             {"position_embedding_type": "learned_absolute", "normalization": "layernorm", "bias": True,
              "activation": "gelu", "openai_gelu": True, "bias_activation_fusion": False,
              "share_embeddings_and_output_weights": True, "ffn_hidden_size": 96},
             ("embedding.position_embeddings.weight", "decoder.layers.0.self_attention.linear_qkv.bias",
              "decoder.layers.1.mlp.linear_fc2.bias", "decoder.final_layernorm.bias", "!output_layer.weight")),
}
#: GPT-2's config names the same sizes its own way (and has no GQA).
BASE_OF = {"gpt2": dict(n_embd=64, n_inner=96, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=1,
                        eos_token_id=2, pad_token_id=0)}
MOE = ("mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "glm4_moe")
IDS = torch.tensor([[1, 5, 9, 33, 2, 77, 100, 3, 17, 64, 8, 120]])  # longer than the windows


def add_mtp_layers(folder: str, seed: int = 3) -> None:
    """Add the multi-token-prediction layers ``config.json`` announces
    (``num_nextn_predict_layers``), as DeepSeek-V3's hub files store them after the ``L``
    decoder layers (README_WEIGHTS.md of deepseek-ai/DeepSeek-V3): ``model.layers.{L+k}.``
    ``enorm``, ``hnorm``, ``eh_proj`` ``[H, 2H]``, a decoder layer like the last one (random
    values), ``shared_head.norm``, and copies of ``embed_tokens`` and ``lm_head``
    (``shared_head.head``). transformers saves none of them (its model has no MTP layer)."""
    from safetensors.torch import load_file, save_file

    cfg = read_json(os.path.join(folder, "config.json"))
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    g = torch.Generator().manual_seed(seed)
    last = f"model.layers.{layers - 1}."
    for k in range(int(cfg.get("num_nextn_predict_layers") or 0)):
        mtp = f"model.layers.{layers + k}."
        new = {mtp + n[len(last):]: v for n, v in tensors.items() if n.startswith(last)}
        new.update({mtp + "enorm.weight": tensors["model.norm.weight"], mtp + "hnorm.weight": tensors["model.norm.weight"],
                    mtp + "shared_head.norm.weight": tensors["model.norm.weight"],
                    mtp + "eh_proj.weight": tensors["model.norm.weight"].new_empty(hidden, 2 * hidden)})
        for n, v in new.items():
            scale = 0.5 if n.endswith("e_score_correction_bias") else 0.2
            tensors[n] = (torch.randn(v.shape, generator=g) * scale).to(v.dtype)
        tensors[mtp + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors[mtp + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})


def make_model(folder: str, family: str, mtp_weights: bool = True, **overrides) -> str:
    """A random HF model of ``family`` (every parameter, norms and biases too), saved; with
    the MTP layers its config announces unless ``mtp_weights=False`` (as transformers saves it)."""
    import transformers

    cls_name, extra, _, _ = FAMILIES[family]
    cfg = getattr(transformers, cls_name)(**{**BASE_OF.get(family, BASE), **extra, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    randomize_(model, seed=sum(map(ord, family)))  # deterministic (str hash is salted per process)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # DeepSeek-V3's router score correction is a buffer: random too, so that it matters
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    if mtp_weights and getattr(cfg, "num_nextn_predict_layers", 0):
        add_mtp_layers(folder)
    return folder


def logits(folder: str, ids: torch.Tensor = IDS) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        # fresh (aligned) memory: a tensor memory-mapped at an 8-byte offset of its
        # safetensors file takes another CPU kernel path (DeepSeek-V2's fused experts:
        # grouped_mm differs by ~4e-7); the logits must depend on the values only
        for p in model.parameters():
            p.data = p.data.clone()
        return model(ids).logits


def assert_same(src: str, back: str) -> None:
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(b) <= set(a) and set(a) - set(b) <= {"lm_head.weight"}, set(a) ^ set(b)
    for k in b:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert read_json(os.path.join(src, "config.json")) == read_json(os.path.join(back, "config.json"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One saved model per family (module scope: built once)."""
    root = tmp_path_factory.mktemp("families")
    return {f: make_model(str(root / f), f) for f in FAMILIES}


@pytest.mark.parametrize("layout", ["dist", "legacy"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_roundtrip_bit_exact(tmp_path, models, family, layout):
    src = models[family]
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo, layout=layout)
    assert rep.family == family
    api.export_hf(nemo, back)
    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_reshard_tp2_pp2_and_back(tmp_path, models, family):
    src = models[family]
    nemo, ranks, back = str(tmp_path / "m.nemo"), str(tmp_path / "r.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo)
    api.reshard(nemo, ranks, tp=2, pp=2, layout="legacy")
    api.export_hf(ranks, back)
    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_nemo_fields_and_tensors(tmp_path, models, family):
    nemo = str(tmp_path / "m")
    api.import_hf(models[family], nemo, packed=False)
    cfg = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    _, _, fields, tensors = FAMILIES[family]
    for k, v in fields.items():
        assert cfg.get(k) == v, (k, cfg.get(k))
    assert cfg["target"].endswith("MegatronGPTModel")
    names = {t["name"] for t in api.inspect_checkpoint(nemo)["tensors"]}
    for t in tensors:
        assert (t[1:] not in names) if t.startswith("!") else (t in names), (t, sorted(names))


# -- strict config ---------------------------------------------------------------------------

def test_a_key_the_family_does_not_understand_fails_by_name(tmp_path, models):
    out = str(tmp_path / "m.nemo")
    with pytest.raises(ConfigError) as ei:
        api.import_hf(models["mistral"], out, family="llama")
    msg = str(ei.value)
    assert "sliding_window=4 is not understood by family llama" in msg and "\n" not in msg
    assert not os.path.exists(out)


def test_ignore_config_key_is_explicit_and_recorded(tmp_path, models):
    out = str(tmp_path / "m")
    api.import_hf(models["mistral"], out, family="llama", ignore_config_keys=("sliding_window",), packed=False)
    cfg = yaml.safe_load(open(os.path.join(out, "model_config.yaml")))
    assert cfg["nemo_convert"]["ignored_config_keys"] == {"sliding_window": 4}
    assert "window_size" not in cfg
    with pytest.raises(ConfigError, match="no key 'nope'"):
        api.import_hf(models["mistral"], str(tmp_path / "x.nemo"), ignore_config_keys=("nope",))


@pytest.mark.parametrize("family, changes, words", [
    ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), "use_sliding_window=True"),
    ("qwen3", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types="),
    ("phi3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                   "long_factor": [1.0] * 8}), "'longrope'"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}), "'yarn'"),
    ("mistral", dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "'dynamic'"),
    ("gemma", dict(hidden_act="relu"), "hidden_act='relu'"),
    ("gemma", dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    ("gemma2", dict(hidden_act="relu"), "hidden_act='relu' differs from hidden_activation='gelu_pytorch_tanh'"),
    ("gemma2", dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    ("gemma2", dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types entries ['chunked_attention']"),
    ("gemma2", dict(attn_logit_softcapping=-1.0), "attn_logit_softcapping=-1.0 is not a positive soft-cap"),
    ("gemma2", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
    ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
    ("gemma3", dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}),
     "rope type 'yarn' on the global layers"),
    ("gemma3", dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                     "sliding_attention": {"rope_type": "linear", "rope_theta": 10.0, "factor": 2.0}}),
     "sliding_attention RoPE"),
    ("gemma3", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}), "is not one block per layer kind"),
    ("gemma3", dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types entries ['chunked_attention']"),
    ("gemma3", dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    ("gemma3", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0: Gemma3ForCausalLM reads it but never"),
    ("gemma3", dict(final_logit_softcapping=-1.0), "final_logit_softcapping=-1.0 is not a positive soft-cap"),
    ("qwen2", dict(use_mrope=True), "use_mrope=True"),
    ("gpt_oss", dict(initial_context_length=8192, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 4096}),
     "initial_context_length=8192 differs from the YaRN original_max_position_embeddings=4096"),
    ("gpt_oss", dict(experts_per_token=3), "experts_per_token=3 differs from num_experts_per_tok=2"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("qwen2", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor=0.5"),
    ("qwen2_moe", dict(qkv_bias=False), "qkv_bias=False"),
    ("qwen3_moe", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), "use_sliding_window=True"),
    ("mixtral", dict(num_local_experts=0), "num_local_experts=0"),
    ("qwen3_moe", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "'yarn'"),
    ("deepseek_v2", dict(norm_topk_prob=True), "norm_topk_prob=True"),
    ("deepseek_v2", dict(scoring_func="sigmoid"), "scoring_func='sigmoid'"),
    ("deepseek_v2", dict(moe_layer_freq=2), "moe_layer_freq=2"),
    ("deepseek_v2", dict(topk_method="noaux_tc"), "topk_method='noaux_tc'"),
    ("deepseek_v2", dict(num_experts_per_tok=4), "num_experts_per_tok=4, topk_group=2: transformers scores a group"),
    ("deepseek_v2", dict(num_key_value_heads=2), "num_key_value_heads=2"),
    ("deepseek_v2", dict(qk_head_dim=16), "qk_head_dim=16"),
    ("deepseek_v2", dict(mlp_bias=True), "mlp_bias=True"),
    ("deepseek_v2", dict(rope_interleave=True), "rope_interleave=True"),
    ("deepseek_v3", dict(norm_topk_prob=False), "norm_topk_prob=False"),
    ("deepseek_v3", dict(rope_interleave=False), "rope_interleave=False"),
    ("deepseek_v3", dict(scoring_func="softmax"), "scoring_func='softmax'"),
    ("deepseek_v3", dict(num_key_value_heads=2), "num_key_value_heads=2"),
    ("gpt_oss", dict(swiglu_alpha=1.5), "swiglu_alpha=1.5"),
    ("glm4_moe", dict(norm_topk_prob=False), "norm_topk_prob=False"),
    ("glm4_moe", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                       "partial_rotary_factor": 0.5}), "'yarn'"),
    ("glm4_moe", dict(first_k_dense_replace=4), "num_nextn_predict_layers=1 with first_k_dense_replace=4"),
    ("glm4_moe", dict(scoring_func="softmax"), "scoring_func='softmax'"),
    ("gpt_oss", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 150000.0, "factor": 32.0}), "'dynamic'"),
    ("gpt_oss", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "attention_factor": 1.0}),
     "attention_factor=1.0"),
    ("deepseek_v3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "truncate": False}),
     "truncate=False"),
    ("deepseek_v3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                          "mscale_all_dim": 1.0}), "mscale_all_dim=1.0 and mscale=None"),
    ("deepseek_v3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "yarn without a factor"),
    ("phi3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                                   "long_factor": [1.0] * 8}), "Megatron-Core has no LongRoPE"),
    ("gpt_oss", dict(attention_bias=False), "attention_bias=False"),
    ("gpt_oss", dict(quantization_config={"quant_method": "mxfp4"}), "quant_method='mxfp4', but no tensor"),
    ("gpt_oss", dict(quantization_config={"quant_method": "bitsandbytes"}), "quant_method='bitsandbytes'"),
])
def test_unrepresentable_features_are_refused_by_name(tmp_path, models, family, changes, words):
    src = str(tmp_path / "src")
    os.makedirs(src)
    for name in os.listdir(models[family]):
        os.symlink(os.path.join(models[family], name), os.path.join(src, name))
    cfg = read_json(os.path.join(models[family], "config.json"))
    cfg.update(changes)
    os.unlink(os.path.join(src, "config.json"))
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises((UnsupportedError, ConfigError)) as ei:
        api.import_hf(src, str(tmp_path / "m.nemo"), family=family)
    assert words in str(ei.value) and "\n" not in str(ei.value)


def test_v4_spelling_imports_alike_and_is_restored(tmp_path, models):
    """``rope_theta`` + ``rope_scaling`` + ``torch_dtype`` (v4) translate like v5's
    ``rope_parameters`` + ``dtype``, and export writes the spelling it was given."""
    v5 = read_json(os.path.join(models["mistral"], "config.json"))
    src = str(tmp_path / "v4")
    os.makedirs(src)
    for name in os.listdir(models["mistral"]):
        if name != "config.json":
            os.symlink(os.path.join(models["mistral"], name), os.path.join(src, name))
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "dtype")}
    v4.update(rope_theta=v5["rope_parameters"]["rope_theta"], rope_scaling=None, torch_dtype="float32")
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(v4, f)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    api.import_hf(models["mistral"], a, packed=False)
    api.import_hf(src, b, packed=False)
    ca, cb = (yaml.safe_load(open(os.path.join(p, "model_config.yaml"))) for p in (a, b))
    ca.pop("nemo_convert"), cb.pop("nemo_convert")
    assert ca == cb
    back = str(tmp_path / "back")
    api.export_hf(b, back)
    assert read_json(os.path.join(back, "config.json")) == v4
    assert torch.equal(logits(models["mistral"]), logits(back))


def test_gemma_nemo1_norms_with_plus_one_are_read(tmp_path, models):
    """A NeMo 1 Gemma ``.nemo`` stores ``1 + w`` and has no zero-centred flag: export
    subtracts 1 (within rounding: ``(w + 1) - 1`` is not always ``w``)."""
    src = models["gemma"]
    plus = str(tmp_path / "plus")
    from safetensors.torch import save_file

    tensors = hf_tensors(src)
    shifted = {k: (v + 1.0 if "norm" in k else v).contiguous() for k, v in tensors.items()}
    os.makedirs(plus)
    save_file(shifted, os.path.join(plus, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(plus, "config.json"), "w") as f:
        json.dump(read_json(os.path.join(src, "config.json")), f)
    nemo = str(tmp_path / "m")
    api.import_hf(plus, nemo, packed=False)
    path = os.path.join(nemo, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    del cfg["layernorm_zero_centered_gamma"]  # what NeMo 1's converter wrote: no flag, …
    del cfg["nemo_convert"]["family"], cfg["nemo_convert"]["hf_config"]  # … and no record of ours
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    back = str(tmp_path / "back")
    assert api.export_hf(nemo, back).family == "gemma"  # recognised by apply_embedding_scaling
    out = hf_tensors(back)
    for k, v in tensors.items():
        if k in out:
            assert torch.allclose(out[k], v, atol=1e-6, rtol=0), k
    assert torch.allclose(logits(src), logits(back), atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_verify_source_against_its_nemo(tmp_path, models, family):
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(models[family], nemo)
    assert api.verify(models[family], nemo).ok


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_nemo_native_config_is_synthesised(tmp_path, models, family):
    """A ``.nemo`` without our record of the source config (as NeMo writes it): export
    synthesises a ``config.json`` that transformers loads into the same model."""
    src = models[family]
    nemo = str(tmp_path / "m")
    api.import_hf(src, nemo, packed=False)
    path = os.path.join(nemo, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    del cfg["nemo_convert"]["hf_config"], cfg["nemo_convert"]["family"]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    back = str(tmp_path / "back")
    if family == "phi3":
        # A NeMo config cannot tell Phi-3 (NeMo 2 only) from Mistral; this one's partial
        # rotary is not Mistral's, so guessing refuses and --family decides.
        with pytest.raises(UnsupportedError, match="rotary_percentage=0.5"):
            api.export_hf(nemo, str(tmp_path / "guess"))
        rep = api.export_hf(nemo, back, family="phi3")
    else:
        rep = api.export_hf(nemo, back)  # the family is recognised from NeMo's fields
    assert rep.family == family
    out = read_json(os.path.join(back, "config.json"))
    want = read_json(os.path.join(src, "config.json"))
    assert out["architectures"] == want["architectures"] and out["model_type"] == want["model_type"]
    assert ("rope_theta" in out or family == "gpt2") and "torch_dtype" in out  # the spelling v4 reads and v5 accepts
    if family == "phi3":  # Phi3Config's default pad_token_id=32000 lies outside the tiny vocabulary
        out["pad_token_id"] = None
        with open(os.path.join(back, "config.json"), "w") as f:
            json.dump(out, f)
    assert torch.equal(logits(src), logits(back))


def test_nemo_written_mistral_window_is_read_as_nemo_wrote_it(tmp_path, models):
    """NeMo's importer writes ``window_size=[W, 0]`` and no record of ours: export gives W."""
    nemo = str(tmp_path / "m")
    api.import_hf(models["mistral"], nemo, packed=False)
    path = os.path.join(nemo, "model_config.yaml")
    cfg = yaml.safe_load(open(path))
    del cfg["nemo_convert"]["hf_config"], cfg["nemo_convert"]["sliding_window"]
    cfg["window_size"] = [4, 0]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    assert read_json(os.path.join(back, "config.json"))["sliding_window"] == 4


# -- every family is strict, the multimodal ones per section ----------------------------------

@pytest.mark.parametrize("maker, section, key", [
    ("make_tiny_clip", None, "vision_embed_dim"),
    ("make_tiny_clip", "vision_config", "use_new_patching"),
    ("make_tiny_llava", None, "image_grid_pinpoints"),
    ("make_tiny_llava", "vision_config", "layer_types"),
    ("make_tiny_llava", "text_config", "sliding_window"),
])
def test_multimodal_families_refuse_unknown_keys_per_section(tmp_path, maker, section, key):
    import tiny_multimodal

    src = getattr(tiny_multimodal, maker)(str(tmp_path / "src"))
    path = os.path.join(src, "config.json")
    cfg = read_json(path)
    (cfg[section] if section else cfg)[key] = 7
    with open(path, "w") as f:
        json.dump(cfg, f)
    name = f"{section}.{key}" if section and section != "text_config" else key  # text_config: Llama's table
    with pytest.raises(ConfigError, match=f"{name}=7 is not understood by family"):
        api.import_hf(src, str(tmp_path / "m.nemo"))
    dotted = f"{section}.{key}" if section else key
    out = str(tmp_path / "ok")
    api.import_hf(src, out, packed=False, ignore_config_keys=(dotted,))
    recorded = yaml.safe_load(open(os.path.join(out, "model_config.yaml")))["nemo_convert"]
    assert recorded["ignored_config_keys"] == {dotted: 7}
    assert (recorded["hf_config"][section] if section else recorded["hf_config"])[key] == 7  # still restored


def test_cli_names_the_key_and_ignores_it_when_asked(tmp_path, models, cli):
    out = str(tmp_path / "m.nemo")
    code, _, err = cli("import", models["mistral"], "-o", out, "--family", "llama")
    assert code == 2 and "sliding_window=4 is not understood by family llama" in err and not os.path.exists(out)
    code, _, err = cli("import", models["mistral"], "-o", out, "--family", "llama",
                       "--ignore-config-key", "sliding_window")
    assert code == 0, err
    with api.open_checkpoint(out) as ck:
        assert ck.config["nemo_convert"]["ignored_config_keys"] == {"sliding_window": 4}


# -- mixture of experts: expert parallelism, mixed stacks --------------------------------------

@pytest.mark.parametrize("family", MOE)
def test_moe_reshard_tp2_pp2_ep2_and_back(tmp_path, models, family):
    """Dist at TP2×PP2×EP2 holds the same global experts (EP is recorded, not split):
    export from it gathers every expert, bit-exact."""
    src = models[family]
    nemo, ranks, back = str(tmp_path / "m.nemo"), str(tmp_path / "r"), str(tmp_path / "back")
    api.import_hf(src, nemo, layout="legacy")
    api.reshard(nemo, ranks, tp=2, pp=2, ep=2, layout="dist", packed=False)
    cfg = yaml.safe_load(open(os.path.join(ranks, "model_config.yaml")))
    assert (cfg["expert_model_parallel_size"], cfg["tensor_model_parallel_size"]) == (2, 2)
    api.export_hf(ranks, back)
    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))


@pytest.mark.parametrize("ep, layout, words", [
    (3, "dist", "expert-parallel size 3 does not divide num_moe_experts=4"),
    (2, "legacy", "the legacy layout has no expert-parallel rank folders"),
    (0, "dist", "expert-parallel size must be ≥ 1"),
])
def test_moe_expert_parallel_geometry_is_refused_before_writing(tmp_path, models, ep, layout, words):
    out = str(tmp_path / "m.nemo")
    with pytest.raises(UnsupportedError) as ei:
        api.import_hf(models["mixtral"], out, layout=layout, parallel=api.Parallelism(1, 1, None, ep))
    assert words in str(ei.value) and "\n" not in str(ei.value)
    assert not os.path.exists(out)


def test_expert_parallel_on_a_dense_model_is_refused(tmp_path, models):
    with pytest.raises(UnsupportedError, match="without experts"):
        api.import_hf(models["llama"], str(tmp_path / "m.nemo"), parallel=api.Parallelism(1, 1, None, 2))


def test_cli_ep_flag(tmp_path, models, cli):
    out = str(tmp_path / "m")
    code, _, err = cli("import", models["qwen3_moe"], "-o", out, "--ep", "2", "--unpacked")
    assert code == 0, err
    assert yaml.safe_load(open(os.path.join(out, "model_config.yaml")))["expert_model_parallel_size"] == 2
    code, _, err = cli("reshard", out, "-o", str(tmp_path / "r.nemo"), "--ep", "3")
    assert code != 0 and "does not divide num_moe_experts=4" in err


@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_qwen3_moe_mixed_stack(tmp_path, layout):
    """``mlp_only_layers`` makes a mixed dense/MoE stack: ``moe_layer_freq`` a list, the
    dist keys per layer (Megatron-Core's non-homogeneous layers, experts ``[E, …]``, extra
    states ``shard_<e>_<E>`` and ``shard_0_1``); the round trip is bit-exact at TP2×PP2."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    src = make_model(str(tmp_path / "hf"), "qwen3_moe", num_hidden_layers=4, mlp_only_layers=[1])
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    api.import_hf(src, nemo, layout=layout, packed=False)
    cfg = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    assert cfg["moe_layer_freq"] == [1, 0, 1, 1]
    if layout == "dist":
        ck = DistCheckpointSource.from_dir(os.path.join(nemo, "model_weights"))
        raw = set(ck.raw_keys())
        assert "model.decoder.layers.1.mlp.linear_fc1.weight" in raw
        assert ck.info("model.decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight").shape == (96, 64)
        assert ck._raw["model.decoder.layers.2.mlp.experts.experts.linear_fc1.weight"][0] == (4, 96, 64)
        assert "model.decoder.layers.2.mlp.experts.experts.linear_fc2._extra_state/shard_3_4" in ck.extra_state_keys
        assert "model.decoder.layers.1.mlp.linear_fc1._extra_state/shard_0_1" in ck.extra_state_keys
        ck.close()
    ranks = str(tmp_path / "r.nemo")
    api.reshard(nemo, ranks, tp=2, pp=2, layout="legacy")
    api.export_hf(ranks, back)
    assert_same(src, back)
    assert torch.equal(logits(src), logits(back))


def test_moe_stacked_dist_keys_and_extra_states(tmp_path, models):
    """Every layer MoE: experts stacked ``[L, E, …]`` with ``shard_<i>.<e>_<L>.<E>`` extra states."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource

    nemo = str(tmp_path / "m")
    api.import_hf(models["mixtral"], nemo, packed=False)
    ck = DistCheckpointSource.from_dir(os.path.join(nemo, "model_weights"))
    assert ck._raw["model.decoder.layers.mlp.experts.experts.linear_fc1.weight"][0] == (2, 4, 192, 64)
    assert ck._raw["model.decoder.layers.mlp.experts.experts.linear_fc2.weight"][0] == (2, 4, 64, 96)
    assert ck._raw["model.decoder.layers.mlp.router.weight"][0] == (2, 4, 64)
    extra = set(ck.extra_state_keys)
    assert {f"model.decoder.layers.mlp.experts.experts.linear_fc{k}._extra_state/shard_{i}.{e}_2.4"
            for k in (1, 2) for i in range(2) for e in range(4)} <= extra
    assert not any("router" in k for k in extra)
    ck.close()


def _fused_mtp_layers(src: str, config) -> dict:
    """The source's MTP layers (which transformers does not load) with their experts fused
    as transformers fuses a decoder layer's: ``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]`` per expert, ``down_proj`` ``[E, H, I]``."""
    tensors = hf_tensors(src)
    out = {}
    for k in range(getattr(config, "num_nextn_predict_layers", 0) or 0):
        mtp = f"model.layers.{config.num_hidden_layers + k}."
        layer = {n: v for n, v in tensors.items() if n.startswith(mtp)}
        experts = mtp + "mlp.experts."
        count = len({n[len(experts):].split(".")[0] for n in layer if n.startswith(experts)})
        out.update({n: v for n, v in layer.items() if not n.startswith(experts)})
        if count:
            out[experts + "gate_up_proj"] = torch.stack([torch.cat([layer[f"{experts}{e}.gate_proj.weight"],
                                                                    layer[f"{experts}{e}.up_proj.weight"]])
                                                         for e in range(count)])
            out[experts + "down_proj"] = torch.stack([layer[f"{experts}{e}.down_proj.weight"] for e in range(count)])
    return out


def _fused_copy(src: str, dst: str) -> str:
    """``src`` saved in transformers v5's in-memory layout: every layer's experts fused
    (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj`` ``[E, H, I]``)."""
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    os.makedirs(dst)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
             or not model.config.tie_word_embeddings}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    state.update(_fused_mtp_layers(src, model.config))
    save_file(state, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), dst)
    return dst


@pytest.mark.parametrize("family", [f for f in MOE if f != "gpt_oss"])  # GPT-OSS has only the fused layout
@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_moe_fused_hf_experts_import_alike_and_export_fused(tmp_path, models, family, layout):
    """A fused-experts HF checkpoint imports to the same NeMo tensors as the per-expert
    one (verify passes against both) and exports fused again, bit-exact, at TP2 too."""
    src = models[family]
    fused = _fused_copy(src, str(tmp_path / "fused"))
    assert torch.equal(logits(src), logits(fused))
    a, b = str(tmp_path / "a.nemo"), str(tmp_path / "b.nemo")
    api.import_hf(src, a, layout=layout)
    api.import_hf(fused, b, layout=layout)
    assert api.verify(fused, b).ok
    with api.open_checkpoint(a) as ca, api.open_checkpoint(b) as cb:  # the same NeMo tensors
        assert ca.config["nemo_convert"].get("hf_experts") is None
        assert cb.config["nemo_convert"]["hf_experts"] == "fused"
        assert sorted(ca.source.keys()) == sorted(cb.source.keys())
        for k in ca.source.keys():
            assert torch.equal(ca.source.load(k), cb.source.load(k)), k
    ranks, back = str(tmp_path / "r.nemo"), str(tmp_path / "back")
    api.reshard(b, ranks, tp=2, layout="legacy")
    api.export_hf(ranks, back)
    assert_same(fused, back)
    assert torch.equal(logits(src), logits(back))


@pytest.mark.slow
def test_mtp_layers_without_the_embedding_and_head_copies(tmp_path, models):
    """GLM-4.6's files store the MTP layer without the copies of ``embed_tokens`` and
    ``shared_head.head`` that GLM-4.5's (and DeepSeek-V3's) hold: the import records that,
    keeps the MTP block, and the export writes the layer back without them, bit-exactly."""
    from safetensors.torch import load_file, save_file

    src = str(tmp_path / "src")
    shutil.copytree(models["glm4_moe"], src)
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    layers = read_json(os.path.join(src, "config.json"))["num_hidden_layers"]
    for name in ("embed_tokens.weight", "shared_head.head.weight"):
        del tensors[f"model.layers.{layers}.{name}"]
    save_file(tensors, path, metadata={"format": "pt"})
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    api.import_hf(src, nemo, packed=False)
    cfg = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    assert cfg["mtp_num_layers"] == 1 and cfg["nemo_convert"]["hf_mtp_copies"] is False
    names = {t["name"] for t in api.inspect_checkpoint(nemo)["tensors"]}
    assert "mtp.layers.0.eh_proj.weight" in names
    api.export_hf(nemo, back)
    assert_same(src, back)
    assert f"model.layers.{layers}.embed_tokens.weight" not in hf_tensors(back)


def test_deepseek_v3_fp8_block_scaled_weights_are_dequantized(tmp_path, models):
    """DeepSeek-V3's hub layout: linear weights in float8_e4m3fn with float32
    ``weight_scale_inv`` per 16×16 block here (128×128 on the hub; edge blocks partial) and a
    ``quantization_config``. The import dequantizes them (fp32 product, cast to the
    config's bf16) one tensor at a time; export writes the plain bf16 model, equal to the
    same dequantization done here by hand, block by block."""
    from safetensors.torch import save_file

    src = models["deepseek_v3"]
    tensors = hf_tensors(src)
    cfg = read_json(os.path.join(src, "config.json"))
    b = 16
    fp8, plain = {}, {}
    for k, w in tensors.items():
        w = w.to(torch.bfloat16)
        if k.endswith("proj.weight") or k.endswith("proj_with_mqa.weight"):
            rows, cols = w.shape
            scale = torch.empty(-(-rows // b), -(-cols // b))
            q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
            ref = torch.empty(w.shape, dtype=torch.bfloat16)
            for i in range(scale.shape[0]):
                for j in range(scale.shape[1]):
                    blk = w[i * b:(i + 1) * b, j * b:(j + 1) * b].float()
                    scale[i, j] = blk.abs().max().clamp(min=1e-12) / 448.0
                    q[i * b:(i + 1) * b, j * b:(j + 1) * b] = (blk / scale[i, j]).to(torch.float8_e4m3fn)
                    ref[i * b:(i + 1) * b, j * b:(j + 1) * b] = (
                        q[i * b:(i + 1) * b, j * b:(j + 1) * b].float() * scale[i, j]).to(torch.bfloat16)
            fp8[k], fp8[k + "_scale_inv"], plain[k] = q, scale, ref
        else:
            fp8[k] = plain[k] = w.contiguous()
    quant, ref_dir = str(tmp_path / "fp8"), str(tmp_path / "ref")
    for folder, weights, extra in ((quant, fp8, {"quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [b, b]}}),
                                   (ref_dir, plain, {})):
        os.makedirs(folder)
        save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({**cfg, "dtype": "bfloat16", **extra}, f)
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    rep = api.import_hf(quant, nemo)
    n = sum(k.endswith("_scale_inv") for k in fp8)
    assert any(f"dequantized {n} fp8 tensors (16×16 blocks) to torch.bfloat16" in x for x in rep.notes), rep.notes
    api.export_hf(nemo, back)
    assert_same(ref_dir, back)
    assert torch.equal(logits(ref_dir), logits(back))
    bad = str(tmp_path / "bad")
    os.makedirs(bad)
    os.symlink(os.path.join(quant, "model.safetensors"), os.path.join(bad, "model.safetensors"))
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump({**cfg, "quantization_config": {"quant_method": "mxfp4"}}, f)
    with pytest.raises(UnsupportedError, match="quant_method='mxfp4'"):
        api.import_hf(bad, str(tmp_path / "x.nemo"))


# -- multi-token prediction (DeepSeek-V3) ------------------------------------------------------

@pytest.mark.slow
def test_deepseek_v3_config_without_q_lora_rank_has_the_query_lora(tmp_path):
    """A DeepSeek-V3 ``config.json`` without ``q_lora_rank`` is ``DeepseekV3Config``'s 1536:
    transformers builds ``q_a_proj`` / ``q_b_proj`` for it, and so does the import (before, it
    read no query LoRA and refused the checkpoint's ``q_a_proj``); export gives back the config
    without the key and every tensor bit for bit."""
    src = make_model(str(tmp_path / "hf"), "deepseek_v3", mtp_weights=False, q_lora_rank=1536,
                     num_nextn_predict_layers=0)
    cfg = read_json(os.path.join(src, "config.json"))
    del cfg["q_lora_rank"]
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)
    assert "model.layers.0.self_attn.q_a_proj.weight" in hf_tensors(src)
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    api.import_hf(src, nemo, packed=False)
    with api.open_checkpoint(nemo) as ck:
        assert ck.config["q_lora_rank"] == 1536
    api.export_hf(nemo, back)
    assert "q_lora_rank" not in read_json(os.path.join(back, "config.json"))
    assert_same(src, back)


def test_deepseek_v3_mtp_dist_keys_and_pipeline_stage(tmp_path, models):
    """The MTP layer's dist keys are Megatron-Core's (``mtp.layers.0.…``, never stacked, experts
    ``[E, …]``, ``eh_proj`` with an extra state; ``tests/test_family_megatron.py`` checks them
    against Megatron-Core's own ``sharded_state_dict``); at PP=2 the MTP block and a copy of
    the embedding are on the last stage."""
    from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
    from nemo_convert.tensors.torch_zip_source import open_torch_file

    nemo = str(tmp_path / "m")
    api.import_hf(models["deepseek_v3"], nemo, packed=False)
    ck = DistCheckpointSource.from_dir(os.path.join(nemo, "model_weights"))
    assert ck._raw["model.mtp.layers.0.eh_proj.weight"][0] == (64, 128)
    assert ck._raw["model.mtp.layers.0.transformer_layer.mlp.experts.experts.linear_fc1.weight"][0] == (4, 96, 64)
    extra = set(ck.extra_state_keys)
    assert {"model.mtp.layers.0.eh_proj._extra_state/shard_0_1",
            "model.mtp.layers.0.transformer_layer.self_attention.linear_q_down_proj._extra_state/shard_0_1",
            "model.mtp.layers.0.transformer_layer.mlp.experts.experts.linear_fc2._extra_state/shard_3_4"} <= extra
    assert not [k for k in ck.raw_keys() if k.startswith("model.mtp.layers.") and not k.startswith("model.mtp.layers.0.")]
    ck.close()
    ranks = str(tmp_path / "r")
    api.reshard(nemo, ranks, tp=1, pp=2, layout="legacy", packed=False)
    first, last = (open_torch_file(os.path.join(ranks, f"tp_rank_00_pp_rank_00{p}", "model_weights.ckpt"))
                   for p in (0, 1))
    try:
        assert "model.embedding.word_embeddings.weight" in first.keys() and "model.embedding.word_embeddings.weight" in last.keys()
        assert "model.mtp.layers.0.enorm.weight" in last.keys() and not any("mtp" in k for k in first.keys())
    finally:
        first.close(), last.close()


def test_drop_mtp_leaves_the_mtp_layers_out_with_one_line(tmp_path, models, cli):
    src = models["deepseek_v3"]
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    code, out, err = cli("import", src, "-o", nemo, "--unpacked", "--drop-mtp")
    assert code == 0, err
    assert err.count("--drop-mtp: left out the source's 1 multi-token-prediction layer(s) (model.layers.4.*, 32 "
                     "tensors)") == 1, err
    cfg = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    assert cfg.get("mtp_num_layers") is None and cfg["nemo_convert"]["hf_mtp"] == {"dropped": 1}
    with api.open_checkpoint(nemo) as ck:
        assert not [k for k in ck.source.keys() if k.startswith("mtp.")]
    api.export_hf(nemo, back)
    got = hf_tensors(back)
    assert not [k for k in got if k.startswith("model.layers.4.")]
    assert read_json(os.path.join(back, "config.json"))["num_nextn_predict_layers"] == 0
    assert torch.equal(logits(src), logits(back))  # transformers' model never runs the MTP layer


def test_mtp_layers_announced_but_not_stored_import_without_them(tmp_path):
    """A checkpoint transformers saved announces one MTP layer (``num_nextn_predict_layers``
    defaults to 1) and stores none: imported without an MTP block, said so, and exported
    with the same config."""
    src = make_model(str(tmp_path / "hf"), "deepseek_v3", mtp_weights=False)
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    rep = api.import_hf(src, nemo, packed=False)
    assert any("announces 1 multi-token-prediction layer(s) that the checkpoint does not store" in n
               for n in rep.notes), rep.notes
    cfg = yaml.safe_load(open(os.path.join(nemo, "model_config.yaml")))
    assert cfg.get("mtp_num_layers") is None and cfg["nemo_convert"]["hf_mtp"] == {"absent": 1}
    api.export_hf(nemo, back)
    assert_same(src, back)


def test_an_mtp_copy_of_the_embedding_that_differs_is_refused_by_name(tmp_path, models):
    """Megatron-Core's MTP block uses the main embedding and output layer: an MTP layer whose
    stored copies differ cannot be represented; --drop-mtp is the way out."""
    import shutil

    from safetensors.torch import load_file, save_file

    src = str(tmp_path / "src")
    shutil.copytree(models["deepseek_v3"], src)
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    tensors["model.layers.4.shared_head.head.weight"] = tensors["model.layers.4.shared_head.head.weight"] + 1.0
    save_file(tensors, path, metadata={"format": "pt"})
    out = str(tmp_path / "m.nemo")
    with pytest.raises(InputError) as ei:
        api.import_hf(src, out)
    msg = str(ei.value)
    assert "model.layers.4.shared_head.head.weight differs from lm_head.weight" in msg and "--drop-mtp" in msg
    assert "\n" not in msg and not os.path.exists(out)
    api.import_hf(src, out, options={"drop_mtp": True})


def test_an_mtp_layer_megatron_would_build_otherwise_is_refused(tmp_path, models):
    src = str(tmp_path / "src")
    os.makedirs(src)
    for name in os.listdir(models["deepseek_v3"]):
        if name != "config.json":
            os.symlink(os.path.join(models["deepseek_v3"], name), os.path.join(src, name))
    cfg = read_json(os.path.join(models["deepseek_v3"], "config.json"))
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump({**cfg, "first_k_dense_replace": cfg["num_hidden_layers"]}, f)
    with pytest.raises(UnsupportedError, match="num_nextn_predict_layers=1 with first_k_dense_replace=4"):
        api.import_hf(src, str(tmp_path / "m.nemo"))


@pytest.mark.slow
@pytest.mark.parametrize("edit, words", [
    ({"bias": True}, "o_proj=True"),
    ({"moe_layer_freq": [0, 1, 0, 1]}, "moe_layer_freq=[0, 1, 0, 1]"),
    ({"moe_router_score_function": "softmax"}, "num_moe_experts=4 with its routing"),
    ({"window_size": [3, 0]}, "window_size=[3, 0]"),
])
def test_glm4_moe_export_refuses_what_its_class_does_not_compute(edit, words):
    """A NeMo config that Glm4MoeForCausalLM does not compute (an o_proj or MLP bias, a
    dense layer after an MoE one, softmax routing, a sliding window) is refused by name on
    export; the family's own config exports (whole-head RoPE too: ``partial_rotary_factor: 1.0``)."""
    import transformers

    from nemo_convert.plugins.manager import get_registry

    cls_name, extra, _, _ = FAMILIES["glm4_moe"]
    hf = json.loads(getattr(transformers, cls_name)(**{**BASE, **extra}).to_json_string())
    fam = get_registry().family("glm4_moe")
    cfg = fam.config_to_nemo(hf)
    cfg.pop("nemo_convert", None)
    assert fam.config_to_hf(dict(cfg))["partial_rotary_factor"] == 0.5
    assert fam.config_to_hf({**cfg, "rotary_percentage": 1.0})["partial_rotary_factor"] == 1.0
    with pytest.raises(UnsupportedError) as ei:
        fam.config_to_hf({**cfg, **edit})
    assert words in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
