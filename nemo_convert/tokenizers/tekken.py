"""The tiktoken (Tekken) tokenizer of a ``.nemo`` as a Hugging Face tokenizer folder.

**What NeMo stores.** NeMo's Mistral converter, given a folder with Mistral's
``tekken.json``, writes only its ``vocab`` list to a file and records
``tokenizer: {library: tiktoken, type: tiktoken, vocab_file: <that file>, model: null, …}``
(``scripts/checkpoint_converters/convert_mistral_7b_hf_to_nemo.py`` L141-164 at NeMo
``8cfedd72``); ``vocab_file`` becomes a ``nemo:`` artifact. The list holds one
``{"rank", "token_bytes" (base64), "token_str"}`` per BPE rank, rank ``i`` at index ``i``,
ranks 0-255 the single bytes.

**How NeMo encodes with it.** ``get_nmt_tokenizer`` builds ``TiktokenTokenizer(vocab_file=…)``
with nothing else from the config (``tokenizer_utils.py`` L272-275), so its defaults hold
(``nemo/collections/common/tokenizers/tiktoken_tokenizer.py`` L31-62, L65-69, L105-189,
L223-226):

- ``vocab_size`` 131072 ids, of which the first ``num_special_tokens`` = 1000 are special:
  ``<unk>``, ``<s>``, ``</s>``, ``<mask>``, ``<pad>``, ``<cls>``, ``<sep>``, then
  ``<SPECIAL_7>`` … ``<SPECIAL_999>`` (NeMo of July 2024, ``425d5dd7``, named only the first
  three; the ids are the same);
- the BPE uses the first ``131072 - 1000`` ranks of the list, and the pre-tokenizer pattern
  ``PATTERN_TIKTOKEN``;
- ``text_to_ids(text)`` is ``tiktoken``'s encoding with no special tokens, each rank shifted
  by 1000. Text that spells a special token (``"<s>"``) is encoded as plain bytes.

Mistral's own ``tekken.json`` (``{"config": {pattern, num_vocab_tokens, default_vocab_size,
default_num_special_tokens, version}, "vocab": [...], "special_tokens": [...]}``,
mistral-common ``src/mistral_common/tokens/tokenizers/tekken.py``, ``TekkenConfig`` /
``ModelData`` / ``Tekkenizer.from_file``, commit ``aa5223ce``) encodes the same way, with its
own sizes and names (``Tekkenizer.encode``: ``tiktoken`` with no special tokens, shifted by
the number of special tokens). A ``.nemo`` whose artifact is such a file is read with them.

**What export writes.** ``tokenizer.json`` from ``transformers``' own Tekken conversion
(``transformers.integrations.mistral.convert_tekken_tokenizer``), fed a ``tekken.json``
that states NeMo's sizes, pattern and special names; and a ``tokenizer_config.json`` with
``split_special_tokens: true``, so that ``AutoTokenizer`` — like NeMo and mistral-common —
never turns text into a special id (``bos``/``eos`` stay reachable by id:
``tokenizer.bos_token_id``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from nemo_convert.errors import InputError, NemoConvertError
from nemo_convert.tokenizers.hf_files import json_file

#: ``PATTERN_TIKTOKEN`` of NeMo's ``TiktokenTokenizer`` (tiktoken_tokenizer.py L66), the
#: pattern of Mistral's Tekken tokenizers.
NEMO_TIKTOKEN_PATTERN = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
#: ``DEFAULT_TIKTOKEN_MAX_VOCAB`` and the ``num_special_tokens`` default (L67, L111).
NEMO_TIKTOKEN_VOCAB_SIZE = 2**17
NEMO_TIKTOKEN_NUM_SPECIAL = 1000
#: ``SPECIAL_TOKENS`` and ``SPECIAL_TOKEN_TEMPLATE`` (L68-69).
NEMO_TIKTOKEN_SPECIALS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
SPECIAL_TEMPLATE = "<SPECIAL_{id}>"


class TokenizerConversionError(NemoConvertError):
    """``transformers`` could not turn a tokenizer into HF files (too old, or it failed)."""


@dataclass(frozen=True)
class TekkenSpec:
    """A tiktoken vocabulary with the sizes and special tokens it is encoded with."""

    vocab: tuple[dict[str, Any], ...]  # the ranks the BPE uses (``vocab_size - num_special``)
    pattern: str
    vocab_size: int
    num_special: int
    named_specials: tuple[str, ...]  # ids 0, 1, …; fillers follow up to ``num_special``
    origin: str  # "nemo" (NeMo's vocabulary list) or "tekken" (Mistral's tekken.json)

    def specials(self) -> list[str]:
        """Every special token, by id."""
        n = len(self.named_specials)
        return list(self.named_specials) + [SPECIAL_TEMPLATE.format(id=i) for i in range(n, self.num_special)]

    def special_ids(self) -> dict[str, int]:
        """``bos_token_id`` / ``eos_token_id`` (and ``pad_token_id`` for Mistral's own
        ``<pad>``; NeMo's ``<pad>`` is an id Mistral's models use for something else)."""
        names = {"bos_token_id": "<s>", "eos_token_id": "</s>"}
        if self.origin == "tekken":
            names["pad_token_id"] = "<pad>"
        return {k: self.named_specials.index(v) for k, v in names.items() if v in self.named_specials}


def _ranks(vocab: Any, keep: int, where: str) -> tuple[dict[str, Any], ...]:
    """The first ``keep`` entries, checked as NeMo's ``reload_mergeable_ranks`` checks them."""
    if not isinstance(vocab, list):
        raise InputError(f"{where}: the tiktoken vocabulary is not a list")
    if len(vocab) < keep:
        raise InputError(f"{where}: the tiktoken vocabulary has {len(vocab)} ranks; its tokenizer uses "
                         f"{keep} (vocab_size minus the special tokens)")
    seen: set[bytes] = set()
    for i, x in enumerate(vocab[:keep]):
        if not isinstance(x, dict) or set(x) != {"rank", "token_bytes", "token_str"} or x["rank"] != i:
            raise InputError(f"{where}: tiktoken vocabulary entry {i} is not "
                             f"{{rank: {i}, token_bytes, token_str}}")
        try:
            raw = base64.b64decode(x["token_bytes"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise InputError(f"{where}: tiktoken vocabulary entry {i} has no base64 token_bytes") from None
        if (i < 256 and raw != bytes([i])) or not raw or raw in seen:
            raise InputError(f"{where}: tiktoken vocabulary entry {i} is not a valid BPE rank "
                             "(ranks 0-255 are the single bytes; every token is distinct)")
        seen.add(raw)
    return tuple(vocab[:keep])


def read_tekken(data: bytes, where: str) -> TekkenSpec:
    """The vocabulary of a ``tiktoken`` artifact: NeMo's list (with NeMo's sizes) or a
    Mistral ``tekken.json`` (with its own).

    Raises:
        InputError: not JSON, not one of those shapes, or a rank fails NeMo's checks.
    """
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{where}: the tiktoken vocabulary is not valid JSON ({exc})") from None
    if isinstance(obj, list):
        keep = NEMO_TIKTOKEN_VOCAB_SIZE - NEMO_TIKTOKEN_NUM_SPECIAL
        return TekkenSpec(_ranks(obj, keep, where), NEMO_TIKTOKEN_PATTERN, NEMO_TIKTOKEN_VOCAB_SIZE,
                          NEMO_TIKTOKEN_NUM_SPECIAL, NEMO_TIKTOKEN_SPECIALS, "nemo")
    if not isinstance(obj, dict) or not isinstance(obj.get("config"), dict) or "vocab" not in obj:
        raise InputError(f"{where}: neither NeMo's tiktoken vocabulary (a list of ranks) nor a tekken.json")
    config = obj["config"]
    pattern, size, num = config.get("pattern"), config.get("default_vocab_size"), config.get("default_num_special_tokens")
    if not isinstance(pattern, str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in (size, num)):
        raise InputError(f"{where}: tekken.json config lacks pattern, default_vocab_size or default_num_special_tokens")
    specials = obj.get("special_tokens")
    if not isinstance(specials, list) or not all(isinstance(s, dict) and isinstance(s.get("token_str"), str)
                                                 and isinstance(s.get("rank"), int) for s in specials):
        raise InputError(f"{where}: tekken.json has no special_tokens list (an old Tekken file: mistral-common "
                         "supplies its names); not supported")
    named = tuple(s["token_str"] for s in sorted(specials, key=lambda s: s["rank"]))
    if sorted(s["rank"] for s in specials) != list(range(len(named))) or len(set(named)) != len(named) \
            or not 0 < len(named) <= num < size:
        raise InputError(f"{where}: tekken.json special tokens are not distinct ranks 0…n-1 within "
                         "default_num_special_tokens")
    return TekkenSpec(_ranks(obj["vocab"], size - num, where), pattern, size, num, named, "tekken")


def tekken_tokenizer_config(spec: TekkenSpec) -> dict[str, Any]:
    """``tokenizer_config.json``: the generic fast class, the special tokens by name, and
    ``split_special_tokens`` (text never becomes a special id, as in NeMo)."""
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "split_special_tokens": True,
                           "clean_up_tokenization_spaces": False}
    for role, name in (("unk_token", "<unk>"), ("bos_token", "<s>"), ("eos_token", "</s>")):
        if name in spec.named_specials:
            cfg[role] = name
    if "pad_token_id" in spec.special_ids():
        cfg["pad_token"] = "<pad>"
    return cfg


def _check(tok: Any, spec: TekkenSpec, where: str) -> None:
    """What NeMo's encoding fixes: the id count, the special ids, ranks shifted by them."""
    specials = spec.specials()
    byte_token = tok.id_to_token(spec.num_special)  # rank 0 = byte 0
    ok = (tok.get_vocab_size(with_added_tokens=True) == spec.vocab_size
          and all(tok.token_to_id(s) == i for i, s in enumerate(specials))
          and byte_token is not None and tok.token_to_id(byte_token) == spec.num_special)
    if not ok:
        raise TokenizerConversionError(f"{where}: transformers' Tekken conversion did not give {spec.vocab_size} "
                                       f"ids with the {spec.num_special} special tokens first")


def tekken_hf_files(spec: TekkenSpec, where: str) -> dict[str, bytes]:
    """``tokenizer.json`` (``transformers``' Tekken conversion) and ``tokenizer_config.json``.

    Raises:
        TokenizerConversionError: this ``transformers`` has no Tekken conversion, or it failed.
    """
    try:
        import transformers
        from transformers.integrations.mistral import convert_tekken_tokenizer
    except ImportError:
        raise TokenizerConversionError(
            f"{where}: this transformers has no Tekken conversion (transformers.integrations.mistral."
            "convert_tekken_tokenizer); install a newer transformers to export the tokenizer") from None
    tekken = {
        "config": {"pattern": spec.pattern, "num_vocab_tokens": len(spec.vocab),
                   "default_vocab_size": spec.vocab_size, "default_num_special_tokens": spec.num_special,
                   "version": "v3"},
        "vocab": list(spec.vocab),
        "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(spec.named_specials)],
    }
    with tempfile.TemporaryDirectory(prefix="nemo-convert-tekken-") as tmp:
        path = os.path.join(tmp, "tekken.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(tekken))  # json.dump streams through the pure-Python encoder: 10× slower
        try:
            tok = convert_tekken_tokenizer(path).backend_tokenizer
        except Exception as exc:  # ImportError for mistral-common in some versions, and any failure
            raise TokenizerConversionError(
                f"{where}: transformers {transformers.__version__} could not convert the Tekken vocabulary "
                f"({type(exc).__name__}: {exc})") from None
    _check(tok, spec, where)
    return {"tokenizer.json": (tok.to_str() + "\n").encode("utf-8"),
            "tokenizer_config.json": json_file(tekken_tokenizer_config(spec))}
