"""The corpus of published ``config.json`` files (``tests/data/hub_configs/``, verbatim, each
cited in ``tests/data/hub_configs/SOURCES.md``) run through import → export.

For every stored config of a family we claim: shrink it **in size only** (layers, widths,
heads, experts, vocabulary — keeping GQA groups, head sizes that are not hidden / heads,
MLA's rope/nope split, top-k ≤ experts, expert groups, mixed dense/MoE stacks, the layer
types list; every other key as published), build a random model of it with transformers,
save it **the way the hub stores it** (the published dtype; DeepSeek-V3 and Kimi-K2 in
fp8 with ``weight_scale_inv`` per block and DeepSeek-V3's multi-token-prediction layer;
gpt-oss' experts in MXFP4; LLaVA's tower in the hub's ``vision_tower.vision_model.``
spelling), import it and export it. Every exported tensor must equal what transformers
holds for the source (the dequantized tensors for quantized sources) bit for bit, and the
exported ``config.json`` must be the source's, key for key (less the
``quantization_config`` of a source the import dequantized). A config the families cannot
represent is refused in one line naming the key; :data:`CASES` pins which.

Gemma 3's run with six layers (its fifth one global). The table of results is docs/formats.md "Published
configs we test".
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
import torch
from tiny_models import hf_tensors, randomize_, read_json

from nemo_convert import api
from nemo_convert.errors import NemoConvertError

HUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hub_configs")
#: Families whose stored configs are kept for a later issue (no family yet).
NOT_YET: tuple[str, ...] = ()
IDS = torch.tensor([[1, 5, 9, 33, 2, 77, 100, 3, 17, 64, 8, 120]])

#: config → (expected result, slow). ``None``: import and export bit-exactly; a string: the
#: words of the one-line refusal. gpt-oss is slow: transformers' own MXFP4 decoder builds
#: the reference (about 4 s each).
CASES: dict[str, tuple[str | None, bool]] = {
    "clip/openai__clip-vit-base-patch32_saved-4.57.0.json": (None, False),
    "clip/openai__clip-vit-large-patch14.json": (None, False),
    "deepseek_v2/deepseek-ai__DeepSeek-V2-Lite.json": (None, False),
    # 6 experts from 3 of 8 groups: transformers scores a group by its best expert, Megatron-Core
    # by its top-2 sum (deepseek_v2's family docstring)
    "deepseek_v2/deepseek-ai__DeepSeek-V2.5.json": ("topk_method='group_limited_greedy' with num_experts_per_tok=6, "
                                                   "topk_group=3", False),
    "deepseek_v3/DeepSeek-V3.json": (None, False),
    "deepseek_v3/moonshotai__Kimi-K2-Instruct.json": (None, False),
    "gemma/google__gemma-2b.json": (None, False),
    "glm4_moe/zai-org__GLM-4.5-Air_printed-4.54.1.json": (None, False),
    "glm4_moe/zai-org__GLM-4.5.json": (None, False),
    "gemma/unsloth__codegemma-7b-it.json": (None, False),
    "gemma2/google__gemma-2-27b.json": (None, False),
    "gemma2/google__gemma-2-2b.json": (None, False),
    "gemma2/google__gemma-2-9b.json": (None, False),
    "gemma3/google__gemma-3-1b-it_saved-4.52.4.json": (None, False),
    "gemma3/google__gemma-3-270m.json": (None, False),
    # Gemma3ForConditionalGeneration: only its language model is imported, on request
    # (tests/test_gemma3_multimodal.py runs that on the same config)
    "gemma3/google__gemma-3-4b-it_printed-4.50.3.json": ("is not imported whole: pass --text-only", False),
    "gpt2/gpt2_gptq.json": ("quant_method='gptq'", False),
    "gpt2/gpt2_large_hub.json": (None, False),
    "gpt2/gpt2_saved_4.38.json": (None, False),
    "gpt_oss/gpt-oss-120b.json": (None, True),
    "gpt_oss/gpt-oss-20b.json": (None, True),
    "llama/TinyLlama__TinyLlama-1.1B-Chat-v1.0_saved-4.56.0.json": (None, False),
    "llama/meta-llama__Llama-2-7b-chat-hf.json": (None, False),
    "llama/meta-llama__Llama-3.1-8B.json": (None, False),
    "llama/meta-llama__Llama-3.2-1B.json": (None, False),
    "llama/meta-llama__Llama-3.2-3B.json": (None, False),
    "llama/meta-llama__Meta-Llama-3-8B_saved-4.52.4.json": (None, False),
    "llava/llava-hf__llava-1.5-7b-hf.json": (None, False),
    "mistral/mistralai__Mistral-7B-v0.3.json": (None, False),
    "mixtral/mistralai__Mixtral-8x7B-v0.1.json": (None, False),
    "nemotron/nemotron_4_4b_trtllm.json": (None, False),
    "nemotron_h/Nemotron-H-8B-Base-8K.json": (None, False),
    "nemotron_h/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json": (None, False),
    "phi3/microsoft__Phi-3-mini-4k-instruct.json": (None, False),
    "phi3/microsoft__Phi-3.5-mini-instruct.json": ("'longrope' has no Megatron-Core equivalent here (Megatron-Core "
                                                   "has no LongRoPE", False),
    "qwen2/Qwen__Qwen2-0.5B_saved-4.46.3.json": (None, False),
    "qwen2/Qwen__Qwen2.5-0.5B-Instruct_saved-4.49.0.json": (None, False),
    "qwen2/Qwen__Qwen2.5-14B.json": (None, False),
    "qwen2/Qwen__Qwen2.5-32B.json": (None, False),
    "qwen2/Qwen__Qwen2.5-3B.json": (None, False),
    "qwen2/Qwen__Qwen2.5-7B.json": (None, False),
    "qwen2_moe/Qwen__Qwen2-57B-A14B.json": (None, False),
    "qwen3/Qwen__Qwen3-14B.json": (None, False),
    "qwen3/Qwen__Qwen3-32B.json": (None, False),
    "qwen3/Qwen__Qwen3-4B.json": (None, False),
    "qwen3/Qwen__Qwen3-8B.json": (None, False),
    "qwen3/Qwen__Qwen3-8B_saved-4.57.1.json": (None, False),
    "qwen3_moe/Qwen__Qwen3-30B-A3B.json": (None, False),
}


def stored_configs() -> list[str]:
    out = []
    for family in sorted(os.listdir(HUB)):
        folder = os.path.join(HUB, family)
        if os.path.isdir(folder):
            out += [f"{family}/{name}" for name in sorted(os.listdir(folder)) if name.endswith(".json")]
    return out


def test_every_stored_config_is_cited_and_pinned():
    """Each stored config has its SOURCES line and a pinned result (or waits for its family)."""
    sources = open(os.path.join(HUB, "SOURCES.md"), encoding="utf-8").read()
    for name in stored_configs():
        assert f"`{name}`" in sources, f"{name} is not cited in SOURCES.md"
        family = name.split("/")[0]
        assert (name in CASES) != (family in NOT_YET), name
    assert sorted(CASES) == sorted(n for n in stored_configs() if n.split("/")[0] not in NOT_YET)
    assert len(CASES) >= 30


def test_every_family_brings_published_configs():
    """A family joins with its real configs: each installed family has one in the corpus."""
    from nemo_convert.plugins.manager import get_registry

    covered = {name.split("/")[0] for name in CASES}
    assert set(get_registry().families) <= covered, set(get_registry().families) - covered


# -- shrinking: sizes only -----------------------------------------------------------------------

def _vocab(cfg: dict[str, Any], *keys: str) -> int:
    """A small vocabulary, unless a padding id (which transformers' embedding needs below the
    vocabulary) or an image token id of the config lies beyond it."""
    needed = [int(cfg[k]) for k in ("pad_token_id", *keys) if isinstance(cfg.get(k), int)]
    return 256 if all(i < 256 for i in needed) else int(cfg["vocab_size"])


def _decoder(cfg: dict[str, Any], layers: int = 2) -> dict[str, Any]:
    """A GPT-style decoder's sizes: hidden 64, 4 heads (1, 2 or 4 key/value heads as the
    published config groups them), ``head_dim`` 16 when it is hidden / heads there, else 32
    (still its own size), two layers, a small vocabulary."""
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    out = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=layers, intermediate_size=96,
               vocab_size=_vocab(cfg))
    if "num_key_value_heads" in cfg:
        out["num_key_value_heads"] = 4 if kv == heads else (1 if kv == 1 else 2)
    if cfg.get("head_dim") is not None:
        out["head_dim"] = 16 if int(cfg["head_dim"]) * heads == hidden else 32
    if cfg.get("kv_channels") is not None:
        out["kv_channels"] = 16 if int(cfg["kv_channels"]) * heads == hidden else 32
    return out


def _tower(sec: dict[str, Any], vision: bool) -> dict[str, Any]:
    """A CLIP tower's sizes (three vision layers: LLaVA reads the second-last)."""
    out = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_hidden_layers=3 if vision else 2)
    if vision:
        out["image_size"] = 2 * int(sec.get("patch_size", 32))  # 2×2 patches
    return out


