"""``nemo-convert tokenizer add-tokens`` and :func:`nemo_convert.convert.tokenizer_patch.add_tokens`:
SentencePiece files, HF folders and the tokenizer embedded in a ``.nemo``, through the
tokenizer-patcher plugins. Tiny models and tokenizers are built here; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
import yaml
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

from nemo_convert import TokenizerPatcher, api, hookimpl
from nemo_convert.cli.main import main
from nemo_convert.convert.tokenizer_patch import add_tokens
from nemo_convert.errors import InputError
from nemo_convert.formats.nemo.nemo import open_nemo
from nemo_convert.formats.io.tar_archive import open_nemo_container
from nemo_convert.plugins.manager import get_registry, registry_with
from tiny_models import corpus, make_tiny_llama

NEVA = ["<image>", "<extra_id_0>"]


def _sha(path: str | Path) -> str:
    p = Path(path)
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(p.rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(p)).encode() + b"\0" + f.read_bytes())
        return h.hexdigest()
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _members(path: str) -> dict[str, bytes]:
    with open_nemo_container(path) as c:
        return {n: c.read_bytes(n) for n in c.names()}


def _config(path: str) -> dict[str, Any]:
    ck = open_nemo(path, strategies=get_registry().strategies(), providers=get_registry().providers())
    try:
        return ck.config
    finally:
        ck.close()


def _hf_tokenizer(folder: Path) -> Path:
    """A small trained BPE tokenizer saved as an HF folder (tokenizer.json + config)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tok")
    hf = make_tiny_llama(str(root / "hf"))
    out = {"hf": hf, "sp": os.path.join(hf, "tokenizer.model")}
    for layout in ("dist", "legacy"):
        out[layout] = str(root / f"{layout}.nemo")
        api.import_hf(hf, out[layout], layout=layout)
    return out


# -- plugins and help --------------------------------------------------------------------


def test_patchers_are_plugins() -> None:
    pats = get_registry().tokenizer_patchers
    assert {"sentencepiece", "hf"} <= set(pats)
    for name in ("sentencepiece", "hf"):
        assert pats[name].plugin == "tokenizers" and pats[name].distribution == "nemo-convert"


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["tokenizer", "--help"], ["tokenizer", "add-tokens", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert "add-tokens" in out and "--skip-existing" in out and "--control" in out
    with pytest.raises(SystemExit) as e:
        main(["tokenizer"])  # the subcommand is required
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["tokenizer", "add-tokens", "x", "-o", "y", "--tokens", "a", "--control", "--user-defined"])


# -- a SentencePiece file ----------------------------------------------------------------


def test_sentencepiece_file(llama: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _sha(llama["sp"])
    out = tmp_path / "t.model"
    code, stdout, _ = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", str(out), "--tokens", *NEVA, "--json")
    assert code == 0
    rep = json.loads(stdout)
    assert rep["kind"] == "sentencepiece" and (rep["old_vocab_size"], rep["new_vocab_size"]) == (300, 302)
    assert rep["added"] == [["<image>", 300], ["<extra_id_0>", 301]]
    assert _sha(llama["sp"]) == before
    proto = sp_pb2.ModelProto.FromString(out.read_bytes())  # type: ignore[attr-defined]
    assert [(p.piece, p.type) for p in proto.pieces[300:]] == [("<image>", 4), ("<extra_id_0>", 4)]
    sp = spm.SentencePieceProcessor(model_file=str(out))
    assert sp.encode("the<image>fox").count(300) == 1

    ctrl = tmp_path / "c.model"
    code, _, err = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", str(ctrl), "--tokens", "<image>",
                        "--control")
    assert code == 0 and "300 → 301" in err
    assert sp_pb2.ModelProto.FromString(ctrl.read_bytes()).pieces[300].type == 3  # type: ignore[attr-defined]


