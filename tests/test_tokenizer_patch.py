"""Tests for the tokenizer patchers (SentencePiece models and HF tokenizer folders).

Every tokenizer here is trained in the test from generated English-like text; nothing is
downloaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from tokenizers import Tokenizer

from nemo_convert.errors import InputError, OutputExistsError
from nemo_convert.tokenizers import (
    PatchReport,
    add_tokens_hf,
    add_tokens_sentencepiece,
    detect_tokenizer_kind,
    encode_probe,
    sentencepiece_vocab_size,
)

NEVA_TOKENS = [f"<extra_id_{i}>" for i in range(8)] + ["<image>"]


def _lexicon() -> list[str]:
    rng = random.Random(1234)
    onsets = "b c d f g h l m n p r s t v w st tr ch sh th".split()
    vowels = "a e i o u ai ou ee".split()
    codas = ["", "", "n", "r", "s", "t", "ng", "ck"]
    made = {
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 3)))
        for _ in range(300)
    }
    common = ("the a an of to and in is was for on with as by at from this that "
              "garden window market river teacher student morning evening").split()
    return common + sorted(made)


LEXICON = _lexicon()


def _sentences(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(LEXICON) for _ in range(rng.randint(4, 12))).capitalize()
            + rng.choice(".?!") for _ in range(n)]


PROBES = _sentences(25, seed=99) + ["the garden", "Morning, river!", "a"]


# -- SentencePiece ------------------------------------------------------------------------


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _train_sp(model_type: str, vocab_size: int = 200) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_sentences()), model_writer=buf,
                                   vocab_size=vocab_size, model_type=model_type, minloglevel=2)
    return buf.getvalue()


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def sp_model(request: pytest.FixtureRequest) -> bytes:
    return _train_sp(request.param)


def _proto(model: bytes) -> Any:
    return sp_pb2.ModelProto.FromString(model)  # type: ignore[attr-defined]


def _sp(model: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=model)


def test_sp_user_defined_tokens(sp_model: bytes) -> None:
    old = _proto(sp_model)
    n = len(old.pieces)
    assert sentencepiece_vocab_size(sp_model) == n == 200
    out, report = add_tokens_sentencepiece(sp_model, NEVA_TOKENS)

    assert report == PatchReport(n, n + 9, [(t, n + i) for i, t in enumerate(NEVA_TOKENS)], [])
    assert sentencepiece_vocab_size(out) == n + 9

    new = _proto(out)
    assert list(new.pieces)[:n] == list(old.pieces)  # old pieces keep id, text, score, type
    for i, tok in enumerate(NEVA_TOKENS):
        piece = new.pieces[n + i]
        assert (piece.piece, piece.score, piece.type) == (tok, 0.0, 4)  # USER_DEFINED = 4
    assert new.trainer_spec == old.trainer_spec
    assert new.normalizer_spec == old.normalizer_spec

    sp = _sp(out)
    for i, tok in enumerate(NEVA_TOKENS):
        tid = n + i
        assert sp.piece_to_id(tok) == tid
        for text in (tok, f"the garden {tok} river", f"garden{tok}river", f"{tok}{tok[:-1]}"):
            ids = sp.encode(text)
            assert ids.count(tid) == 1  # one piece, also glued to words or a prefix of itself
        text = f"the garden{tok} river"
        assert sp.decode(sp.encode(text)) == text
    # Several new tokens in one text, each one piece, in order.
    ids = sp.encode("<image> the <extra_id_4>market<extra_id_5>")
    assert [i for i in ids if i >= n] == [n + 8, n + 4, n + 5]
    assert encode_probe(out, PROBES) == encode_probe(sp_model, PROBES)


def test_sp_control_tokens(sp_model: bytes) -> None:
    n = sentencepiece_vocab_size(sp_model)
    out, report = add_tokens_sentencepiece(sp_model, NEVA_TOKENS, piece_type="control")
    assert report.added == [(t, n + i) for i, t in enumerate(NEVA_TOKENS)]
    sp, before = _sp(out), _sp(sp_model)
    for i, tok in enumerate(NEVA_TOKENS):
        tid = n + i
        assert sp.piece_to_id(tok) == tid and sp.id_to_piece(tid) == tok and sp.is_control(tid)
        assert _proto(out).pieces[tid].type == 3  # CONTROL = 3
        # Control pieces are never matched in raw text: encoding is exactly as before.
        text = f"the garden {tok} river"
        assert tid not in sp.encode(text)
        assert sp.encode(text) == before.encode(text)
        assert sp.decode([tid]) == ""  # and they decode to nothing
    assert encode_probe(out, PROBES) == encode_probe(sp_model, PROBES)


def test_sp_errors(sp_model: bytes) -> None:
    with pytest.raises(InputError, match="<image>"):
        add_tokens_sentencepiece(sp_model, ["<image>", "<x>", "<image>"])
    with pytest.raises(InputError, match="empty"):
        add_tokens_sentencepiece(sp_model, ["<x>", ""])
    with pytest.raises(InputError, match="'<s>'"):
        add_tokens_sentencepiece(sp_model, ["<x>", "<s>"])
    with pytest.raises(InputError, match="whitespace"):
        add_tokens_sentencepiece(sp_model, ["<a b>"])
    with pytest.raises(InputError, match="piece_type"):
        add_tokens_sentencepiece(sp_model, ["<x>"], piece_type="normal")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        add_tokens_sentencepiece(sp_model, "<x>")  # a bare string is not a list of tokens
    for junk in (b"", b"not a model at all", b"\x08\x96\x01"):
        with pytest.raises(InputError):
            add_tokens_sentencepiece(junk, ["<x>"])
        with pytest.raises(InputError):
            sentencepiece_vocab_size(junk)


def test_sp_skip_existing_and_repatch(sp_model: bytes) -> None:
    n = sentencepiece_vocab_size(sp_model)
    once, _ = add_tokens_sentencepiece(sp_model, ["<image>"])
    with pytest.raises(InputError, match="<image>"):
        add_tokens_sentencepiece(once, ["<extra_id_0>", "<image>"])
    existing_normal = _proto(sp_model).pieces[10].piece
    twice, report = add_tokens_sentencepiece(
        once, ["<extra_id_0>", "<image>", existing_normal, "<extra_id_1>"], skip_existing=True)
    assert report == PatchReport(n + 1, n + 3, [("<extra_id_0>", n + 1), ("<extra_id_1>", n + 2)],
                                 ["<image>", existing_normal])
    sp = _sp(twice)
    assert [sp.piece_to_id(t) for t in ("<image>", "<extra_id_0>", "<extra_id_1>")] == [
        n, n + 1, n + 2]
    # Nothing to add: the very same bytes come back.
    same, report = add_tokens_sentencepiece(twice, ["<image>"], skip_existing=True)
    assert same == twice and report.added == [] and report.skipped == ["<image>"]


# -- HF tokenizers ------------------------------------------------------------------------


def _train_hf(kind: str) -> Any:
    """A tiny ``tokenizers.Tokenizer`` of the given kind trained on the generated text."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    pre: Any = pre_tokenizers.Whitespace()
    dec: Any = None
    trainer: Any
    if kind == "bytelevel-bpe":
        tok = Tokenizer(models.BPE())
        pre, dec = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    elif kind == "wordpiece":
        tok, dec = Tokenizer(models.WordPiece(unk_token="[UNK]")), decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]", "[CLS]"])
    else:
        tok = Tokenizer(models.Unigram())
        pre, dec = pre_tokenizers.Metaspace(), decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>", "<s>"],
                                          unk_token="<unk>")
    tok.pre_tokenizer = pre
    if dec is not None:
        tok.decoder = dec
    trainer.show_progress = False
    tok.train_from_iterator(_sentences(), trainer)
    return tok


