"""Export writes the tokenizer of every kind NeMo records, and it encodes as NeMo's does.

Each test builds a ``.nemo`` whose ``model_config.yaml`` is NeMo-native (no section of ours)
with the ``tokenizer:`` section NeMo writes for that kind and the artifacts under NeMo's
``<32 hex>_<name>`` names, exports it, loads the output with ``transformers.AutoTokenizer``
and compares its ids, on a corpus of ASCII, other scripts, whitespace runs, digits and the
special tokens' text, with NeMo's own encoding — rebuilt from NeMo's source (cited per test)
with the libraries NeMo itself calls (``transformers``' GPT-2 tokenizer, ``tiktoken``,
SentencePiece). The weights are a tiny Llama of the tokenizer's size, its vocabulary padded
as Megatron pads it, so that the trim to the true size is checked too.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import os
from typing import Any

import pytest
import regex
import torch
import yaml
from test_first_steps import _cache_like_huggingface_hub
from tiny_models import corpus, hf_tensors, make_tiny_llama, write_sentencepiece

from nemo_convert import api
from nemo_convert.convert.nemo_write import Parallelism
from nemo_convert.tokenizers.tekken import NEMO_TIKTOKEN_PATTERN
from nemo_convert.verify.tokenizers import PROBE_TEXTS

TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"
TINY = dict(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2)

#: What the ids are compared on: the verify probes, whitespace runs, digits, specials' text.
CORPUS: list[str] = list(PROBE_TEXTS) + corpus(40, seed=3) + [
    "   three spaces, \t\ttabs,\n\n\nthree new lines\r\n\r\nand  \u3000 an ideographic space",
    "0123456789 1234567890123 3.14159 -42 1e-9 0x1F 2026-12-03",
    "<s>", "</s>", "<unk>", "<pad>", "<mask>", "a<s>b</s>c<unk>", "<SPECIAL_7> <SPECIAL_999>",
    "[INST] question [/INST] answer</s>", "<|endoftext|>", "one<|endoftext|>two <|endoftext|> three",
    "<|begin_of_text|>hi<|end_of_text|>", "ünïcödé ﬁ ﬀ Ǆ 𝔘𝔫𝔦 🙂👍🏽 中文 日本語 한국어 العربية",
]


def _artifact(folder: str, name: str, data: bytes) -> str:
    """Store ``data`` as NeMo stores an artifact; returns its ``nemo:`` reference."""
    member = f"{hashlib.md5(data).hexdigest()}_{name}"
    with open(os.path.join(folder, member), "wb") as f:
        f.write(data)
    return "nemo:" + member


def _nemo(tmp: Any, vocab: int, tokenizer: dict[str, Any], *, tp: int = 2, **overrides: Any) -> tuple[str, str]:
    """``(unpacked .nemo, its HF source)``: a tiny Llama of ``vocab`` ids imported at TP=``tp``
    (legacy layout: the embedding padded to Megatron's multiple), its config made NeMo-native
    with ``tokenizer`` as its tokenizer section."""
    hf, nemo = str(tmp / "hf"), str(tmp / "m.nemo")
    make_tiny_llama(hf, tokenizer=False, vocab_size=vocab, **{**TINY, **overrides})
    api.import_hf(hf, nemo, packed=False, layout="legacy", parallel=Parallelism(tp, 1))
    path = os.path.join(nemo, "model_config.yaml")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg.pop("nemo_convert")
    cfg.update(tokenizer=tokenizer, target=TARGET, nemo_version="2.0.0", scale_positional_embedding=False)
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return nemo, hf


def _export(nemo: str, out: str) -> Any:
    rep = api.export_hf(nemo, out)
    assert all("\n" not in w for w in rep.warnings), rep.warnings
    return rep


def _check_weights(out: str, hf: str, vocab: int) -> None:
    """The export trimmed the padded rows: config and tensors are the source's."""
    assert json.load(open(os.path.join(out, "config.json")))["vocab_size"] == vocab
    a, b = hf_tensors(out), hf_tensors(hf)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in b)