def shrink(name: str) -> dict[str, Any]:
    """The stored config ``name`` with its sizes shrunk (module docstring)."""
    cfg = read_json(os.path.join(HUB, name))
    family = name.split("/")[0]
    if family == "gpt2":
        cfg.update(n_embd=64, n_layer=2, n_head=4, vocab_size=256)
    elif family == "clip":
        cfg["projection_dim"] = 16
        for sec, vision in (("text_config", False), ("vision_config", True)):
            # the text vocabulary and image size stay: a *_config_dict without them means
            # CLIPTextConfig's / CLIPVisionConfig's defaults (49408, 224) to transformers
            sizes = {k: v for k, v in _tower(cfg[sec], vision).items() if k != "image_size"}
            cfg[sec].update(sizes)
            legacy = cfg.get(sec + "_dict")
            if legacy is not None:  # the legacy duplicate states the same sizes
                legacy.update({k: v for k, v in sizes.items() if k in legacy})
    elif family == "llava":  # the hub's sparse text_config: its sizes are LlamaConfig defaults, spelled out
        cfg["text_config"].update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2)
        cfg["vision_config"].update(_tower(cfg["vision_config"], True))
    elif family == "deepseek_v2":
        # one MoE layer after the dense one; 16 experts (2 per group for V2.5's 8 groups); the
        # query LoRA only where published (V2-Lite has none)
        cfg.update(_decoder(cfg, layers=int(cfg["first_k_dense_replace"]) + 1), num_key_value_heads=4,
                   moe_intermediate_size=32, n_routed_experts=16, kv_lora_rank=16, qk_nope_head_dim=16,
                   qk_rope_head_dim=8, v_head_dim=16)
        if cfg.get("q_lora_rank"):
            cfg["q_lora_rank"] = 32
    elif family == "deepseek_v3":
        # one MoE layer after the dense ones (and the MTP layer after it); 16 experts: 2 per
        # group for DeepSeek-V3's 8 groups (top-2 within a group, top-4 groups, top-8 experts)
        cfg.update(_decoder(cfg, layers=int(cfg["first_k_dense_replace"]) + 1), num_key_value_heads=4,
                   moe_intermediate_size=32, n_routed_experts=16, q_lora_rank=32, kv_lora_rank=16,
                   qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    elif family == "glm4_moe":
        # one MoE layer after the dense ones (and the MTP layer after it); as many experts as
        # the published top-k (8)
        cfg.update(_decoder(cfg, layers=int(cfg["first_k_dense_replace"]) + 1), moe_intermediate_size=32,
                   n_routed_experts=max(4, int(cfg["num_experts_per_tok"])))
    elif family == "nemotron_h":
        # tests/tiny_hybrid.py's sizes (mixer heads, groups, state; a shorter pattern with every
        # kind of layer), with the experts' top-k kept as published
        from tiny_hybrid import CONFIGS as HYBRID

        sizes = next(s for f, s in HYBRID.values() if f == os.path.basename(name))
        cfg.update({k: v for k, v in sizes.items() if k != "num_experts_per_tok"})
        if "n_routed_experts" in cfg:
            cfg["n_routed_experts"] = max(4, int(cfg["num_experts_per_tok"]))
    elif family == "gemma3" and "text_config" in cfg:  # Gemma3ForConditionalGeneration: one image token
        cfg["text_config"].update(_decoder(cfg["text_config"], layers=6))
        cfg["vision_config"].update(_tower(cfg["vision_config"], True))
        cfg["mm_tokens_per_image"] = 1
    elif family == "gemma3":  # six layers: the sixth is the first global one (sliding_window_pattern 6)
        cfg.update(_decoder(cfg, layers=6))
    else:
        cfg.update(_decoder(cfg))
        if family == "phi3" and isinstance(cfg.get("rope_scaling"), dict):
            # LongRoPE's factors are per rotary dimension: keep the published head size (96)
            factors = len(cfg["rope_scaling"]["long_factor"])
            cfg.update(hidden_size=4 * factors, num_attention_heads=2, num_key_value_heads=2)
        for key in ("num_local_experts", "num_experts"):  # top-k kept as published
            if key in cfg:
                cfg[key] = max(4, int(cfg.get("num_experts_per_tok") or 2))
        if "moe_intermediate_size" in cfg:
            cfg["moe_intermediate_size"] = 32
        if "shared_expert_intermediate_size" in cfg:
            cfg["shared_expert_intermediate_size"] = 48
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][: cfg["num_hidden_layers"]]
    return cfg


