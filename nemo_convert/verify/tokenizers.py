"""Compare two tokenizers by what they do: vocabulary size and the encoding of a probe set.

Each side's tokenizer files are given as ``{file name: bytes}`` (``tokenizer.model``,
``tokenizer.json``, ``tokenizer_config.json`` …). A SentencePiece tokenizer is loaded
from the ``.model`` bytes, an HF one with ``tokenizers.Tokenizer.from_str`` on
``tokenizer.json``; each kind present on both sides encodes every probe text: built-in
short sentences, digits, punctuation and non-Latin scripts, plus every special / added
token of either side, alone and inside text.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from nemo_convert.verify.configs import diff_config
from nemo_convert.verify.report import EncodingDiff, TokenizerFileDiff, TokenizerReport

SP_FILE = "tokenizer.model"
HF_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"

PROBE_TEXTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew lines\r\nand  double  spaces",
    "0 1 2 3 4 5 6 7 8 9 10 42 007 123456789 3.14159 -2.5e-3 1,000,000 2024-01-31 12:34:56",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "... --- !!! ??? ((( ))) <<< >>> ''' \"\"\"",
    "naïve café résumé façade Zürich — “quotes” ‘single’ … «guillemets»",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Ελληνικά, русский текст, العربية, עברית, हिन्दी, ไทย",
    "emoji 🙂🚀👍🏽 and symbols ∑∫√∞ ≤ ≥ ≠ → ©®™ €£¥",
    "def f(x):\n    return x ** 2  # a comment",
    "https://example.com/path?q=1&r=two user@example.com #hashtag @mention",
    "CamelCaseWord snake_case_word kebab-case-word ALLCAPS",
    "a",
    "",
)

_MAX_EXAMPLES = 5
_SP_SPECIAL_TYPES = (2, 3, 4)  # UNKNOWN, CONTROL, USER_DEFINED


def _sp_special(model: bytes) -> list[str]:
    from sentencepiece import sentencepiece_model_pb2 as pb2

    proto = pb2.ModelProto()
    proto.ParseFromString(model)
    return [p.piece for p in proto.pieces if p.type in _SP_SPECIAL_TYPES]


def _hf_special(text: str) -> list[str]:
    data = json.loads(text)
    return [str(t.get("content")) for t in data.get("added_tokens") or [] if isinstance(t, dict)]


def _splits_special_tokens(config: bytes | None) -> bool:
    """Whether ``tokenizer_config.json`` asks ``AutoTokenizer`` to encode special tokens'
    text as plain text (``split_special_tokens``: a Tekken tokenizer export writes, as NeMo
    and mistral-common encode)."""
    try:
        obj = json.loads(config.decode("utf-8")) if config is not None else None
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(obj, dict) and obj.get("split_special_tokens") is True


def probe_texts(tokens: Iterable[str], base: Iterable[str] = PROBE_TEXTS) -> list[str]:
    """The probe set: ``base`` plus each token alone, glued to words and in a sentence."""
    out = list(base)
    for t in sorted(set(tokens)):
        out += [t, f"a{t}b", f"The {t} token, twice:{t}{t}."]
    return out


class _Side:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.sp: Any = None
        self.hf: Any = None
        self.errors: list[str] = []
        if SP_FILE in files:
            try:
                import sentencepiece

                self.sp = sentencepiece.SentencePieceProcessor(model_proto=files[SP_FILE])
            except Exception as exc:  # sentencepiece raises RuntimeError
                self.errors.append(f"{SP_FILE} does not load: {exc}")
        if HF_FILE in files:
            try:
                from tokenizers import Tokenizer

                self.hf = Tokenizer.from_str(files[HF_FILE].decode("utf-8"))
            except Exception as exc:  # tokenizers raises plain Exception
                self.errors.append(f"{HF_FILE} does not load: {exc}")
            else:
                if _splits_special_tokens(files.get(CONFIG_FILE)):
                    self.hf.encode_special_tokens = True  # as AutoTokenizer runs it

    def special(self, kind: str) -> list[str]:
        try:
            if kind == "sentencepiece":
                return _sp_special(self.files[SP_FILE])
            return _hf_special(self.files[HF_FILE].decode("utf-8"))
        except Exception:
            return []

    def vocab_size(self, kind: str) -> int:
        return int(self.sp.get_piece_size()) if kind == "sentencepiece" else int(
            self.hf.get_vocab_size(with_added_tokens=True))

    def encode(self, kind: str, text: str) -> list[int]:
        if kind == "sentencepiece":
            return list(self.sp.encode(text, out_type=int))
        return list(self.hf.encode(text).ids)  # with the post-processor (BOS/EOS) as configured


def _compare_file(name: str, a: bytes | None, b: bytes | None) -> TokenizerFileDiff:
    if a is None:
        return TokenizerFileDiff(name, "missing_a")
    if b is None:
        return TokenizerFileDiff(name, "missing_b")
    if a == b:
        return TokenizerFileDiff(name, "identical")
    if name.endswith(".json"):
        try:
            ja, jb = json.loads(a.decode("utf-8")), json.loads(b.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return TokenizerFileDiff(name, "different")
        diffs = diff_config(ja, jb)
        return TokenizerFileDiff(name, "different" if diffs else "equivalent", diffs[:50])
    return TokenizerFileDiff(name, "different")


def compare_tokenizers(files_a: dict[str, bytes], files_b: dict[str, bytes],
                       texts: Iterable[str] = PROBE_TEXTS) -> TokenizerReport:
    """Compare the tokenizer files of two checkpoints: each file (bytes, or parsed JSON),
    then, per tokenizer kind both sides have, vocab sizes and probe encodings."""
    rep = TokenizerReport()
    if not files_a and not files_b:
        rep.notes.append("neither checkpoint carries tokenizer files; nothing compared")
        return rep
    for name in sorted(set(files_a) | set(files_b)):
        rep.files.append(_compare_file(name, files_a.get(name), files_b.get(name)))
    side_a, side_b = _Side(files_a), _Side(files_b)
    rep.notes += [f"A: {e}" for e in side_a.errors] + [f"B: {e}" for e in side_b.errors]
    for kind, attr in (("sentencepiece", "sp"), ("hf", "hf")):
        if getattr(side_a, attr) is None or getattr(side_b, attr) is None:
            continue
        spec_a, spec_b = side_a.special(kind), side_b.special(kind)
        probes = probe_texts(set(spec_a) | set(spec_b), texts)
        diff = EncodingDiff(kind, side_a.vocab_size(kind), side_b.vocab_size(kind), len(probes), 0,
                            only_a=sorted(set(spec_a) - set(spec_b)), only_b=sorted(set(spec_b) - set(spec_a)))
        for text in probes:
            ea, eb = side_a.encode(kind, text), side_b.encode(kind, text)
            if ea != eb:
                diff.differing += 1
                if len(diff.examples) < _MAX_EXAMPLES:
                    diff.examples.append({"text": text, "a": ea, "b": eb})
        rep.encodings.append(diff)
    return rep