def test_sentencepiece_errors(llama: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.model"
    code, _, err = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", str(out), "--tokens", "<x>", "<s>")
    assert code == 2 and err.startswith("nemo-convert: error:") and "'<s>'" in err and err.count("\n") == 1
    assert not out.exists()
    code, stdout, _ = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", str(out), "--tokens", "<x>", "<s>",
                           "--skip-existing", "--json")
    assert code == 0
    rep = json.loads(stdout)
    assert rep["skipped"] == ["<s>"] and rep["added"] == [["<x>", 300]]
    code, _, err = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", str(out), "--tokens", "<y>")
    assert code == 2 and "--overwrite" in err
    code, _, _ = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", str(out), "--tokens", "<y>", "--overwrite")
    assert code == 0 and spm.SentencePieceProcessor(model_file=str(out)).piece_to_id("<y>") == 300
    code, _, err = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", llama["sp"], "--tokens", "<y>",
                        "--overwrite")
    assert code == 2 and "differ" in err
    code, _, err = _run(capsys, "tokenizer", "add-tokens", llama["sp"], "-o", os.path.dirname(llama["sp"]),
                        "--tokens", "<y>", "--overwrite")
    assert code == 2 and "holds the input" in err and os.path.isfile(llama["sp"])
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a tokenizer")
    code, _, err = _run(capsys, "tokenizer", "add-tokens", str(junk), "-o", str(tmp_path / "j"), "--tokens", "<y>")
    assert code == 2 and "SentencePiece" in err
    code, _, err = _run(capsys, "tokenizer", "add-tokens", str(tmp_path / "nope"), "-o", str(tmp_path / "j"),
                        "--tokens", "<y>")
    assert code == 2 and "no such file" in err
    assert not list(tmp_path.glob(".*nemo-convert-partial*"))


# -- an HF tokenizer folder ----------------------------------------------------------------


def test_hf_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _hf_tokenizer(tmp_path / "src")
    before = _sha(src)
    n = json.loads((src / "tokenizer.json").read_text())["model"]["vocab"].__len__()
    for flag, special in (("--control", True), ("--user-defined", False)):
        out = tmp_path / flag.strip("-")
        code, stdout, _ = _run(capsys, "tokenizer", "add-tokens", str(src), "-o", str(out), "--tokens", *NEVA, flag,
                               "--json")
        assert code == 0
        rep = json.loads(stdout)
        assert rep["kind"] == "hf" and rep["old_vocab_size"] == n and rep["new_vocab_size"] == n + 2
        entries = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
        assert [(e["content"], e["id"], e["special"]) for e in entries[-2:]] == [
            ("<image>", n, special), ("<extra_id_0>", n + 1, special)]
    assert _sha(src) == before


# -- a .nemo ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_nemo_sentencepiece(llama: dict[str, str], layout: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    src = llama[layout]
    before = _sha(src)
    out = str(tmp_path / "p.nemo")
    code, stdout, _ = _run(capsys, "tokenizer", "add-tokens", src, "-o", out, "--tokens", *NEVA, "--json")
    assert code == 0
    rep = json.loads(stdout)
    assert rep["kind"] == "nemo" and (rep["old_vocab_size"], rep["new_vocab_size"]) == (300, 302)
    assert rep["embeddings_resized"] is False
    assert any("from 300 to 302" in n and "embeddings were not resized" in n for n in rep["notes"])
    assert _sha(src) == before  # the input is only read

    old, new = _members(src), _members(out)
    ((old_art, new_art),) = rep["artifacts"].items()
    assert old_art in old and old_art not in new and new_art in new
    assert new_art.endswith("_tokenizer.model") and new_art != old_art
    assert set(old) - {old_art} == set(new) - {new_art}
    for name in set(old) - {old_art, "model_config.yaml"}:
        assert new[name] == old[name], name  # every other member copied unchanged
    order_old = [n if n != old_art else new_art for n in old]
    assert order_old == list(new)  # and in the same order
    assert tarfile.is_tarfile(out)

    cfg_old, cfg_new = _config(src), _config(out)
    assert cfg_new["tokenizer"]["model"] == "nemo:" + new_art
    assert cfg_new["nemo_convert"]["tokenizer_files"]["tokenizer.model"] == "nemo:" + new_art
    assert cfg_new["nemo_convert"]["tokenizer_patches"] == [
        {"tokens": NEVA, "piece_type": "user_defined", "old_vocab_size": 300, "new_vocab_size": 302,
         "embeddings_resized": False}]
    strip = ("tokenizer", "nemo_convert")
    assert {k: v for k, v in cfg_new.items() if k not in strip} == {k: v for k, v in cfg_old.items() if k not in strip}

    back = str(tmp_path / "back")
    api.export_hf(out, back)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(back, "tokenizer.model"))
    assert [sp.piece_to_id(t) for t in NEVA] == [300, 301]
    from nemo_convert.verify import verify

    res = verify(llama["hf"], out)
    assert res.tensors_ok and res.config_ok and not res.tokenizer_ok


