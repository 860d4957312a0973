"""``--overwrite`` replaces only an output of the kind being written, or an empty folder (issue 20, item 1).

Before, ``export m.nemo -o mymodels --overwrite`` deleted ``mymodels/notes.txt`` and
``mymodels/other-project/``; ``export … -o . --overwrite`` emptied the current folder;
``import hf -o out/ --overwrite`` replaced the folder ``out/`` (and the file in it) with a tar
named ``out``. Now an existing target is recognised by content
(:mod:`nemo_convert.formats.io.replace`), anything else is refused by name with what was
found there, ``-o .``/``-o ~``/``-o ..`` are never replaced, and ``out/`` names a folder.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from nemo_convert import api
from nemo_convert.errors import OutputError, OutputExistsError
from nemo_convert.formats.io.replace import not_ours
from tiny_models import make_tiny_llama

ERROR = "nemo-convert: error: "
NOT_REPLACED = "; refusing to replace it (--overwrite replaces only {} or an empty folder): move it away or " \
               "choose another output"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A tiny HF Llama and its .nemo; read-only for the tests."""
    base = tmp_path_factory.mktemp("overwrite_src")
    hf = make_tiny_llama(str(base / "hf"))
    api.import_hf(hf, str(base / "m.nemo"))
    return {"hf": hf, "nemo": str(base / "m.nemo"), "tok": os.path.join(hf, "tokenizer.model")}