def _save_hf(tok: Any, folder: Path, **special: str) -> Path:
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(str(folder))
    return folder


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hf_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = _save_hf(_train_hf("bytelevel-bpe"), tmp_path_factory.mktemp("hf") / "src",
                   eos_token="<|endoftext|>", pad_token="<pad>")
    (src / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    (src / "extra").mkdir()
    (src / "extra" / "notes.txt").write_bytes(b"\x00binary\xff")
    return src


def _auto(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_hf_special_tokens(hf_src: Path, tmp_path: Path) -> None:
    before = _digest(hf_src)
    old = _auto(hf_src)
    n = len(old)
    dst = tmp_path / "dst"
    report = add_tokens_hf(str(hf_src), str(dst), NEVA_TOKENS)
    assert _digest(hf_src) == before  # source untouched
    assert report == PatchReport(n, n + 9, [(t, n + i) for i, t in enumerate(NEVA_TOKENS)], [])
    after = _digest(dst)
    for name in ("chat_template.jinja", "extra/notes.txt"):
        assert after[name] == before[name]  # other files copied unchanged

    raw = Tokenizer.from_file(str(dst / "tokenizer.json"))
    new = _auto(dst)
    assert len(new) == n + len(NEVA_TOKENS)
    for i, tok in enumerate(NEVA_TOKENS):
        tid = n + i
        assert raw.token_to_id(tok) == new.convert_tokens_to_ids(tok) == tid
        assert new.encode(tok, add_special_tokens=False) == [tid]
        assert new.encode(f"the garden{tok} river", add_special_tokens=False).count(tid) == 1
    assert set(NEVA_TOKENS) <= set(new.all_special_tokens)
    cfg = _json(dst / "tokenizer_config.json")
    assert cfg["extra_special_tokens"] == NEVA_TOKENS  # transformers 5 key
    entries = _json(dst / "tokenizer.json")["added_tokens"]
    assert entries[-1] == {"id": n + 8, "content": "<image>", "single_word": False,
                           "lstrip": False, "rstrip": False, "normalized": False,
                           "special": True}
    for text in PROBES:
        assert new.encode(text) == old.encode(text)
    text = "the <image> garden<extra_id_3>"
    assert new.decode(new.encode(text, add_special_tokens=False)) == text
    # Skip-existing on the patched folder: nothing added, every file identical.
    again = tmp_path / "again"
    report = add_tokens_hf(str(dst), str(again), ["<image>"], skip_existing=True)
    assert report.added == [] and report.skipped == ["<image>"]
    assert _digest(again) == after
    # Patching a patched folder continues after the added tokens (ids not in the BPE vocab).
    third = tmp_path / "third"
    report = add_tokens_hf(str(dst), str(third), ["<video>"])
    assert report.added == [("<video>", n + 9)]
    assert _auto(third).convert_tokens_to_ids("<video>") == n + 9


def test_hf_plain_tokens_and_v4_config(hf_src: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(hf_src, src)
    cfg_path = src / "tokenizer_config.json"
    cfg = _json(cfg_path)
    cfg.pop("extra_special_tokens", None)
    cfg["additional_special_tokens"] = ["<pad>"]  # transformers 4.x layout
    flags = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    cfg["added_tokens_decoder"] = {"0": dict(content="<|endoftext|>", **flags),
                                   "1": dict(content="<pad>", **flags)}
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    (src / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "additional_special_tokens": ["<pad>"]}),
        encoding="utf-8")
    n = len(_auto(src))

    dst = tmp_path / "v4"
    add_tokens_hf(str(src), str(dst), ["<image>", "<extra_id_0>"])
    cfg = _json(dst / "tokenizer_config.json")
    assert cfg["additional_special_tokens"] == ["<pad>", "<image>", "<extra_id_0>"]
    assert "extra_special_tokens" not in cfg
    assert [cfg["added_tokens_decoder"][str(n + i)]["content"] for i in (0, 1)] == [
        "<image>", "<extra_id_0>"]
    assert _json(dst / "special_tokens_map.json")["additional_special_tokens"] == [
        "<pad>", "<image>", "<extra_id_0>"]
    new = _auto(dst)
    assert [new.convert_tokens_to_ids(t) for t in ("<image>", "<extra_id_0>")] == [n, n + 1]
    assert {"<pad>", "<image>", "<extra_id_0>"} <= set(new.all_special_tokens)

    plain = tmp_path / "plain"
    report = add_tokens_hf(str(src), str(plain), ["<foo>", "<bar>"], special=False)
    assert report.added == [("<foo>", n), ("<bar>", n + 1)]
    entries = _json(plain / "tokenizer.json")["added_tokens"]
    assert entries[-1]["special"] is False and entries[-1]["normalized"] is True
    cfg = _json(plain / "tokenizer_config.json")
    assert cfg["additional_special_tokens"] == ["<pad>"]  # plain tokens are not listed there
    assert cfg["added_tokens_decoder"][str(n)] == {
        **flags, "content": "<foo>", "normalized": True, "special": False}
    new = _auto(plain)
    assert new.encode("the<foo>garden", add_special_tokens=False).count(n) == 1
    assert "<foo>" not in new.all_special_tokens


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_hf_model_types(kind: str, tmp_path: Path) -> None:
    src = _save_hf(_train_hf(kind), tmp_path / "src")
    old = Tokenizer.from_file(str(src / "tokenizer.json"))
    n = old.get_vocab_size(with_added_tokens=True)
    add_tokens_hf(str(src), str(tmp_path / "dst"), NEVA_TOKENS)
    raw = Tokenizer.from_file(str(tmp_path / "dst" / "tokenizer.json"))
    new = _auto(tmp_path / "dst")
    for i, tok in enumerate(NEVA_TOKENS):
        assert raw.token_to_id(tok) == new.convert_tokens_to_ids(tok) == n + i
        assert new.encode(f"garden {tok} river", add_special_tokens=False).count(n + i) == 1
    for text in PROBES:
        assert raw.encode(text).ids == old.encode(text).ids


def test_hf_vocab_with_hole_is_extended(tmp_path: Path) -> None:
    """A BPE vocab whose ids run past its length: new tokens must go after the largest id."""
    src = _save_hf(_train_hf("bpe"), tmp_path / "src")
    path = src / "tokenizer.json"
    data = _json(path)
    top = len(data["model"]["vocab"]) + 40
    data["model"]["vocab"]["zzzq"] = top
    path.write_text(json.dumps(data), encoding="utf-8")
    report = add_tokens_hf(str(src), str(tmp_path / "dst"), ["<image>", "<extra_id_0>"])
    assert report.added == [("<image>", top + 1), ("<extra_id_0>", top + 2)]
    patched = _json(tmp_path / "dst" / "tokenizer.json")
    assert patched["model"]["vocab"]["<image>"] == top + 1
    new = _auto(tmp_path / "dst")
    assert new.convert_tokens_to_ids("<extra_id_0>") == top + 2
    assert new.convert_ids_to_tokens(top) == "zzzq"


def test_hf_errors(hf_src: Path, tmp_path: Path) -> None:
    (sp_only := tmp_path / "sp_only").mkdir()
    sp_bytes = _train_sp("unigram", 150)
    (sp_only / "tokenizer.model").write_bytes(sp_bytes)
    with pytest.raises(InputError, match=r"\.model"):
        add_tokens_hf(str(sp_only), str(tmp_path / "o1"), ["<image>"])
    with pytest.raises(InputError, match="folder"):
        add_tokens_hf(str(tmp_path / "missing"), str(tmp_path / "o2"), ["<image>"])
    with pytest.raises(InputError, match="<pad>"):
        add_tokens_hf(str(hf_src), str(tmp_path / "o3"), ["<image>", "<pad>"])
    with pytest.raises(InputError, match="<image>"):
        add_tokens_hf(str(hf_src), str(tmp_path / "o4"), ["<image>", "<image>"])
    with pytest.raises(InputError, match="empty"):
        add_tokens_hf(str(hf_src), str(tmp_path / "o5"), [""])
    (busy := tmp_path / "busy").mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(OutputExistsError):
        add_tokens_hf(str(hf_src), str(busy), ["<image>"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="tokenizer.json"):
        add_tokens_hf(str(tmp_path / "empty"), str(tmp_path / "o6"), ["<image>"])
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 7))  # nothing half-written
    report = add_tokens_hf(str(hf_src), str(tmp_path / "ok"), ["<pad>", "<image>"],
                           skip_existing=True)
    assert report.skipped == ["<pad>"] and [t for t, _ in report.added] == ["<image>"]
    assert report.notes == []

    # A folder with both tokenizer.json and tokenizer.model: the .model is copied as is,
    # and the report says it lacks the new tokens.
    both = tmp_path / "both"
    shutil.copytree(hf_src, both)
    (both / "tokenizer.model").write_bytes(sp_bytes)
    report = add_tokens_hf(str(both), str(tmp_path / "both_out"), ["<image>"])
    assert len(report.notes) == 1 and "tokenizer.model" in report.notes[0]
    assert (tmp_path / "both_out" / "tokenizer.model").read_bytes() == sp_bytes
    assert detect_tokenizer_kind(hf_src) == "hf"
    assert detect_tokenizer_kind(str(sp_only / "tokenizer.model")) == "sentencepiece"
    with pytest.raises(InputError, match=r"\.model"):
        detect_tokenizer_kind(sp_only)
    with pytest.raises(InputError):
        detect_tokenizer_kind(hf_src / "tokenizer_config.json")
    with pytest.raises(InputError):
        detect_tokenizer_kind(tmp_path / "nothing_here")