def test_nemo_unpacked_and_gzip_inputs(llama: dict[str, str], tmp_path: Path) -> None:
    folder = str(tmp_path / "unpacked")
    api.import_hf(llama["hf"], folder, packed=False)
    gz = str(tmp_path / "old.nemo")
    with tarfile.open(gz, "w:gz") as tf:
        tf.add(folder, arcname=".")
    for src in (folder, gz):
        before = _sha(src)
        out = str(tmp_path / (os.path.basename(src) + ".patched.nemo"))
        rep = add_tokens(src, out, ["<image>"], piece_type="control")
        assert rep.kind == "nemo" and rep.added == [("<image>", 300)] and _sha(src) == before
        assert tarfile.is_tarfile(out)
        back = str(tmp_path / (os.path.basename(src) + ".back"))
        api.export_hf(out, back)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(back, "tokenizer.model"))
        assert sp.piece_to_id("<image>") == 300 and sp.is_control(300)


def test_nemo_with_hf_and_sentencepiece_tokenizers(tmp_path: Path) -> None:
    hf = make_tiny_llama(str(tmp_path / "hf"))
    _hf_tokenizer(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "tok" / name, os.path.join(hf, name))
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo)
    files_old = _config(nemo)["nemo_convert"]["tokenizer_files"]
    assert set(files_old) == {"tokenizer.model", "tokenizer.json", "tokenizer_config.json"}
    n_hf = len(json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["model"]["vocab"])

    out = str(tmp_path / "p.nemo")
    rep = add_tokens(nemo, out, NEVA)
    assert [(t.file, t.patcher) for t in rep.tokenizers] == [("tokenizer.model", "sentencepiece"),
                                                             ("tokenizer.json", "hf")]
    assert rep.tokenizers[1].added == [("<image>", n_hf), ("<extra_id_0>", n_hf + 1)]
    assert (rep.old_vocab_size, rep.new_vocab_size) == (300, 302)  # the SentencePiece model NeMo uses
    assert any("different ids" in n for n in rep.notes)  # 300 vs n_hf: said, not hidden
    files_new = _config(out)["nemo_convert"]["tokenizer_files"]
    changed = {k for k in files_new if files_new[k] != files_old[k]}
    assert changed == {"tokenizer.model", "tokenizer.json"}  # plain tokens leave tokenizer_config.json as is
    assert sorted(files_new[k][5:] for k in changed) == sorted(rep.artifacts.values())
    cfg_member = files_old["tokenizer_config.json"][5:]
    assert files_new["tokenizer_config.json"][5:] == cfg_member
    assert _members(out)[cfg_member] == _members(nemo)[cfg_member]
    special = add_tokens(nemo, str(tmp_path / "s.nemo"), NEVA, piece_type="control")
    assert len(special.artifacts) == 3  # special tokens are listed in tokenizer_config.json too
    back = str(tmp_path / "back")
    api.export_hf(out, back)
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(os.path.join(back, "tokenizer.json")).token_to_id("<extra_id_0>") == n_hf + 1
    assert spm.SentencePieceProcessor(model_file=os.path.join(back, "tokenizer.model")).piece_to_id("<image>") == 300


def test_nemo_without_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = make_tiny_llama(str(tmp_path / "hf"), tokenizer=False)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo)
    code, _, err = _run(capsys, "tokenizer", "add-tokens", nemo, "-o", str(tmp_path / "p.nemo"), "--tokens", "<x>")
    assert code == 2 and "no tokenizer" in err and not (tmp_path / "p.nemo").exists()