def test_shrinking_keeps_every_other_key():
    """Only sizes change; the architecture's ratios stay (spot checks on the hard ones)."""
    for name in CASES:
        src, small = read_json(os.path.join(HUB, name)), shrink(name)
        assert set(small) >= set(src), name
        sizes = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "kv_channels", "vocab_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "num_experts", "num_local_experts", "n_routed_experts", "q_lora_rank", "kv_lora_rank",
                 "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "layer_types", "projection_dim", "n_embd",
                 "n_layer", "n_head", "text_config", "vision_config", "text_config_dict", "vision_config_dict",
                 "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "hybrid_override_pattern",
                 "moe_shared_expert_intermediate_size", "max_position_embeddings", "mm_tokens_per_image"}
        assert {k for k in src if src[k] != small[k]} <= sizes, name
    v3 = shrink("deepseek_v3/DeepSeek-V3.json")
    assert (v3["num_hidden_layers"], v3["first_k_dense_replace"], v3["n_group"], v3["topk_group"]) == (4, 3, 8, 4)
    assert v3["n_routed_experts"] % v3["n_group"] == 0 and v3["num_experts_per_tok"] == 8
    qwen3_4b = shrink("qwen3/Qwen__Qwen3-4B.json")
    assert qwen3_4b["head_dim"] * qwen3_4b["num_attention_heads"] != qwen3_4b["hidden_size"]  # own head size kept
    assert shrink("gemma/google__gemma-2b.json")["num_key_value_heads"] == 1  # multi-query stays multi-query