def _tree(path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and folder (None) under ``path``."""
    out: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(path):
        for d in dirs:
            out[os.path.relpath(os.path.join(folder, d), path)] = None
        for f in files:
            with open(os.path.join(folder, f), "rb") as fh:
                out[os.path.relpath(os.path.join(folder, f), path)] = fh.read()
    return out


def _users_folder(path) -> None:
    path.mkdir()
    (path / "notes.txt").write_text("my notes")
    (path / "other-project").mkdir()
    (path / "other-project" / "data.bin").write_bytes(b"\0" * 10)


def _one_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR) and "Traceback" not in err, err
    return lines[0][len(ERROR):]


# --------------------------------------------------------------------------- the cases of the issue


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_of_the_users_files_is_never_replaced(src, tmp_path, cli, overwrite):
    mymodels = tmp_path / "mymodels"
    _users_folder(mymodels)
    before = _tree(tmp_path)
    code, _, err = cli("export", src["nemo"], "-o", str(mymodels), *(["--overwrite"] if overwrite else []))
    assert code == 2
    assert _one_error(err) == (f"{mymodels}: holds files that are not a Hugging Face checkpoint (notes.txt, "
                               "other-project/)" + NOT_REPLACED.format("a Hugging Face checkpoint"))
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("command", ["export", "import"])
def test_the_current_folder_is_never_replaced(src, tmp_path, cli, monkeypatch, command):
    work = tmp_path / "work"
    _users_folder(work)
    monkeypatch.chdir(work)
    source = src["nemo"] if command == "export" else src["hf"]
    before = _tree(tmp_path)
    for out in (".", "./", str(work), ".."):
        code, _, err = cli(command, source, "-o", out, "--overwrite", "--unpacked" if command == "import" else "-q")
        assert code == 2
        what = "the current folder" if out != ".." else "a folder that holds the current folder"
        assert _one_error(err) == (f"{out}: is {what}, which nemo-convert never replaces, whatever it holds; name "
                                   "a new file or folder for the output")
    assert _tree(tmp_path) == before


def test_the_home_and_root_folders_are_never_replaced(src, tmp_path, cli, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()  # empty: an empty folder elsewhere would be replaced
    monkeypatch.setenv("HOME", str(home))
    code, _, err = cli("export", src["nemo"], "-o", str(home), "--overwrite")
    assert code == 2 and _one_error(err).startswith(f"{home}: is your home folder, which nemo-convert never")
    code, _, err = cli("export", src["nemo"], "-o", "/", "--overwrite")
    assert code == 2 and _one_error(err).startswith("/: is the root folder")
    assert os.listdir(home) == []


def test_a_trailing_slash_names_a_folder(src, tmp_path, cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    for extra in ((), ("--overwrite",)):  # a .nemo is a file: out/ cannot name it
        code, _, err = cli("import", src["hf"], "-o", str(out) + "/", *extra)
        assert code == 2
        assert _one_error(err) == (f"{out}/: a path ending in '/' names a folder, but this output is a file "
                                   f"(a .nemo checkpoint); name the file, e.g. {out}/model.nemo")
    assert _tree(out) == {"keep.txt": b"keep"} and os.listdir(tmp_path) == ["out"]
    code, _, err = cli("import", src["hf"], "-o", str(tmp_path / "new") + "/")
    assert code == 2 and "name the file, e.g." in err and not (tmp_path / "new").exists()
    # a folder output given with a slash is that folder
    code, _, err = cli("export", src["nemo"], "-o", str(tmp_path / "hf") + "/", "-q")
    assert code == 0, err
    assert (tmp_path / "hf" / "config.json").is_file() and sorted(os.listdir(tmp_path)) == ["hf", "out"]
    code, _, err = cli("import", src["hf"], "-o", str(tmp_path / "unpacked") + "/", "--unpacked", "-q")
    assert code == 0, err
    assert (tmp_path / "unpacked" / "model_config.yaml").is_file()


@pytest.mark.parametrize("case", ["file-for-folder", "folder-for-file", "hf-for-nemo", "nemo-for-hf",
                                  "safetensors-for-nemo", "nemo-for-tokenizer", "nemo-for-qnemo"])
def test_an_output_of_another_kind_is_never_replaced(src, tmp_path, cli, case):
    if case == "file-for-folder":
        target = tmp_path / "back"
        target.write_text("a file")
        argv = ["export", src["nemo"]]
        found = "is a file, not a Hugging Face checkpoint (a folder)"
    elif case == "folder-for-file":
        target = tmp_path / "m.nemo"
        _users_folder(target)
        argv = ["import", src["hf"]]
        found = "has no model_config.yaml: it is not a .nemo checkpoint (it holds notes.txt, other-project/)"
    elif case == "hf-for-nemo":
        target = tmp_path / "hf-copy"
        api.export_hf(src["nemo"], str(target))
        argv = ["import", src["hf"]]
        found = "has no model_config.yaml: it is not a .nemo checkpoint (it holds config.json, "
    elif case == "nemo-for-hf":
        target = tmp_path / "copy.nemo"
        target.write_bytes(open(src["nemo"], "rb").read())
        argv = ["export", src["nemo"]]
        found = "is a file, not a Hugging Face checkpoint (a folder)"
    elif case == "safetensors-for-nemo":
        target = tmp_path / "model.safetensors"
        target.write_bytes(open(os.path.join(src["hf"], "model.safetensors"), "rb").read())
        argv = ["import", src["hf"]]
        found = "is a file that is not a .nemo checkpoint (not a tar archive)"
    elif case == "nemo-for-tokenizer":
        target = tmp_path / "copy.nemo"
        target.write_bytes(open(src["nemo"], "rb").read())
        argv = ["tokenizer", "add-tokens", src["tok"], "--tokens", "<x>"]
        found = "is a file that is not a tokenizer (not a SentencePiece model)"
    else:
        target = tmp_path / "copy.nemo"
        target.write_bytes(open(src["nemo"], "rb").read())
        argv = ["quantize", src["nemo"], "--algo", "none", "--compress"]
        found = "is a tar archive that is not a .qnemo checkpoint (its first members are "
    before = _tree(tmp_path)
    code, _, err = cli(*argv, "-o", str(target), "--overwrite")
    assert code == 2
    assert _one_error(err).startswith(f"{target}: {found}"), err
    assert _tree(tmp_path) == before


def test_a_symbolic_link_is_never_replaced(src, tmp_path, cli):
    real = tmp_path / "real.nemo"
    real.write_bytes(open(src["nemo"], "rb").read())
    link = tmp_path / "link.nemo"
    link.symlink_to(real)
    code, _, err = cli("import", src["hf"], "-o", str(link), "--overwrite")
    assert code == 2 and _one_error(err).startswith(f"{link}: is a symbolic link (to {real})")
    assert link.is_symlink()


def test_an_empty_output_path_is_refused(src, cli):
    for argv in (("import", src["hf"]), ("export", src["nemo"]), ("quantize", src["nemo"], "--algo", "none"),
                 ("tokenizer", "add-tokens", src["tok"], "--tokens", "<x>")):
        code, _, err = cli(*argv, "-o", "")
        assert code == 2 and _one_error(err) == "the output path is empty; name the file or folder to write"


# --------------------------------------------------------------------------- what is replaced


@pytest.mark.slow  # every writer, three times
def test_each_kind_replaces_its_own_output_and_an_empty_folder(src, tmp_path):
    """Run every writer twice onto one target (the second time replacing the first output),
    after starting from an empty folder; both forms of .nemo and .qnemo replace each other."""
    runs = {
        "nemo tar": lambda out, ow: api.import_hf(src["hf"], out, overwrite=ow),
        "nemo folder": lambda out, ow: api.import_hf(src["hf"], out, overwrite=ow, packed=False),
        "reshard": lambda out, ow: api.reshard(src["nemo"], out, tp=2, overwrite=ow),
        "hf": lambda out, ow: api.export_hf(src["nemo"], out, overwrite=ow),
        "megatron-bridge": lambda out, ow: api.import_hf(src["hf"], out, overwrite=ow, to="megatron-bridge"),
        "qnemo folder": lambda out, ow: api.quantize(src["nemo"], out, algo="none", overwrite=ow),
        "qnemo tar": lambda out, ow: api.quantize(src["nemo"], out, algo="none", compress=True, overwrite=ow),
        "tokenizer": lambda out, ow: api.add_tokens(src["tok"], out, ["<x>"], overwrite=ow),
        "tokenizer of a nemo": lambda out, ow: api.add_tokens(src["nemo"], out, ["<x>"], overwrite=ow),
    }
    for name, run in runs.items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()  # an empty folder is replaced
        run(str(out), True)
        first = _tree(out) if out.is_dir() else {"": out.read_bytes()}
        with pytest.raises(OutputExistsError, match="exists; pass --overwrite to replace it"):
            run(str(out), False)
        run(str(out), True)  # its own output
        assert (_tree(out) if out.is_dir() else {"": out.read_bytes()}).keys() == first.keys(), name
    assert not [n for n in os.listdir(tmp_path) if ".nemo-convert-" in n]
    # a packed and an unpacked .nemo replace each other, as do a .qnemo folder and tar
    runs["nemo folder"](str(tmp_path / "nemo-tar"), True)
    runs["nemo tar"](str(tmp_path / "nemo-folder"), True)
    runs["qnemo tar"](str(tmp_path / "qnemo-folder"), True)
    assert tarfile.is_tarfile(tmp_path / "nemo-folder") and (tmp_path / "nemo-tar" / "model_config.yaml").is_file()


def _tar(path, members: dict[str, bytes]) -> None:
    with tarfile.open(str(path), "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _files(path, names: list[str]) -> None:
    path.mkdir()
    for n in names:
        if n.endswith("/"):
            (path / n).mkdir()
        else:
            (path / n).write_bytes(b"x")


# (kind, how the existing target is made, the phrase found, or None when it is replaced)
RECOGNISED = [
    ("hf", ["config.json", "model.safetensors", "tokenizer.json", "README.md", ".gitattributes"], None),
    ("hf", ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json"], None),
    ("hf", ["config.json", "pytorch_model.bin", "generation_config.json"], None),
    ("hf", ["config.json", "model.safetensors", "notes.txt"], "holds files that are not a Hugging Face checkpoint "
                                                             "(notes.txt)"),
    ("hf", ["config.json", "model.safetensors", "original/"], "holds files that are not a Hugging Face checkpoint "
                                                            "(original/)"),
    ("hf", ["config.json", "tokenizer.json"], "has no weights: it is not a Hugging Face checkpoint"),
    ("hf", ["model.safetensors"], "has no config.json: it is not a Hugging Face checkpoint"),
    ("nemo", ["model_config.yaml", "model_weights/", "0123456789abcdef0123456789abcdef_tokenizer.model"], None),
    ("nemo", ["model_config.yaml", "tp_rank_00_pp_rank_000/", "tp_rank_01_pp_rank_000/"], None),
    ("nemo", ["model_config.yaml", "model_weights.ckpt", "tokenizer.model", "vocab.json"], None),
    ("nemo", ["model_config.yaml", "model_weights/", "notes.txt", "runs/"],
     "holds files that are not a .nemo checkpoint (notes.txt, runs/)"),
    ("megatron-bridge", ["latest_checkpointed_iteration.txt", "latest_train_state.pt", "iter_0000000/"], None),
    ("megatron-bridge", ["iter_0000100/", "iter_0000200/"], None),
    ("megatron-bridge", ["iter_0000000/", "wandb/"], "holds files that are not a Megatron-Bridge checkpoint "
                                                     "directory (wandb/)"),
    ("megatron-bridge", ["notes.txt"], "has no latest_checkpointed_iteration.txt and no iter_* folder"),
    ("qnemo", ["config.json", "rank0.safetensors", "rank1.safetensors", "tokenizer.model",
               "tokenizer_config.yaml"], None),
    ("qnemo", ["config.json", "rank0.safetensors", "engine.plan"], "holds files that are not a .qnemo checkpoint "
                                                                   "(engine.plan)"),
    ("qnemo", ["config.json", "model.safetensors"], "has no config.json with rank*.safetensors"),
    ("tokenizer", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"], None),
    ("tokenizer", ["tokenizer.json", "notes.txt"], "holds files that are not a tokenizer (notes.txt)"),
    ("tokenizer", ["vocab.json", "merges.txt"], "has no tokenizer.json: it is not a tokenizer"),
]


@pytest.mark.parametrize("kind,names,found", RECOGNISED)
def test_folders_are_recognised_by_their_content(tmp_path, kind, names, found):
    target = tmp_path / "target"
    _files(target, names)
    got = not_ours(str(target), kind)
    assert got == found if found is None else got is not None and got.startswith(found), got


def test_files_are_recognised_by_their_content(src, tmp_path):
    tar_nemo, tar_qnemo, plain = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _tar(tar_nemo, {"0123_tokenizer.model": b"x", "model_config.yaml": b"a: 1"})
    _tar(tar_qnemo, {"config.json": b"{}", "rank0.safetensors": b"x"})
    plain.write_bytes(b"hello")
    import gzip

    gz = tmp_path / "d"
    gz.write_bytes(gzip.compress(tar_nemo.read_bytes()))
    assert not_ours(str(tar_nemo), "nemo") is None and not_ours(str(gz), "nemo") is None
    assert not_ours(str(tar_qnemo), "qnemo") is None
    assert not_ours(str(tar_qnemo), "nemo") == ("is a tar archive that is not a .nemo checkpoint (its first members "
                                                "are config.json, rank0.safetensors)")
    assert not_ours(str(tar_nemo), "qnemo").startswith("is a tar archive that is not a .qnemo checkpoint")
    assert not_ours(str(plain), "nemo") == "is a file that is not a .nemo checkpoint (not a tar archive)"
    assert not_ours(src["tok"], "tokenizer") is None
    assert not_ours(str(plain), "tokenizer") == "is a file that is not a tokenizer (not a SentencePiece model)"
    assert not_ours(str(tar_nemo), "hf") == "is a file, not a Hugging Face checkpoint (a folder)"
    (tmp_path / "empty").mkdir()
    assert all(not_ours(str(tmp_path / "empty"), k) is None
               for k in ("nemo", "hf", "megatron-bridge", "qnemo", "tokenizer"))


def test_the_check_is_made_before_any_work_and_again_at_install(src, tmp_path, monkeypatch):
    """Refused before the source is opened; and a target that turns into something else
    while the output is written is refused at install time, its content kept."""
    from nemo_convert.convert import hf_to_nemo
    from nemo_convert.formats.io import staging

    out = tmp_path / "out"
    _users_folder(out)
    opened = []
    monkeypatch.setattr(hf_to_nemo, "open_hf", lambda *a, **kw: opened.append(a) or 1 / 0)
    with pytest.raises(OutputExistsError, match="has no model_config.yaml: it is not a .nemo checkpoint"):
        api.import_hf(src["hf"], str(out), overwrite=True, packed=False)
    assert opened == []
    monkeypatch.undo()

    target = tmp_path / "late.nemo"
    real_install = staging._install

    def someone_writes_meanwhile(*a, **kw):  # type: ignore[no-untyped-def]
        target.write_bytes(b"someone else's")
        return real_install(*a, **kw)

    monkeypatch.setattr(staging, "_install", someone_writes_meanwhile)
    with pytest.raises(OutputExistsError, match="is a file that is not a .nemo checkpoint"):
        api.import_hf(src["hf"], str(target), overwrite=True)
    assert target.read_bytes() == b"someone else's"
    assert sorted(os.listdir(tmp_path)) == ["late.nemo", "out"]


def test_output_errors_are_one_class(src, tmp_path):
    with pytest.raises(OutputError):
        api.import_hf(src["hf"], str(tmp_path / "x") + "/")
    assert issubclass(OutputExistsError, OutputError)