def _same_ids(tok: Any, reference: Any, texts: list[str] = CORPUS) -> None:
    """``AutoTokenizer`` encodes every text as ``reference(text)`` (NeMo's ``text_to_ids``),
    and its ``tokenize`` + ``convert_tokens_to_ids`` agree (what NeMo's HF wrapper calls)."""
    for text in texts:
        want = reference(text)
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.convert_tokens_to_ids(tok.tokenize(text)) == want, text


# ------------------------------------------------------------------ GPT-2 BPE (library: megatron)

#: GPT-2's pre-tokenizer pattern (transformers' GPT2Tokenizer ``pat``; tiktoken's ``gpt2``).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character table (the one in its vocab.json)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def _gpt2_files(tmp: Any) -> tuple[bytes, bytes]:
    """A GPT-2 BPE vocabulary trained on the corpus (``tokenizers``' byte-level BPE), with
    ``<|endoftext|>`` as its last id, as in GPT-2's own ``vocab.json``."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(300) + CORPUS, vocab_size=700, min_frequency=2, special_tokens=[])
    folder = str(tmp / "bpe")
    os.makedirs(folder)
    bpe.save_model(folder)
    vocab = json.load(open(os.path.join(folder, "vocab.json")))
    vocab["<|endoftext|>"] = len(vocab)
    return json.dumps(vocab).encode(), open(os.path.join(folder, "merges.txt"), "rb").read()


def _tiktoken_gpt2(vocab_json: bytes, merges_txt: bytes) -> Any:
    """An independent GPT-2 encoder: ``tiktoken`` over the same merges (rank = merge order,
    as tiktoken's own ``gpt2`` encoding), ids mapped back through ``vocab.json``."""
    import tiktoken

    back = {c: b for b, c in _byte_unicode().items()}
    vocab = json.loads(vocab_json)
    raw = {bytes(back[c] for c in tok): i for tok, i in vocab.items() if tok != "<|endoftext|>"}
    ranks = {bytes([b]): b for b in range(256)}
    for line in merges_txt.decode().splitlines()[1:]:
        left, right = line.split(" ")
        ranks.setdefault(bytes(back[c] for c in left + right), len(ranks))
    enc = tiktoken.Encoding("gpt2-test", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    to_id = {r: raw[t] for t, r in ranks.items()} | {len(ranks): vocab["<|endoftext|>"]}
    return lambda text: [to_id[r] for r in enc.encode(text, allowed_special="all")]


def test_gpt2_bpe_tokenizer_is_written_and_encodes_as_nemo(tmp_path: Any) -> None:
    """``library: megatron, type: GPT2BPETokenizer`` with ``vocab_file``/``merge_file``
    artifacts (megatron_gpt_config.yaml L135-142, NeMo 8cfedd72). NeMo builds
    ``transformers.AutoTokenizer.from_pretrained("gpt2", vocab_file=…, merges_file=…)``
    (tokenizer_utils.py L247-267, L100-161; megatron_utils.py L48-54; auto_tokenizer.py
    L169-199): GPT-2's tokenizer class over the two files; ``text_to_ids`` is ``tokenize`` +
    ``convert_tokens_to_ids`` (L313-328)."""
    from transformers import AutoTokenizer, GPT2Tokenizer

    vocab_json, merges = _gpt2_files(tmp_path)
    vocab = len(json.loads(vocab_json))
    nemo, hf = _nemo(tmp_path, vocab, {})
    section = {"library": "megatron", "type": "GPT2BPETokenizer", "model": None,
               "vocab_file": _artifact(nemo, "gpt2-vocab.json", vocab_json),
               "merge_file": _artifact(nemo, "gpt2-merges.txt", merges), "delimiter": None,
               "sentencepiece_legacy": False}
    _set_tokenizer(nemo, section)
    out = str(tmp_path / "out")
    rep = _export(nemo, out)
    assert rep.warnings == []
    _check_weights(out, hf, vocab)  # 701 ids, stored padded to 768 (128 × TP 2)
    assert {"vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json"} <= set(os.listdir(out))
    assert open(os.path.join(out, "vocab.json"), "rb").read() == vocab_json
    assert open(os.path.join(out, "merges.txt"), "rb").read() == merges
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["bos_token_id"] == cfg["eos_token_id"] == vocab - 1 and "pad_token_id" not in cfg

    ref_folder = str(tmp_path / "gpt2-files")  # the class NeMo gets, over the same two files
    os.makedirs(ref_folder)
    open(os.path.join(ref_folder, "vocab.json"), "wb").write(vocab_json)
    open(os.path.join(ref_folder, "merges.txt"), "wb").write(merges)
    nemo_tok = GPT2Tokenizer.from_pretrained(ref_folder)
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == len(nemo_tok) == vocab and tok.eos_token == tok.bos_token == "<|endoftext|>"
    _same_ids(tok, lambda text: nemo_tok.convert_tokens_to_ids(nemo_tok.tokenize(text)))
    _same_ids(tok, _tiktoken_gpt2(vocab_json, merges))
    assert tok("hello world")["input_ids"] == tok.encode("hello world", add_special_tokens=False)
    assert tok.decode(tok.encode(CORPUS[0])) == CORPUS[0]

    # verify compares the .nemo's tokenizer (as export writes it) with the folder's
    vrep = api.verify(nemo, out)
    encodings = {e.kind: e for e in vrep.tokenizer.encodings}
    assert encodings["hf"].differing == 0 and encodings["hf"].vocab_size_a == encodings["hf"].vocab_size_b == vocab


def _set_tokenizer(nemo: str, section: dict[str, Any]) -> None:
    path = os.path.join(nemo, "model_config.yaml")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg["tokenizer"] = section
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)


def test_gpt2_bpe_without_files_is_one_warning_or_the_cached_gpt2(tmp_path: Any, monkeypatch: Any) -> None:
    """A GPT2BPETokenizer section naming no files makes NeMo fetch GPT-2's own
    (megatron_utils.py L158-193): export takes them from the hub cache, never downloads."""
    vocab_json, merges = _gpt2_files(tmp_path)
    vocab = len(json.loads(vocab_json))
    nemo, _ = _nemo(tmp_path, vocab, {"library": "megatron", "type": "GPT2BPETokenizer", "model": None,
                                      "vocab_file": None, "merge_file": None, "delimiter": None})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    rep = _export(nemo, str(tmp_path / "out"))
    assert [w for w in rep.warnings if "`hf download openai-community/gpt2 --include vocab.json merges.txt`" in w]
    assert not {"vocab.json", "tokenizer.json"} & set(os.listdir(tmp_path / "out"))
    files = tmp_path / "gpt2"
    os.makedirs(files)
    (files / "vocab.json").write_bytes(vocab_json)
    (files / "merges.txt").write_bytes(merges)
    cache = str(tmp_path / "cache")
    _cache_like_huggingface_hub(cache, "openai-community/gpt2", str(files), "a" * 40, "main")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    rep = _export(nemo, str(tmp_path / "out2"))
    assert rep.warnings == [] and [n for n in rep.notes if "hub cache" in n]
    assert (tmp_path / "out2" / "vocab.json").read_bytes() == vocab_json


# ------------------------------------------------------------------ Hugging Face (library: huggingface)

def _hf_tokenizer(folder: str) -> None:
    """A Llama-3-like HF tokenizer folder: byte-level BPE with added specials and a
    post-processor that puts ``<|begin_of_text|>`` first."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(300), vocab_size=500, min_frequency=2,
                            special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    bos = bpe.token_to_id("<|begin_of_text|>")
    bpe.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|begin_of_text|>",
                                  eos_token="<|end_of_text|>")
    tok.save_pretrained(folder)


def test_hf_tokenizer_from_the_hub_cache_or_one_line(tmp_path: Any, monkeypatch: Any) -> None:
    """``{library: huggingface, type: <hub id>, use_fast: True}`` — NeMo's Llama converter
    without a ``tokenizer.model`` (convert_llama_hf_to_nemo.py L100-105, L314-322): no file
    in the archive, NeMo loads ``AutoTokenizer.from_pretrained(type)`` (tokenizer_utils.py
    L210-225) and encodes with ``tokenize`` + ``convert_tokens_to_ids`` (auto_tokenizer.py
    L313-328: no BOS)."""
    from transformers import AutoTokenizer

    src = str(tmp_path / "tok-src")
    _hf_tokenizer(src)
    vocab = len(AutoTokenizer.from_pretrained(src))
    nemo, hf = _nemo(tmp_path, vocab, {"library": "huggingface", "type": "tiny-org/tiny-llama3", "use_fast": True})
    monkeypatch.chdir(tmp_path)

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    rep = _export(nemo, str(tmp_path / "no-tok"))
    line = [w for w in rep.warnings if "tiny-org/tiny-llama3" in w]
    assert len(line) == 1 and "`hf download tiny-org/tiny-llama3 --include 'tokenizer*'`" in line[0]
    assert [w for w in rep.warnings if "true vocabulary size is unknown" in w]
    assert not [n for n in os.listdir(tmp_path / "no-tok") if n.startswith("tokenizer")]

    cache = str(tmp_path / "cache")
    _cache_like_huggingface_hub(cache, "tiny-org/tiny-llama3", src, "b" * 40, "main")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    out = str(tmp_path / "out")
    rep = _export(nemo, out)
    assert rep.warnings == [] and [n for n in rep.notes if "from the hub cache" in n]
    _check_weights(out, hf, vocab)
    for name in os.listdir(src):
        if name.startswith("tokenizer"):
            assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "tok-src" / name).read_bytes(), name
    cfg = json.load(open(os.path.join(out, "config.json")))
    nemo_tok = AutoTokenizer.from_pretrained(os.path.join(cache, "models--tiny-org--tiny-llama3", "snapshots",
                                                          "b" * 40))
    assert cfg["bos_token_id"] == nemo_tok.bos_token_id and cfg["eos_token_id"] == nemo_tok.eos_token_id
    _same_ids(AutoTokenizer.from_pretrained(out), lambda t: nemo_tok.convert_tokens_to_ids(nemo_tok.tokenize(t)))

    # tokens the section makes NeMo add at load time (auto_tokenizer.py L95-165) are said, not applied
    _set_tokenizer(nemo, {"library": "huggingface", "type": "tiny-org/tiny-llama3", "use_fast": True,
                          "special_tokens": {"pad_token": "<pad>"}})
    rep = _export(nemo, str(tmp_path / "added"))
    assert len(rep.warnings) == 1 and "(<pad>)" in rep.warnings[0] and "does not have them" in rep.warnings[0]


def test_hf_tokenizer_packed_in_the_archive(tmp_path: Any, monkeypatch: Any) -> None:
    """HF files packed as artifacts (``vocab_file: nemo:…tokenizer.json``) are copied,
    whatever ``type`` names; a ``type`` folder packed in the archive is read too."""
    from transformers import AutoTokenizer

    src = str(tmp_path / "tok-src")
    _hf_tokenizer(src)
    vocab = len(AutoTokenizer.from_pretrained(src))
    nemo, _ = _nemo(tmp_path, vocab, {})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    tok_json = (tmp_path / "tok-src" / "tokenizer.json").read_bytes()
    tok_cfg = (tmp_path / "tok-src" / "tokenizer_config.json").read_bytes()
    _set_tokenizer(nemo, {"library": "huggingface", "type": "/data/tokenizer", "use_fast": True,
                          "vocab_file": _artifact(nemo, "tokenizer.json", tok_json), "merge_file": None,
                          "model": None})
    rep = _export(nemo, str(tmp_path / "out"))
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == tok_json
    assert json.load(open(tmp_path / "out" / "config.json"))["vocab_size"] == vocab  # the trim knew the size
    assert not [w for w in rep.warnings if "vocabulary" in w]

    os.makedirs(os.path.join(nemo, "hf_tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "m.nemo" / "hf_tokenizer" / name).write_bytes((tmp_path / "tok-src" / name).read_bytes())
    _set_tokenizer(nemo, {"library": "huggingface", "type": "nemo:hf_tokenizer", "use_fast": True})
    rep = _export(nemo, str(tmp_path / "out2"))
    assert rep.warnings == [] and (tmp_path / "out2" / "tokenizer_config.json").read_bytes() == tok_cfg

    # a folder on this machine, where from_pretrained looks first; a path that is nowhere
    _set_tokenizer(nemo, {"library": "huggingface", "type": src, "use_fast": True})
    rep = _export(nemo, str(tmp_path / "out3"))
    assert rep.warnings == [] and [n for n in rep.notes if f"the local folder {src}" in n]
    assert (tmp_path / "out3" / "tokenizer.json").read_bytes() == tok_json
    _set_tokenizer(nemo, {"library": "huggingface", "type": "/data/tokenizer", "use_fast": True})
    rep = _export(nemo, str(tmp_path / "out4"))
    assert [w for w in rep.warnings if "'/data/tokenizer'" in w and "neither in the .nemo nor on this machine" in w]


# ------------------------------------------------------------------ tiktoken / Tekken (library: tiktoken)

def _learn_bpe(texts: list[str], pattern: str, merges: int) -> dict[bytes, int]:
    """Byte-level BPE ranks learned on ``texts`` (ranks 0-255: the bytes; then each merge)."""
    counts = collections.Counter(tuple(bytes([b]) for b in w.encode()) for t in texts for w in regex.findall(pattern, t))
    ranks = {bytes([i]): i for i in range(256)}
    for _ in range(merges):
        pairs: collections.Counter[tuple[bytes, bytes]] = collections.Counter()
        for word, n in counts.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        ranks[a + b] = len(ranks)
        merged: collections.Counter[tuple[bytes, ...]] = collections.Counter()
        for word, n in counts.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        counts = merged
    return ranks


def _tekken_vocab(ranks: dict[bytes, int]) -> list[dict[str, Any]]:
    """Ranks as Mistral's ``tekken.json`` lists them (mistral-common tekken.py ``TokenInfo``)."""
    out = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        try:
            text: str | None = tok.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        out.append({"rank": rank, "token_bytes": base64.b64encode(tok).decode(), "token_str": text})
    return out


def _texts_for_bpe() -> list[str]:
    return corpus(400, seed=5) + CORPUS * 3


def _tiktoken_reference(ranks: dict[bytes, int], pattern: str, num_special: int) -> Any:
    """NeMo's ``TiktokenTokenizer.text_to_ids`` (tiktoken_tokenizer.py L184-189, L223-226) and
    mistral-common's ``Tekkenizer.encode``: tiktoken with no special tokens, ranks + offset."""
    import tiktoken

    enc = tiktoken.Encoding("ref", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return lambda text: [r + num_special for r in enc.encode(text)]


@pytest.mark.slow
def test_tiktoken_vocabulary_as_nemo_stores_it(tmp_path: Any) -> None:
    """NeMo's Mistral converter stores only ``tekken.json``'s ``vocab`` list and writes
    ``{library: tiktoken, type: tiktoken, vocab_file: …, model: null, merge_file: null,
    delimiter: null, sentencepiece_legacy: false}`` (convert_mistral_7b_hf_to_nemo.py
    L141-164); NeMo reads it with its defaults: 131072 ids, 1000 special, the first 130072
    ranks (tiktoken_tokenizer.py L65-69, L105-154). The list here is longer than that (as
    Mistral-NeMo's 150000), so the cut is exercised; ranks past the learned ones are byte
    strings no merge reaches. Slow: transformers' conversion of 131072 ids takes seconds."""
    from transformers import AutoTokenizer

    ranks = _learn_bpe(_texts_for_bpe(), NEMO_TIKTOKEN_PATTERN, 400)
    learned = len(ranks)
    assert learned > 500
    k = 0
    while len(ranks) < 130500:  # 0xFF 0xFE never occur in UTF-8 text: unreachable ranks
        ranks[b"\xff\xfe" + k.to_bytes(4, "big")] = len(ranks)
        k += 1
    data = json.dumps(_tekken_vocab(ranks)).encode()
    nemo, hf = _nemo(tmp_path, 131072, {}, tp=1, tie_word_embeddings=True)
    _set_tokenizer(nemo, {"library": "tiktoken", "type": "tiktoken", "vocab_file": _artifact(nemo, "tekken.json", data),
                          "model": None, "merge_file": None, "delimiter": None, "sentencepiece_legacy": False})
    out = str(tmp_path / "out")
    rep = _export(nemo, out)
    assert rep.warnings == []
    _check_weights(out, hf, 131072)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2) and "pad_token_id" not in cfg

    tok = AutoTokenizer.from_pretrained(out)
    kept = {t: r for t, r in ranks.items() if r < 131072 - 1000}
    reference = _tiktoken_reference(kept, NEMO_TIKTOKEN_PATTERN, 1000)
    _same_ids(tok, reference)
    assert [tok(t)["input_ids"] for t in CORPUS] == [reference(t) for t in CORPUS]  # nothing added around
    assert len(tok) == 131072 and (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (1, 2, 0)
    assert tok.convert_ids_to_tokens([3, 7, 999]) == ["<mask>", "<SPECIAL_7>", "<SPECIAL_999>"]
    assert all(tok.decode(reference(t)) == t for t in CORPUS)

    vrep = api.verify(nemo, out)
    (enc,) = vrep.tokenizer.encodings
    assert enc.kind == "hf" and enc.differing == 0 and enc.vocab_size_a == 131072


def test_mistral_tekken_json_as_an_artifact(tmp_path: Any) -> None:
    """A whole Mistral ``tekken.json`` (config, vocab, special_tokens: mistral-common
    tekken.py ``ModelData``, ``Tekkenizer.from_file``) is read with its own sizes, pattern and
    special names; small sizes here."""
    from transformers import AutoTokenizer

    ranks = _learn_bpe(corpus(100, seed=5) + CORPUS, NEMO_TIKTOKEN_PATTERN, 200)
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<pad>"]
    num_special = 20
    size = num_special + len(ranks) - 5  # the last five ranks are past default_vocab_size
    tekken = {"config": {"pattern": NEMO_TIKTOKEN_PATTERN, "num_vocab_tokens": len(ranks), "default_vocab_size": size,
                         "default_num_special_tokens": num_special, "version": "v7"},
              "vocab": _tekken_vocab(ranks),
              "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(specials)]}
    nemo, hf = _nemo(tmp_path, size, {})
    _set_tokenizer(nemo, {"library": "tiktoken", "type": "tiktoken", "model": None, "merge_file": None,
                          "vocab_file": _artifact(nemo, "tekken.json", json.dumps(tekken).encode())})
    out = str(tmp_path / "out")
    rep = _export(nemo, out)
    assert rep.warnings == []
    _check_weights(out, hf, size)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 5)
    tok = AutoTokenizer.from_pretrained(out)
    kept = {t: r for t, r in ranks.items() if r < size - num_special}
    _same_ids(tok, _tiktoken_reference(kept, NEMO_TIKTOKEN_PATTERN, num_special))
    assert tok.convert_ids_to_tokens([3, 6, 19]) == ["[INST]", "<SPECIAL_6>", "<SPECIAL_19>"]
    assert tok.pad_token_id == 5 and len(tok) == size


def test_bad_tiktoken_vocabulary_is_one_warning_and_no_tokenizer(tmp_path: Any) -> None:
    """NeMo's checks of the ranks (tiktoken_tokenizer.py L50-60): a list NeMo refuses, or one
    shorter than NeMo's 130072 ranks, writes no tokenizer — the weights still export."""
    ranks = _learn_bpe(corpus(50), NEMO_TIKTOKEN_PATTERN, 20)
    vocab = _tekken_vocab(ranks)
    nemo, hf = _nemo(tmp_path, 320, {})
    for i, bad in enumerate([vocab, vocab[:3] + vocab[4:], b"{not json"]):
        data = bad if isinstance(bad, bytes) else json.dumps(bad).encode()
        _set_tokenizer(nemo, {"library": "tiktoken", "type": "tiktoken",
                              "vocab_file": _artifact(nemo, "tekken.json", data)})
        rep = _export(nemo, str(tmp_path / f"out{i}"))
        assert [w for w in rep.warnings if "no tokenizer files written" in w], rep.warnings
        assert "tokenizer.json" not in os.listdir(tmp_path / f"out{i}")


# ------------------------------------------------------------------ SentencePiece (library: sentencepiece)

def test_sentencepiece_falls_back_to_tokenizer_model_key(tmp_path: Any) -> None:
    """NeMo's converters register the model twice — ``tokenizer.model`` and
    ``tokenizer.tokenizer_model`` (convert_mistral_7b_hf_to_nemo.py L99-100) — and NeMo 1.2x
    GPT configs carry both; a ``model`` naming a missing member falls back to the other with
    one warning line. NeMo encodes with SentencePiece (sentencepiece_tokenizer, legacy)."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    model_path = write_sentencepiece(str(tmp_path / "sp.model"), vocab_size=200)
    model = open(model_path, "rb").read()
    vocab = spm.SentencePieceProcessor(model_file=model_path).get_piece_size()
    nemo, hf = _nemo(tmp_path, vocab, {})
    section = {"library": "sentencepiece", "type": None, "model": "nemo:" + "0" * 32 + "_tokenizer.model",
               "tokenizer_model": _artifact(nemo, "tokenizer.model", model), "vocab_file": None,
               "merge_file": None, "delimiter": None, "sentencepiece_legacy": False}
    _set_tokenizer(nemo, section)
    out = str(tmp_path / "out")
    rep = _export(nemo, out)
    assert len(rep.warnings) == 1 and "tokenizer.tokenizer_model" in rep.warnings[0]
    assert (tmp_path / "out" / "tokenizer.model").read_bytes() == model
    _check_weights(out, hf, vocab)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    tok = AutoTokenizer.from_pretrained(out)
    # Text that spells a control piece (<s>, </s>) is the one difference: SentencePiece (and
    # so NeMo) encodes it as text, the HF tokenizer built from tokenizer.model as the id.
    plain = [t for t in CORPUS if not any(c in t for c in ("<s>", "</s>", "<unk>"))]
    assert len(plain) > 40
    _same_ids(tok, lambda t: sp.encode(t), plain)

    section["tokenizer_model"] = "nemo:" + "1" * 32 + "_tokenizer.model"
    _set_tokenizer(nemo, section)
    rep = _export(nemo, str(tmp_path / "none"))
    assert [w for w in rep.warnings if "archive lacks the tokenizer model" in w]
    assert "tokenizer.model" not in os.listdir(tmp_path / "none")


def test_unknown_library_is_one_warning(tmp_path: Any) -> None:
    nemo, _ = _nemo(tmp_path, 320, {"library": "byte-level", "type": None})
    rep = _export(nemo, str(tmp_path / "out"))
    assert [w for w in rep.warnings if "'byte-level'" in w and "no tokenizer files written" in w]
