"""The CLIP plugin's verifier (``verify --clip-image IMG --texts …``: zero-shot probabilities
computed like NeMo's ``megatron_clip_infer.py``), its image readers, and how the core shows
its result without naming it. Tiny random CLIP models built here; nothing is downloaded."""

from __future__ import annotations

import json
import os
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_convert import ResultTable, VerifierResult, api
from nemo_convert.cli.main import main
from nemo_convert.verify import verify
from tiny_models import corpus


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _png(path: Path, pixels: torch.Tensor, *, filters: bool = False, mode: str = "rgb") -> None:
    """Write an 8-bit PNG; with ``filters``, rows use random filter types 0-4."""
    h, w, c = pixels.shape
    rng = random.Random(0)
    rows, prev = [], bytes(w * c)
    for y in range(h):
        line = bytes(pixels[y].reshape(-1).tolist())
        f = rng.randint(0, 4) if filters else 0
        enc = bytearray(line)
        for i in range(len(line)):
            left = line[i - c] if i >= c else 0
            up, ul = prev[i], prev[i - c] if i >= c else 0
            if f == 1:
                enc[i] = (line[i] - left) & 0xFF
            elif f == 2:
                enc[i] = (line[i] - up) & 0xFF
            elif f == 3:
                enc[i] = (line[i] - ((left + up) >> 1)) & 0xFF
            elif f == 4:
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else ul)
                enc[i] = (line[i] - pred) & 0xFF
        rows.append(bytes([f]) + bytes(enc))
        prev = line

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ctype = {"rgb": 2, "rgba": 6, "gray": 0}[mode]
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


def test_builtin_image_readers(tmp_path: Path) -> None:
    from nemo_convert_clip.image import read_png, read_pnm

    g = torch.Generator().manual_seed(1)
    rgb = torch.randint(0, 256, (9, 11, 3), generator=g, dtype=torch.uint8)
    for mode, pix in (("rgb", rgb), ("rgba", torch.cat([rgb, rgb[..., :1]], -1)), ("gray", rgb[..., :1])):
        _png(tmp_path / "x.png", pix, filters=True, mode=mode)
        want = pix[..., :3] if mode != "gray" else pix.expand(9, 11, 3)
        assert torch.equal(read_png((tmp_path / "x.png").read_bytes()), want), mode
    ppm = b"P6\n# a comment\n11 9\n255\n" + bytes(rgb.reshape(-1).tolist())
    assert torch.equal(read_pnm(ppm), rgb)


def _clip_folder(folder: Path, seed: int = 0) -> str:
    """A tiny random ``CLIPModel`` with a CLIP-like tokenizer.json (BOS/EOS added by its post-processor)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import CLIPConfig, CLIPModel

    cfg = CLIPConfig(text_config=dict(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=16, bos_token_id=0,
                                      eos_token_id=1, pad_token_id=1),
                     vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=4), projection_dim=16)
    torch.manual_seed(seed)
    model = CLIPModel(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(str(folder))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=110, special_tokens=["<|startoftext|>", "<|endoftext|>", "<unk>"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<|startoftext|> $A <|endoftext|>",
                                                       special_tokens=[("<|startoftext|>", 0), ("<|endoftext|>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    return str(folder)


TEXTS = ["a dog", "the quick brown fox", "tensor parallel ranks"]


def _expected_probs(folder: str, image: str) -> list[float]:
    """NeMo's formula, written out independently: normalised features, softmax(100·i·tᵀ)."""
    from tokenizers import Tokenizer
    from transformers import CLIPModel

    from nemo_convert_clip.image import clip_preprocess

    model = CLIPModel.from_pretrained(folder).eval()
    pixels, _ = clip_preprocess(image, 32)
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pixels).pooler_output[0]
        txt = torch.stack([model.get_text_features(input_ids=torch.tensor([tok.encode(t).ids])).pooler_output[0]
                           for t in TEXTS])
    logits = 100 * (img / img.norm()) @ (txt / txt.norm(dim=-1, keepdim=True)).T
    return torch.softmax(logits, -1).tolist()


def _image(tmp_path: Path, shape: tuple[int, int, int], seed: int) -> str:
    path = tmp_path / "img.png"
    _png(path, torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8))
    return str(path)