# -- building the published layout ---------------------------------------------------------------

CONFIG_CLASSES = {
    "llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
    "gemma": "GemmaConfig", "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig", "phi3": "Phi3Config", "mixtral": "MixtralConfig", "qwen3_moe": "Qwen3MoeConfig",
    "qwen2_moe": "Qwen2MoeConfig", "deepseek_v2": "DeepseekV2Config", "deepseek_v3": "DeepseekV3Config",
    "glm4_moe": "Glm4MoeConfig", "nemotron": "NemotronConfig",
    "gpt2": "GPT2Config", "clip": "CLIPConfig", "llava": "LlavaConfig", "nemotron_h": "NemotronHConfig",
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: Keys that name the checkpoint rather than the model (Kimi-K2 says ``model_type: kimi_k2``
#: with transformers' DeepSeek-V3 classes behind ``auto_map``): left out when building.
NOT_FOR_BUILDING = ("quantization_config", "model_type", "architectures", "auto_map", "transformers_version")


def _hf_model(cfg: dict[str, Any], family: str, seed: int) -> torch.nn.Module:
    import transformers

    kwargs = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in NOT_FOR_BUILDING}
    hf_cfg = getattr(transformers, CONFIG_CLASSES[family])(**kwargs)
    torch.manual_seed(0)
    if family == "clip":
        model = transformers.CLIPModel(hf_cfg)
    elif family == "llava":
        model = transformers.LlavaForConditionalGeneration(hf_cfg)
    elif family == "gemma3" and "text_config" in cfg:
        model = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(**kwargs))
    else:
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    randomize_(model, seed=seed)
    with torch.no_grad():  # DeepSeek's score correction is a buffer: random too, so that it matters
        for n, buf in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=torch.Generator().manual_seed(seed)) * 0.5)
    return model


