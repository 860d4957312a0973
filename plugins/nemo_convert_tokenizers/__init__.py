"""Tokenizer patchers shipped with nemo-convert: SentencePiece ``.model`` files and HF
``tokenizer.json`` folders. Registered through the ``nemo_convert`` entry-point group like
any third-party plugin; the work is done by :mod:`nemo_convert.tokenizers`."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from nemo_convert import TokenizerPatcher, hookimpl
from nemo_convert.errors import InputError
from nemo_convert.tokenizers import PatchReport, add_tokens_hf, add_tokens_sentencepiece, detect_tokenizer_kind


def _is_kind(kind: str) -> Callable[[str], bool]:
    def detect(path: str) -> bool:
        try:
            return detect_tokenizer_kind(path) == kind
        except InputError:
            return False
    return detect


def _sentencepiece(src: str, dst: str, tokens: Sequence[str], options: dict[str, Any]) -> PatchReport:
    with open(src, "rb") as f:
        data, report = add_tokens_sentencepiece(f.read(), tokens, piece_type=options.get("piece_type", "user_defined"),
                                                skip_existing=bool(options.get("skip_existing")))
    with open(dst, "wb") as f:
        f.write(data)
    return report


def _hf(src: str, dst: str, tokens: Sequence[str], options: dict[str, Any]) -> PatchReport:
    # SentencePiece CONTROL ~ HF special token (skipped when decoding); USER_DEFINED ~ a
    # plain added token (decoded as text). Both are matched in raw text by tokenizers.
    return add_tokens_hf(src, dst, tokens, special=options.get("piece_type") == "control",
                         skip_existing=bool(options.get("skip_existing")))


SENTENCEPIECE = TokenizerPatcher(name="sentencepiece", detect=_is_kind("sentencepiece"), add_tokens=_sentencepiece,
                                 description="SentencePiece tokenizer.model: append USER_DEFINED or CONTROL pieces")
HF = TokenizerPatcher(name="hf", detect=_is_kind("hf"), add_tokens=_hf,
                      description="Hugging Face tokenizer folder (tokenizer.json): append added tokens")


@hookimpl
def nemo_convert_tokenizer_patchers() -> list[TokenizerPatcher]:
    return [SENTENCEPIECE, HF]


__all__ = ["HF", "SENTENCEPIECE", "nemo_convert_tokenizer_patchers"]
