"""CLIP zero-shot probabilities, computed the way NeMo's ``megatron_clip_infer.py`` does:
the CLIP plugin's verifier (``verify --clip-image IMG --texts …``).

Image features and text features are L2-normalised and the probabilities are
``softmax(100 · image · textᵀ)`` (a fixed 100, not the stored ``logit_scale``). The image
goes through OpenAI's transform (:func:`~nemo_convert_clip.image.clip_preprocess`);
each text is tokenised with the checkpoint's own tokenizer (``tokenizer.json``, which
adds BOS/EOS through its post-processor, or ``AutoTokenizer`` otherwise), truncated to
the text tower's positions with the last token forced to EOS, and padded with EOS.
The model is ``transformers.CLIPModel`` loaded in float32 from an HF folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from nemo_convert import ResultTable
from nemo_convert.errors import InputError
from nemo_convert_clip.image import clip_preprocess


@dataclass
class ClipReport:
    """Zero-shot probabilities (softmax of 100 · image · textᵀ) on both sides: the result
    ``verify`` keeps in ``VerifyReport.extra["clip"]`` (``--json``: its fields)."""

    image: str
    texts: list[str]
    probs_a: list[float]
    probs_b: list[float]
    max_abs_diff: float
    image_reader: str  # "PIL" or "builtin"

    def render(self) -> list[str | ResultTable]:
        """The text report: the probabilities of each text on both sides, and the largest
        difference (``nemo_convert.VerifierResult``)."""
        rows = tuple((t, f"{x:.4f}", f"{y:.4f}") for t, x, y in zip(self.texts, self.probs_a, self.probs_b))
        return [ResultTable(f"CLIP zero-shot on {self.image} (image read with {self.image_reader})",
                            ("text", "A", "B"), rows),
                f"max |A - B| = {self.max_abs_diff:.3g}"]


def _features(out: Any) -> torch.Tensor:
    """transformers 5 returns an output object whose ``pooler_output`` is the projection."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _encode_texts(folder: str, texts: Sequence[str], max_len: int) -> list[list[int]] | None:
    path = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(path):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        tok.no_padding()
        tok.no_truncation()
        return [list(e.ids) for e in tok.encode_batch(list(texts))]
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(folder)
    except Exception:
        return None
    return [list(auto(t)["input_ids"]) for t in texts]


def tokenize(folders: Sequence[str], texts: Sequence[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``texts``, from the first folder with a tokenizer."""
    for folder in folders:
        ids = _encode_texts(folder, texts, max_len)
        if ids is not None:
            break
    else:
        raise InputError("no tokenizer for the CLIP texts: neither checkpoint carries tokenizer.json or a "
                         "tokenizer transformers can load")
    rows = []
    for seq in ids:
        if not seq:
            raise InputError("the tokenizer encoded a text to nothing")
        if len(seq) > max_len:
            seq = seq[:max_len - 1] + [seq[-1]]  # NeMo: truncate, keep EOS last
        rows.append(seq)
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    return input_ids, mask


def zero_shot(folder: str, image: str, texts: Sequence[str], *,
              tokenizer_folders: Sequence[str] = ()) -> tuple[list[float], str]:
    """Zero-shot probabilities of ``texts`` for ``image`` with the CLIP model in
    ``folder`` (an HF folder); and which image reader was used."""
    from transformers import CLIPModel

    try:
        model = CLIPModel.from_pretrained(folder, dtype=torch.float32)
    except Exception as exc:
        raise InputError(f"{folder}: transformers cannot load it as a CLIPModel ({type(exc).__name__}: "
                         f"{exc})") from None
    model.eval()
    config: Any = model.config  # a CLIPConfig: its sub-configs are CLIPVisionConfig / CLIPTextConfig
    pixel_values, reader = clip_preprocess(image, int(config.vision_config.image_size))
    ids, mask = tokenize([folder, *tokenizer_folders], texts, int(config.text_config.max_position_embeddings))
    with torch.no_grad():
        img = _features(model.get_image_features(pixel_values=pixel_values))
        txt = _features(model.get_text_features(input_ids=ids, attention_mask=mask))
        img = img / img.norm(dim=-1, keepdim=True)
        txt = txt / txt.norm(dim=-1, keepdim=True)
        probs = torch.softmax(100.0 * img @ txt.T, dim=-1)[0]
    return [float(p) for p in probs], reader


def check_zero_shot_options(options: dict[str, Any]) -> None:
    """Refuse ``verify`` options the zero-shot check cannot run with, before anything is read."""
    image, texts = options.get("clip_image"), options.get("texts")
    if texts and image is None:
        raise InputError("--texts needs --clip-image")
    if not texts:
        raise InputError("the CLIP check needs texts (--texts \"a dog\" \"a cat\" …)")
    if image is None or not os.path.isfile(image):
        raise InputError(f"{image}: no such image file")


def zero_shot_report(folder_a: str, folder_b: str, options: dict[str, Any]) -> ClipReport:
    """The zero-shot probabilities of ``options["texts"]`` for ``options["clip_image"]``
    with both CLIP models (each side's texts tokenised with its own tokenizer, the other's
    as a fallback)."""
    image, texts = str(options["clip_image"]), list(options["texts"])
    pa, reader = zero_shot(folder_a, image, texts, tokenizer_folders=[folder_b])
    pb, _ = zero_shot(folder_b, image, texts, tokenizer_folders=[folder_a])
    return ClipReport(image, texts, pa, pb, max(abs(x - y) for x, y in zip(pa, pb)), reader)
