"""MXFP4 checkpoints (GPT-OSS's hub layout) are dequantized on import exactly as
transformers dequantizes them.

The decoder (``nemo_convert/mapping/dequant.py``) is checked bit for bit against
transformers' own ``convert_moe_packed_tensors`` (transformers 5.24,
``integrations/mxfp4.py`` lines 229-312) on random codes and every one of the 256 E8M0
scales, in each output dtype. Then a tiny GPT-OSS in the published layout — the real
``config.json`` (``tests/data/hub_configs/gpt_oss/``, kept verbatim) shrunk in size only,
MXFP4 ``*_blocks`` / ``*_scales`` for the experts, bf16 for the rest — is imported and
exported: the export equals transformers' dequantization tensor for tensor, and
transformers computes the same logits on the export as on the MXFP4 folder it loads
(and dequantizes, on the CPU) itself.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from tiny_models import hf_tensors, read_json

from nemo_convert import api
from nemo_convert.errors import ShapeError, UnsupportedError
from nemo_convert.mapping.dequant import codec_for, dequantize_mxfp4, mxfp4_shape

HUB = os.path.join(os.path.dirname(__file__), "data", "hub_configs", "gpt_oss")
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
IDS = torch.tensor([[1, 5, 9, 33, 2, 77, 100, 3, 17, 64, 8, 120]])


def _random_mxfp4(shape: tuple[int, ...], seed: int, scales: tuple[int, int] = (0, 256)) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), dtype=torch.uint8, generator=g)
    return blocks, torch.randint(scales[0], scales[1], shape, dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_decoder_is_bit_exact_with_transformers(dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4((4, 48, 3), seed=1)
    scales[0, :, 0] = torch.arange(48, dtype=torch.uint8)  # every E8M0 code appears
    scales[1, :, 0] = torch.arange(48, 96, dtype=torch.uint8)
    scales[2] = torch.arange(96, 240, dtype=torch.uint8).reshape(48, 3)
    scales[3, :16, 0] = torch.arange(240, 256, dtype=torch.uint8)
    want = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype)
    got = dequantize_mxfp4(blocks, scales, dtype)
    assert got.shape == want.shape == (4, 96, 48) and got.dtype == want.dtype == dtype
    assert torch.equal(got.view(BITS[dtype]), want.view(BITS[dtype]))  # NaN and inf too, bit for bit
    assert torch.isinf(got.float()).any()  # code 255 (2**128) is in the test
    meta = dequantize_mxfp4(blocks.to("meta"), scales.to("meta"), dtype)
    assert meta.is_meta and meta.shape == got.shape


def test_decoder_layout_by_hand():
    """One block, decoded by hand: the low nibble is the even element, then the high one;
    the row's values times 2**(scale - 127); rows end up as the last dimension."""
    blocks = torch.zeros(1, 2, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x72  # low 2 → 1.0, high 7 → 6.0
    blocks[0, 1, 0, 15] = 0x9F  # low F → -6.0, high 9 → -0.5
    scales = torch.tensor([[[128], [125]]], dtype=torch.uint8)  # ×2, ×1/4
    out = dequantize_mxfp4(blocks, scales, torch.float32)
    assert out.shape == (1, 32, 2)
    assert out[0, 0, 0] == 2.0 and out[0, 1, 0] == 12.0
    assert out[0, 30, 1] == -1.5 and out[0, 31, 1] == -0.125
    assert int((out != 0).sum()) == 4


def test_bad_mxfp4_inputs_are_refused():
    with pytest.raises(ShapeError, match="expected"):
        mxfp4_shape((4, 8, 2, 16), (4, 8, 3))
    with pytest.raises(ShapeError, match="uint8"):
        dequantize_mxfp4(torch.zeros(2, 1, 16, dtype=torch.int8), torch.zeros(2, 1, dtype=torch.uint8), torch.float32)
    with pytest.raises(UnsupportedError, match="quantization_config.block_size=64"):
        codec_for({"quant_method": "mxfp4", "block_size": 64})
    with pytest.raises(UnsupportedError, match="quant_method='awq'"):
        codec_for({"quant_method": "awq"})
    assert codec_for(read_json(os.path.join(HUB, "gpt-oss-120b.json"))["quantization_config"]).method == "mxfp4"


# -- a tiny GPT-OSS in the published layout ----------------------------------------------------

#: The published config shrunk in size only (vocabulary and token ids kept: pad 199999).
SHRINK = dict(hidden_size=64, intermediate_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, num_local_experts=8)


def _published_config(name: str, rope: str) -> dict:
    cfg = read_json(os.path.join(HUB, name))
    cfg.update(SHRINK, layer_types=cfg["layer_types"][:SHRINK["num_hidden_layers"]])
    if rope == "plain":  # the published yarn spelled as plain RoPE (YaRN: issue 22, another change)
        del cfg["rope_scaling"], cfg["rope_theta"]
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 150000.0}
    return cfg