def _options(image: str) -> dict[str, Any]:
    return {"clip_image": image, "texts": TEXTS}


def test_clip_zero_shot_hf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _clip_folder(tmp_path / "a")
    b = _clip_folder(tmp_path / "b", seed=1)
    image = _image(tmp_path, (40, 56, 3), 2)
    rep = verify(a, a, options=_options(image))
    clip = rep.extra["clip"]
    assert rep.ok and clip.max_abs_diff == 0.0
    assert sum(clip.probs_a) == pytest.approx(1.0)
    assert clip.probs_a == pytest.approx(_expected_probs(a, image), abs=1e-5)
    rep = verify(a, b, options=_options(image))
    assert not rep.ok and rep.extra["clip"].probs_b == pytest.approx(_expected_probs(b, image), abs=1e-5)
    code, out, _ = _run(capsys, "verify", a, a, "--clip-image", image, "--texts", *TEXTS)
    assert code == 0 and "CLIP zero-shot" in out and "a dog" in out and "max |A - B| = 0" in out
    code, out, _ = _run(capsys, "verify", a, b, "--clip-image", image, "--texts", *TEXTS, "--json")
    data = json.loads(out)
    assert code == 1 and data["extra"]["clip"]["texts"] == TEXTS and len(data["extra"]["clip"]["probs_b"]) == 3
    assert data["clip"] == data["extra"]["clip"]  # the deprecated top-level copy


def test_clip_zero_shot_nemo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_convert.plugins.manager import get_registry

    if "clip" not in get_registry().families:
        pytest.skip("the CLIP model family (nemo_convert_clip) is not installed")
    hf = _clip_folder(tmp_path / "hf")
    nemo = str(tmp_path / "clip.nemo")
    api.import_hf(hf, nemo)
    image = _image(tmp_path, (48, 36, 3), 3)
    rep = verify(hf, nemo, options=_options(image))
    assert rep.ok and rep.b.family == "clip" and rep.b.layout == "legacy"
    clip = rep.extra["clip"]
    assert clip.probs_a == clip.probs_b
    assert clip.probs_a == pytest.approx(_expected_probs(hf, image), abs=1e-5)
    code, out, _ = _run(capsys, "verify", nemo, hf, "--clip-image", image, "--texts", *TEXTS)
    assert code == 0 and "CLIP zero-shot" in out


def test_the_report_renders_through_the_generic_protocol() -> None:
    """The core shows the CLIP result only through ``render()`` (``VerifierResult``): a
    table of the probabilities and the largest difference, formatted as before the move."""
    from nemo_convert_clip.zero_shot import ClipReport

    rep = ClipReport("img.png", ["a dog", "a cat"], [0.25, 0.75], [0.5, 0.5], 0.25, "builtin")
    assert isinstance(rep, VerifierResult)
    table, line = rep.render()
    assert isinstance(table, ResultTable) and table.columns == ("text", "A", "B")
    assert table.title == "CLIP zero-shot on img.png (image read with builtin)"
    assert table.rows == (("a dog", "0.2500", "0.5000"), ("a cat", "0.7500", "0.5000"))
    assert line == "max |A - B| = 0.25"


def test_deprecated_spellings_still_work(tmp_path: Path) -> None:
    """``verify(clip_image=, texts=)`` and ``VerifyReport.clip`` (promised by docs/api.md before
    verifiers were generic) still work, with a DeprecationWarning."""
    a = _clip_folder(tmp_path / "a")
    image = _image(tmp_path, (20, 20, 3), 4)
    with pytest.warns(DeprecationWarning, match="options="):
        rep = verify(a, a, clip_image=Path(image), texts=TEXTS)
    with pytest.warns(DeprecationWarning, match="extra.get"):
        assert rep.clip is rep.extra["clip"]
    assert rep.extra["clip"].texts == TEXTS


def test_the_verifier_is_listed_with_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "plugins", "--json")
    clip = {v["name"]: v for v in json.loads(out)["verifiers"]}["clip"]
    assert code == 0 and clip["plugin"] == "clip" and clip["distribution"] == "nemo-convert"
    assert [(o["flag"], o["kind"], o["metavar"]) for o in clip["options"]] == [
        ("--clip-image", "value", "IMG"), ("--texts", "values", "TEXT")]
