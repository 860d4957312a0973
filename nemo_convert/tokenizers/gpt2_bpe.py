"""The GPT-2 BPE tokenizer of a Megatron ``.nemo`` as a Hugging Face tokenizer folder.

NeMo's ``tokenizer: {library: megatron, type: GPT2BPETokenizer, vocab_file: nemo:…,
merge_file: nemo:…}`` (``megatron_gpt_config.yaml`` L135-142 at NeMo ``8cfedd72``) is a
Hugging Face GPT-2 tokenizer over those two files:

- ``get_nmt_tokenizer`` maps ``GPT2BPETokenizer`` to ``megatron-gpt-345m``
  (``nemo/collections/nlp/modules/common/tokenizer_utils.py`` L25-29, L247-267), whose
  ``tokenizer_name`` is ``gpt2`` (``…/megatron/megatron_utils.py`` L48-54);
- ``get_tokenizer`` hands it, with the two files, to NeMo's ``AutoTokenizer`` wrapper
  (``tokenizer_utils.py`` L100-115, L151-161), which calls
  ``transformers.AutoTokenizer.from_pretrained("gpt2", vocab_file=…, merges_file=…)``
  (``…/huggingface/auto_tokenizer.py`` L169-199): GPT-2's tokenizer class with its defaults —
  ``<|endoftext|>`` as ``bos``/``eos``/``unk``, no prefix space, nothing added around the
  text;
- the wrapper then sets ``sep_token``/``cls_token`` to ``eos``/``bos`` (L104-124: no new
  id), and its ``text_to_ids`` is ``tokenize`` + ``convert_tokens_to_ids`` (L313-328).

Export writes the two files unchanged (``vocab.json``, ``merges.txt``), a
``tokenizer_config.json`` that names that class and those tokens, and the
``tokenizer.json`` that ``transformers`` builds from them (what ``verify`` compares and
what tools that read only ``tokenizer.json`` need).
"""

from __future__ import annotations

import json
import os
import tempfile

from nemo_convert.errors import InputError
from nemo_convert.tokenizers.hf_files import json_file

#: GPT-2's one special token: ``bos``, ``eos`` and ``unk`` (id 50256 in GPT-2's vocabulary).
ENDOFTEXT = "<|endoftext|>"


def _vocab(data: bytes, where: str) -> dict[str, int]:
    try:
        vocab = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{where}: the GPT-2 vocabulary is not valid JSON ({exc})") from None
    if not isinstance(vocab, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                              for k, v in vocab.items()):
        raise InputError(f"{where}: the GPT-2 vocabulary is not a JSON object of token → id")
    return vocab


def gpt2_facts(vocab_json: bytes, where: str) -> tuple[int, dict[str, int]]:
    """``(number of ids, {"bos_token_id", "eos_token_id"})`` of the GPT-2 tokenizer over
    ``vocab_json``: GPT-2's tokenizer appends ``<|endoftext|>`` when the vocabulary lacks it."""
    vocab = _vocab(vocab_json, where)
    eot = vocab.get(ENDOFTEXT, len(vocab))
    return len(vocab) + (ENDOFTEXT not in vocab), {"bos_token_id": eot, "eos_token_id": eot}


def gpt2_tokenizer_config() -> dict[str, object]:
    """The ``tokenizer_config.json`` of NeMo's GPT-2 BPE tokenizer (GPT-2's class and defaults)."""
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": ENDOFTEXT,
        "eos_token": ENDOFTEXT,
        "unk_token": ENDOFTEXT,
        "add_prefix_space": False,
        "add_bos_token": False,
        "errors": "replace",
        # NeMo's ids_to_text joins tokens with convert_tokens_to_string: no clean-up of spaces
        "clean_up_tokenization_spaces": False,
    }


def gpt2_hf_files(vocab_json: bytes, merges_txt: bytes, where: str) -> dict[str, bytes]:
    """The HF tokenizer folder of NeMo's GPT-2 BPE tokenizer over these two files.

    Raises:
        InputError: the vocabulary is not a JSON object of ids, or the merges are not text.
    """
    _vocab(vocab_json, where)
    try:
        merges_txt.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: the GPT-2 merges file is not UTF-8 text ({exc})") from None
    files = {"vocab.json": vocab_json, "merges.txt": merges_txt, "tokenizer_config.json": json_file(gpt2_tokenizer_config())}
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="nemo-convert-gpt2-") as tmp:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        try:
            tok = AutoTokenizer.from_pretrained(tmp)
            text = tok.backend_tokenizer.to_str()
        except Exception as exc:  # transformers raises many kinds on bad files
            raise InputError(f"{where}: transformers cannot build a GPT-2 tokenizer from the vocabulary and "
                             f"merges ({type(exc).__name__}: {exc})") from None
    files["tokenizer.json"] = (text + "\n").encode("utf-8")
    return files