def make_mxfp4_gpt_oss(root: str, name: str = "gpt-oss-20b.json", rope: str = "plain") -> tuple[str, str]:
    """``(mxfp4, reference)``: the MXFP4 folder as published (experts as ``*_blocks`` /
    ``*_scales``, the rest bf16, ``quantization_config`` verbatim) and the same model as
    transformers' dequantizer makes of it (plain bf16 experts, no ``quantization_config``)."""
    import transformers
    from safetensors.torch import save_file
    from tiny_models import randomize_
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    cfg = _published_config(name, rope)
    plain_cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    model = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(**plain_cfg))
    randomize_(model, seed=7)
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    packed, plain = {}, {}
    e, h, i = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    for k, v in state.items():
        proj = next((p for p in ("gate_up_proj", "down_proj") if k.endswith(f".experts.{p}")), None)
        if proj is None:
            packed[k] = plain[k] = v
            continue
        rows, cols = (2 * i, h) if proj == "gate_up_proj" else (h, i)  # [E, rows, cols/32, 16]
        blocks, scales = _random_mxfp4((e, rows, cols // 32), seed=len(packed), scales=(117, 124))
        packed[k + "_blocks"], packed[k + "_scales"] = blocks, scales
        plain[k] = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.bfloat16).contiguous()
        assert plain[k].shape == v.shape, (k, plain[k].shape, v.shape)
    folders = []
    for sub, tensors, config in (("mxfp4", packed, cfg), ("reference", plain, plain_cfg)):
        folder = os.path.join(root, sub)
        os.makedirs(folder)
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        folders.append(folder)
    return folders[0], folders[1]


def _logits(folder: str, quantized: bool = False) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, Mxfp4Config

    kw = {"quantization_config": Mxfp4Config(dequantize=True)} if quantized else {}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    model.eval()
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt-oss-20b.json", "gpt-oss-120b.json"])
def test_published_layout_imports_and_exports_transformers_dequantization(tmp_path, name):
    mxfp4, reference = make_mxfp4_gpt_oss(str(tmp_path), name)
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    rep = api.import_hf(mxfp4, nemo)
    assert any("dequantized 4 mxfp4 tensors (32-value blocks) to torch.bfloat16" in n for n in rep.notes), rep.notes
    with api.open_checkpoint(nemo) as ck:
        assert ck.config["nemo_convert"]["hf_dequantized"] == read_json(os.path.join(mxfp4, "config.json"))[
            "quantization_config"]
        assert "quantization_config" not in ck.config["nemo_convert"]["hf_config"]
    api.export_hf(nemo, back)
    want, got = hf_tensors(reference), hf_tensors(back)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert read_json(os.path.join(back, "config.json")) == read_json(os.path.join(reference, "config.json"))
    assert torch.equal(_logits(back), _logits(mxfp4, quantized=True))
    rep_v = api.verify(mxfp4, nemo)  # verify reads the MXFP4 side as import does, and says so
    assert rep_v.ok, rep_v.as_dict()
    assert any("A: dequantized 4 mxfp4 tensors" in n for n in rep_v.notes), rep_v.notes
    assert any("B: imported from a mxfp4 checkpoint" in n for n in rep_v.notes), rep_v.notes


@pytest.mark.slow
def test_dtype_chooses_the_dequantized_dtype(tmp_path):
    """``--dtype fp32`` decodes straight into float32 (no bf16 rounding in between)."""
    mxfp4, _ = make_mxfp4_gpt_oss(str(tmp_path))
    nemo = str(tmp_path / "m.nemo")
    rep = api.import_hf(mxfp4, nemo, dtype="fp32")
    assert any("mxfp4 tensors (32-value blocks) to torch.float32" in n for n in rep.notes), rep.notes
    src = api.open_checkpoint(nemo)
    try:
        name = "decoder.layers.1.mlp.experts.local_experts.5.linear_fc2.weight"
        assert src.source.info(name).dtype == torch.float32
    finally:
        src.close()


@pytest.mark.slow
def test_published_config_as_published(tmp_path):
    """The real config shrunk in size only — YaRN included."""
    mxfp4, _ = make_mxfp4_gpt_oss(str(tmp_path), rope="published")
    nemo, back = str(tmp_path / "m.nemo"), str(tmp_path / "back")
    api.import_hf(mxfp4, nemo)
    api.export_hf(nemo, back)
    assert torch.equal(_logits(back), _logits(mxfp4, quantized=True))