def _save(folder: str, tensors: dict[str, torch.Tensor], cfg: dict[str, Any]) -> str:
    from safetensors.torch import save_file

    os.makedirs(folder)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return folder


def _fp8_blocks(tensors: dict[str, torch.Tensor], block: tuple[int, int]) -> tuple[dict, dict]:
    """DeepSeek's hub layout: every attention and MLP projection (the MTP layer's too, but
    not its ``eh_proj``, which vLLM's ``deepseek_mtp`` builds as a plain ``nn.Linear``) in
    float8_e4m3fn with a float32 ``weight_scale_inv`` per ``block`` (edge blocks partial),
    and the dequantized bf16 tensors transformers' fp8 integration would hold."""
    fp8, plain = {}, {}
    rb, cb = block
    for k, w in tensors.items():
        if not (k.endswith("proj.weight") or k.endswith("proj_with_mqa.weight")) or k.endswith("eh_proj.weight"):
            fp8[k] = plain[k] = w
            continue
        rows, cols = w.shape
        nr, nc = -(-rows // rb), -(-cols // cb)
        padded = torch.zeros(nr * rb, nc * cb)
        padded[:rows, :cols] = w.float()
        blocks = padded.reshape(nr, rb, nc, cb)
        scale = (blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0)
        q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
        deq = (q.float() * scale[:, None, :, None]).reshape(nr * rb, nc * cb)[:rows, :cols]
        fp8[k] = q.reshape(nr * rb, nc * cb)[:rows, :cols].contiguous()
        fp8[k + "_scale_inv"] = scale.contiguous()
        plain[k] = deq.to(torch.bfloat16)
    return fp8, plain


def build_published(name: str, root: str) -> tuple[str, str]:
    """``(source, reference)`` folders for the shrunk config ``name``: the source in the
    published layout, the reference holding what transformers holds for it (the same
    folder unless the source is quantized)."""
    family = name.split("/")[0]
    if family == "gpt_oss":  # MXFP4 experts: test_mxfp4's builder, on the same stored config
        from test_mxfp4 import make_mxfp4_gpt_oss

        return make_mxfp4_gpt_oss(root, os.path.basename(name), rope="published")
    cfg = shrink(name)
    model = _hf_model(cfg, family, seed=sum(map(ord, name)) % 1000)
    dtype = DTYPES.get(cfg.get("torch_dtype") or cfg.get("dtype") or "float32", torch.float32)
    src = os.path.join(root, "src")
    model.to(dtype).save_pretrained(src, safe_serialization=True)
    with open(os.path.join(src, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    if family == "llava":  # llava-hf's files spell the tower as transformers 4 did
        from tiny_multimodal import rename_safetensors_keys

        rename_safetensors_keys(src, [("vision_tower.", "vision_tower.vision_model.")])
    if family in ("deepseek_v3", "glm4_moe"):
        from test_family_matrix import add_mtp_layers

        add_mtp_layers(src)  # the hub's num_nextn_predict_layers (none for Kimi-K2)
        quant = cfg.get("quantization_config") or {}
        if quant.get("quant_method") == "fp8":
            fp8, plain = _fp8_blocks(hf_tensors(src), tuple(quant["weight_block_size"]))
            ref_cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
            reference = _save(os.path.join(root, "reference"), plain, ref_cfg)
            return _save(os.path.join(root, "fp8"), fp8, cfg), reference
    return src, src


def assert_exported_as_transformers_holds(reference: str, back: str) -> None:
    want, got = hf_tensors(reference), hf_tensors(back)
    assert set(got) <= set(want) and set(want) - set(got) <= {"lm_head.weight"}, set(want) ^ set(got)
    for k in got:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert read_json(os.path.join(back, "config.json")) == read_json(os.path.join(reference, "config.json"))


#: Tensor names (substrings) each family's published layout has, checked on the source.
LAYOUT: dict[str, tuple[str, ...]] = {
    "deepseek_v2": ("mlp.experts.15.gate_proj.weight", "mlp.shared_experts.down_proj.weight",
                    "self_attn.kv_a_proj_with_mqa.weight"),
    "deepseek_v3": ("mlp.experts.0.gate_proj.weight_scale_inv", "self_attn.kv_a_proj_with_mqa.weight_scale_inv",
                    "mlp.gate.e_score_correction_bias"),
    "glm4_moe": ("mlp.experts.7.gate_proj.weight", "mlp.gate.e_score_correction_bias", "self_attn.q_proj.bias",
                 "mlp.shared_experts.up_proj.weight", "eh_proj.weight", "shared_head.head.weight"),
    "gpt_oss": ("mlp.experts.gate_up_proj_blocks", "mlp.experts.down_proj_scales", "self_attn.sinks"),
    "llava": ("vision_tower.vision_model.encoder.layers.0.", "multi_modal_projector.linear_1.weight"),
    "mixtral": ("block_sparse_moe.experts.3.w3.weight",),
    "qwen2_moe": ("mlp.experts.7.down_proj.weight", "mlp.shared_expert_gate.weight"),
    "qwen3_moe": ("mlp.experts.7.gate_proj.weight",),
}


def assert_published_layout(name: str, src: str) -> None:
    tensors = hf_tensors(src)
    family = name.split("/")[0]
    for mark in LAYOUT.get(family, ()):
        assert any(mark in k for k in tensors), (name, mark)
    if family == "deepseek_v3":  # fp8 weights; DeepSeek-V3's MTP layer after its 4 layers, Kimi-K2 has none
        assert any(v.dtype == torch.float8_e4m3fn for v in tensors.values())
        mtp = any(k.startswith("model.layers.4.eh_proj") for k in tensors)
        assert mtp == (read_json(os.path.join(HUB, name)).get("num_nextn_predict_layers") == 1), name
    want = read_json(os.path.join(src, "config.json")).get("torch_dtype")
    if want in DTYPES and family != "deepseek_v3":
        assert {v.dtype for v in tensors.values() if v.is_floating_point()} == {DTYPES[want]}, name


def _case_params() -> list[Any]:
    return [pytest.param(name, marks=pytest.mark.slow) if slow else name for name, (_, slow) in CASES.items()]


@pytest.mark.parametrize("name", _case_params())
def test_published_config_round_trips_or_is_refused_by_name(tmp_path, name):
    expect, _ = CASES[name]
    src, reference = build_published(name, str(tmp_path))
    assert_published_layout(name, src)
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    if expect is not None:
        with pytest.raises(NemoConvertError) as ei:
            api.import_hf(src, nemo)
        msg = str(ei.value)
        assert expect in msg and "\n" not in msg, msg
        assert not os.path.exists(nemo)
        return
    api.import_hf(src, nemo)
    api.export_hf(nemo, back)
    assert_exported_as_transformers_holds(reference, back)


# -- the keys real configs carry -------------------------------------------------------------

def _logits(folder: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS).logits


def test_gemma_published_gelu_runs_as_transformers_runs_it(tmp_path):
    """google/gemma-2b says ``hidden_act: "gelu"``; transformers runs the tanh GeLU for it
    (``GemmaConfig.__post_init__``), and so does the import (``openai_gelu``); export gives
    the config back as published, and transformers computes the same logits on both."""
    from transformers import GemmaConfig

    assert GemmaConfig(hidden_act="gelu").hidden_act == "gelu_pytorch_tanh"
    src, _ = build_published("gemma/google__gemma-2b.json", str(tmp_path))
    nemo, back = str(tmp_path / "m"), str(tmp_path / "back")
    api.import_hf(src, nemo, packed=False)
    with api.open_checkpoint(nemo) as ck:
        assert (ck.config["activation"], ck.config["openai_gelu"]) == ("geglu", True)
    api.export_hf(nemo, back)
    assert read_json(os.path.join(back, "config.json"))["hidden_act"] == "gelu"
    assert torch.equal(_logits(src), _logits(back))


def test_qwen25_use_mrope_false_is_harmless_and_restored(tmp_path):
    src, _ = build_published("qwen2/Qwen__Qwen2.5-3B.json", str(tmp_path))
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    api.import_hf(src, nemo)
    api.export_hf(nemo, back)
    assert read_json(os.path.join(back, "config.json"))["use_mrope"] is False
    assert torch.equal(_logits(src), _logits(back))


def test_deepseek_v3_absent_sizes_are_its_class_defaults():
    """deepseek-ai/DeepSeek-V3's MLA and expert sizes are ``DeepseekV3Config``'s defaults, so
    the config without any of them is the same model to transformers, and to the import
    (before: an absent ``q_lora_rank`` read as no query LoRA, one ``linear_q_proj``, and an
    absent ``n_group`` as one group). An explicit null ``q_lora_rank`` is the one without."""
    from transformers import DeepseekV3Config

    from nemo_convert.plugins.manager import get_registry

    fam = get_registry().family("deepseek_v3")
    hub = read_json(os.path.join(HUB, "deepseek_v3/DeepSeek-V3.json"))
    del hub["quantization_config"]
    keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
            "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group")
    default = DeepseekV3Config()
    assert {k: getattr(default, k) for k in keys} == {k: hub[k] for k in keys}  # the premise
    want = fam.config_to_nemo(copy.deepcopy(hub))
    assert (want["q_lora_rank"], want["moe_router_num_groups"]) == (1536, 8)
    for key in keys:
        assert fam.config_to_nemo({k: v for k, v in hub.items() if k != key}) == want, key
    assert fam.config_to_nemo({k: v for k, v in hub.items() if k not in keys}) == want
    assert fam.config_to_nemo({**hub, "q_lora_rank": None})["q_lora_rank"] is None


def test_clip_legacy_tower_dicts_must_agree(tmp_path):
    """openai/clip-vit-large-patch14's ``text_config_dict`` / ``vision_config_dict`` agree with
    ``text_config`` / ``vision_config``; one that disagrees is refused by the field's name
    (transformers would take the ``*_dict`` value)."""
    from nemo_convert.errors import ConfigError, UnsupportedError
    from nemo_convert.plugins.manager import get_registry

    clip = get_registry().family("clip")
    cfg = shrink("clip/openai__clip-vit-large-patch14.json")
    clip.config_to_nemo(copy.deepcopy(cfg))
    bad = copy.deepcopy(cfg)
    bad["vision_config_dict"]["patch_size"] = 16
    with pytest.raises(UnsupportedError, match="vision_config_dict.patch_size=16 differs from vision_config.patch_size=14"):
        clip.config_to_nemo(bad)
    bad = copy.deepcopy(cfg)
    bad["text_config_dict"]["num_hidden_layers"] = 5
    with pytest.raises(UnsupportedError, match="text_config_dict.num_hidden_layers=5 differs"):
        clip.config_to_nemo(bad)
    bad = copy.deepcopy(cfg)
    bad["text_config_dict"]["rotary"] = True
    with pytest.raises(ConfigError, match="text_config_dict.rotary=True is not understood by family clip"):
        clip.config_to_nemo(bad)