def test_model_config_wrapped_in_model_key(llama: dict[str, str], tmp_path: Path) -> None:
    """An old-style config with a top-level ``model:`` key keeps its wrapper."""
    folder = tmp_path / "wrapped"
    with open_nemo_container(llama["legacy"]) as c:
        for n in c.names():
            (folder / n).parent.mkdir(parents=True, exist_ok=True)
            (folder / n).write_bytes(c.read_bytes(n))
    cfg = yaml.safe_load((folder / "model_config.yaml").read_text())
    (folder / "model_config.yaml").write_text(yaml.safe_dump({"model": cfg}, sort_keys=False))
    out = str(tmp_path / "p.nemo")
    rep = add_tokens(str(folder), out, ["<image>"])
    raw = yaml.safe_load(_members(out)["model_config.yaml"])
    assert list(raw) == ["model"]
    assert raw["model"]["tokenizer"]["model"] == "nemo:" + next(iter(rep.artifacts.values()))


# -- the registry picks the patcher ----------------------------------------------------------


class _WordListPlugin:
    """A third-party patcher for one-token-per-line ``.vocab`` files."""

    @staticmethod
    def _add(src: str, dst: str, tokens: Any, options: dict[str, Any]) -> dict[str, Any]:
        words = Path(src).read_text().split("\n")
        Path(dst).write_text("\n".join(words + list(tokens)))
        return {"old_vocab_size": len(words), "new_vocab_size": len(words) + len(tokens),
                "added": [(t, len(words) + i) for i, t in enumerate(tokens)]}

    @hookimpl
    def nemo_convert_tokenizer_patchers(self) -> list[TokenizerPatcher]:
        return [TokenizerPatcher("wordlist", lambda p: p.endswith(".vocab"), self._add)]


def test_patcher_chosen_through_registry(tmp_path: Path) -> None:
    vocab = tmp_path / "words.vocab"
    vocab.write_text("a\nb\nc")
    reg = registry_with(("wordlist", _WordListPlugin()))
    rep = add_tokens(str(vocab), str(tmp_path / "out.vocab"), ["<image>"], registry=reg)
    assert rep.kind == "wordlist" and rep.added == [("<image>", 3)]
    assert (tmp_path / "out.vocab").read_text() == "a\nb\nc\n<image>"
    with pytest.raises(InputError, match="installed: none"):
        add_tokens(str(vocab), str(tmp_path / "x.vocab"), ["<image>"], registry=registry_with(entry_points=False))


# -- a tokenizer larger than the embedding (issue 20) -----------------------------------------


def test_a_tokenizer_with_ids_past_the_embedding_is_warned_about(llama: dict[str, str], tmp_path: Path) -> None:
    """Tokens added to the tokenizer without resizing the embedding: import and export say
    so (ids past the rows have no embedding row); a tokenizer within the rows says nothing."""
    from nemo_convert.tokenizers import sentencepiece_vocab_size, tokenizer_size

    hf = tmp_path / "hf"
    shutil.copytree(llama["hf"], hf)
    rows = json.loads((hf / "config.json").read_text())["vocab_size"]
    pieces = sentencepiece_vocab_size((hf / "tokenizer.model").read_bytes())
    assert pieces <= rows and api.import_hf(str(hf), str(tmp_path / "ok.nemo")).warnings == []
    extra = [f"<new_{i}>" for i in range(rows - pieces + 2)]  # two ids past the last row
    add_tokens(llama["sp"], str(tmp_path / "big.model"), extra)
    shutil.copyfile(tmp_path / "big.model", hf / "tokenizer.model")
    assert tokenizer_size({"tokenizer.model": (hf / "tokenizer.model").read_bytes()}) == ("tokenizer.model", rows + 2)
    want = (f"tokenizer.model has {rows + 2} token ids but the embedding has {rows} rows (vocab_size): ids "
            f"{rows}–{rows + 1} have no embedding row; resize the embedding and the output layer before using them")
    rep = api.import_hf(str(hf), str(tmp_path / "big.nemo"))
    assert want in rep.warnings
    assert want in api.export_hf(str(tmp_path / "big.nemo"), str(tmp_path / "back")).warnings
    hf_tok = _hf_tokenizer(tmp_path / "hf-tok")  # tokenizer.json: the model's vocabulary and the added tokens
    size = tokenizer_size({"tokenizer.json": (hf_tok / "tokenizer.json").read_bytes()})
    from transformers import AutoTokenizer

    assert size == ("tokenizer.json", len(AutoTokenizer.from_pretrained(str(hf_tok))))
