"""Hostile inputs, end to end: each is refused with a one-line
:class:`~nemo_convert.errors.NemoConvertError` (or, where harmless, converted faithfully),
writes nothing outside its output — a sentinel folder next to the input must stay
byte-identical — leaves no output or staging entry behind, runs no code, and leaves the
input byte-identical.

Covered: ``.nemo`` members with ``..``, absolute paths, symlinks and hardlinks (plain and
gzipped tar, hostile member first or last) and an unpacked ``.nemo`` folder with a symlink
out; gzip bombs; indexes naming shards outside the model folder; non-UTF-8 tensor, file
and member names; NaN/Inf weights under ``--check-finite``; headers claiming absurd sizes
(safetensors, torch ``.bin``, tar, DCP ``.metadata``); overlapping safetensors offsets; a
``.nemo`` config contradicting its tensors; Python tags in ``model_config.yaml`` and in a
NeMo 2 ``context/model.yaml``. (Many plainer bad inputs are in ``test_errors.py``.)
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import struct
import sys
import tarfile
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import safetensors.torch
import torch
import yaml
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_llama

from nemo_convert import api
from nemo_convert.errors import ConfigError, InputError, MappingError, NemoConvertError
from nemo_convert.formats.io import tar_archive

STATE = ("model.embed_tokens.weight", "model.norm.weight")


# ====================================================================================== helpers
def digest(path: str) -> dict[str, str]:
    """sha256 of every file under ``path`` (symlinks by their target text), or of the file."""
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            return {"": hashlib.sha256(f.read()).hexdigest()}
    out = {}
    for folder, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, path)
            if os.path.islink(full):
                out[rel] = "-> " + os.readlink(full)
            else:
                with open(full, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def fails_cleanly(fn: Callable[[], Any], expected: type[NemoConvertError], out: str, *inputs: str,
                  match: str | None = None) -> NemoConvertError:
    """``fn`` raises ``expected`` with a one-line message (matching ``match``); no
    ``out`` and nothing new beside it; every input byte-identical."""
    before = {p: digest(p) for p in inputs}
    folder = os.path.dirname(out)
    listing = sorted(os.listdir(folder))
    with pytest.raises(expected) as ei:
        fn()
    msg = str(ei.value)
    assert msg.strip() and "\n" not in msg, repr(msg)
    if match is not None:
        assert match in msg, msg
    assert not os.path.lexists(out)
    assert sorted(os.listdir(folder)) == listing, "left behind: " + str(set(os.listdir(folder)) - set(listing))
    for p, d in before.items():
        assert digest(p) == d, f"{p} was changed"
    return ei.value


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else
                               torch.int32 if t.element_size() == 4 else torch.uint8)


def load_st(path: str) -> dict[str, torch.Tensor]:
    """safetensors.torch.load_file, but for any path (the Rust reader needs UTF-8 paths)."""
    with open(path, "rb") as f:
        return safetensors.torch.load(f.read())


def assert_same_weights(a: str, b: str) -> None:
    """Two HF folders hold bit-identical tensors (NaN payloads included)."""
    def tensors(folder: str) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for n in sorted(os.listdir(folder)):
            if n.endswith(".safetensors"):
                out.update(load_st(os.path.join(folder, n)))
        return out
    ta, tb = tensors(a), tensors(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert torch.equal(bits(ta[k]), bits(tb[k])), k


def header_of(path: str) -> tuple[dict[str, Any], bytes]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()


def write_safetensors_raw(path: str, header: dict[str, Any], data: bytes) -> None:
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def _touch_marker(path: str) -> str:
    with open(path, "w") as f:
        f.write("pwned")
    return path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("hostile")
    hf = make_tiny_llama(str(base / "hf"), tokenizer=False)
    nemo = str(base / "m.nemo")
    api.import_hf(hf, nemo)
    return {"hf": hf, "nemo": nemo}


@pytest.fixture
def hf(pristine: dict[str, str], tmp_path: Any) -> str:
    return shutil.copytree(pristine["hf"], str(tmp_path / "hf"))


@pytest.fixture
def out(tmp_path: Any) -> str:
    (tmp_path / "out").mkdir()
    return str(tmp_path / "out" / "result")


@pytest.fixture
def sentinel(tmp_path: Any) -> str:
    """A folder next to the input that nothing may touch; holds a 'secret' file."""
    folder = tmp_path / "sentinel"
    folder.mkdir()
    (folder / "secret").write_bytes(b"do not touch\n")
    return str(folder)


@pytest.fixture
def private_tmp(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The system temp folder, for this test only (gzip extraction goes there)."""
    folder = tmp_path / "systmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return str(folder)


def members_of(nemo: str) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(nemo, "r:") as tf:
        return [(m, tf.extractfile(m).read() if m.isfile() else None) for m in tf.getmembers()]


def write_tar(path: str, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:") -> str:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


# ====================================================================================== .nemo members
def _hostile_members(kind: str, sentinel: str) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    def info(name: str, **kw: Any) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        for k, v in kw.items():
            setattr(ti, k, v)
        return ti
    secret = os.path.join(sentinel, "secret")
    payload = b"overwritten!\n"
    if kind == "dotdot":
        # from the gzip extraction folder (<tmp>/systmp/nemo-convert-gz-*/) this is <tmp>/sentinel/secret
        return [(info("./model_weights/../../../sentinel/secret", size=len(payload)), payload)]
    if kind == "dotdot-deep":
        return [(info("./" + "../" * 12 + sentinel.lstrip("/") + "/pwned", size=len(payload)), payload)]
    if kind == "absolute":
        return [(info(secret, size=len(payload)), payload)]
    if kind == "symlink-dir":  # a link to the sentinel, then a file written "through" it
        return [(info("./context", type=tarfile.SYMTYPE, linkname=sentinel), None),
                (info("./context/secret", size=len(payload)), payload)]
    if kind == "symlink-file":
        return [(info("./tokenizer.model", type=tarfile.SYMTYPE, linkname=secret), None)]
    if kind == "hardlink-abs":
        return [(info("./tokenizer.model", type=tarfile.LNKTYPE, linkname=secret), None)]
    if kind == "hardlink-rel":
        return [(info("./tokenizer.model", type=tarfile.LNKTYPE, linkname="../sentinel/secret"), None)]
    raise AssertionError(kind)


HOSTILE_KINDS = ["dotdot", "dotdot-deep", "absolute", "symlink-dir", "symlink-file", "hardlink-abs", "hardlink-rel"]


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize("mode", ["w:", "w:gz"], ids=["tar", "gzip"])
@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_nemo_member_escaping_the_archive_is_refused(pristine, tmp_path, out, sentinel, private_tmp, kind, mode,
                                                     position):
    good = members_of(pristine["nemo"])
    evil = _hostile_members(kind, sentinel)
    members = evil + good if position == "first" else good + evil
    bad = write_tar(str(tmp_path / "evil.nemo"), members, mode)
    around = sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path.parent))
    for fn in (lambda: api.export_hf(bad, out), lambda: api.inspect_checkpoint(bad)):
        fails_cleanly(fn, InputError, out, bad, sentinel, match="refusing member")
    assert os.listdir(private_tmp) == []  # the gzip extraction folder is gone
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path.parent))) == around
    assert not os.path.exists(os.path.join(sentinel, "pwned"))


def test_unpacked_nemo_with_a_symlink_out_is_refused(pristine, tmp_path, out, sentinel):
    folder = tmp_path / "unpacked"
    with tarfile.open(pristine["nemo"], "r:") as tf:
        tf.extractall(folder, filter="data")
    outside = os.path.join(sentinel, "model_config.yaml")
    shutil.copy(folder / "model_config.yaml", outside)
    os.remove(folder / "model_config.yaml")
    os.symlink(outside, folder / "model_config.yaml")
    fails_cleanly(lambda: api.export_hf(str(folder), out), InputError, out, str(folder), sentinel,
                  match="symlink pointing outside")


# ====================================================================================== gzip bombs
def _gzip_bomb(path: str, declared: int, actual: int) -> str:
    """A gzipped .nemo: a config, then a member declaring ``declared`` bytes of which
    ``actual`` zero bytes really follow (compressing ~1000:1)."""
    with gzip.open(path, "wb", compresslevel=9) as g:
        cfg = tarfile.TarInfo("./model_config.yaml")
        cfg.size = 5
        g.write(cfg.tobuf(tarfile.PAX_FORMAT) + b"a: 1\n".ljust(512, b"\0"))
        big = tarfile.TarInfo("./model_weights/__0_0.distcp")
        big.size = declared
        g.write(big.tobuf(tarfile.PAX_FORMAT))
        zeros = bytes(1 << 20)
        for _ in range(actual >> 20):
            g.write(zeros)
        if actual == declared:
            g.write(bytes(-declared % 512) + bytes(1024))
    return path


def test_gzip_bomb_declaring_a_huge_member(tmp_path, out, private_tmp):
    bomb = _gzip_bomb(str(tmp_path / "bomb.nemo"), declared=1 << 40, actual=16 << 20)
    assert os.path.getsize(bomb) < 100_000
    fails_cleanly(lambda: api.export_hf(bomb, out), InputError, out, bomb,
                  match="impossible for the compressed size")
    assert os.listdir(private_tmp) == []


def test_gzip_bomb_larger_than_the_free_space(tmp_path, out, private_tmp, monkeypatch):
    """64 MiB of zeros (a plausible ratio) when the disk has 32 MiB free: refused before
    a byte of it is written."""
    bomb = _gzip_bomb(str(tmp_path / "bomb.nemo"), declared=64 << 20, actual=64 << 20)
    free = 32 << 20
    monkeypatch.setattr(tar_archive.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(free, 0, free))
    written = []
    real_copy_out = tar_archive.TarArchive._copy_out
    monkeypatch.setattr(tar_archive.TarArchive, "_copy_out",
                        lambda self, tf, ti, dest: (written.append(ti.name), real_copy_out(self, tf, ti, dest)))
    fails_cleanly(lambda: api.export_hf(bomb, out), InputError, out, bomb, match="fill the disk")
    assert "./model_weights/__0_0.distcp" not in written
    assert os.listdir(private_tmp) == []


# ====================================================================================== indexes
@pytest.mark.parametrize("where", ["parent", "absolute", "subfolder"])
def test_safetensors_index_naming_a_shard_outside_the_folder(hf, out, tmp_path, where):
    outside = str(tmp_path / "outside.safetensors")
    shutil.copy(os.path.join(hf, "model.safetensors"), outside)
    os.makedirs(os.path.join(hf, "sub"))
    shutil.copy(outside, os.path.join(hf, "sub", "x.safetensors"))
    name = {"parent": "../outside.safetensors", "absolute": outside, "subfolder": "sub/x.safetensors"}[where]
    keys = list(load_file(outside))
    with open(os.path.join(hf, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: name for k in keys}}, f)
    os.remove(os.path.join(hf, "model.safetensors"))
    fails_cleanly(lambda: api.import_hf(hf, out), InputError, out, hf, outside, match="not a plain file name")


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_bin_index_naming_a_shard_outside_the_folder(hf, out, tmp_path, where):
    outside = str(tmp_path / "outside.bin")
    sd = load_file(os.path.join(hf, "model.safetensors"))
    torch.save(sd, outside)
    os.remove(os.path.join(hf, "model.safetensors"))
    with open(os.path.join(hf, "pytorch_model-00001-of-00001.bin"), "wb"):
        pass  # a decoy so that the folder has .bin weights
    with open(os.path.join(hf, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"weight_map": {k: "../outside.bin" if where == "parent" else outside for k in sd}}, f)
    fails_cleanly(lambda: api.import_hf(hf, out), InputError, out, hf, outside, match="plain file name")


# ====================================================================================== names
def _add_tensor(folder: str, name: str, tensor: torch.Tensor) -> None:
    path = os.path.join(folder, "model.safetensors")
    t = load_file(path)
    t[name] = tensor
    save_file(t, path, metadata={"format": "pt"})


@contextlib.contextmanager
def real_streams() -> Iterator[Callable[[], tuple[str, str]]]:
    """stdout/stderr that behave like a real interpreter's under a UTF-8 locale (stderr
    escapes lone surrogates, stdout is strict); yields a reader of what was written.
    (Installed inside the test body: pytest re-installs its own capture after set-up.)"""
    so = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    se = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = so, se
    try:
        yield lambda: (so.buffer.getvalue().decode(), se.buffer.getvalue().decode())
    finally:
        sys.stdout, sys.stderr = saved


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    """``main`` in-process, with the process-wide settings it changes restored."""
    from nemo_convert.cli.main import main

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGXFSZ)}
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    yield lambda *argv: main([os.fsdecode(a) for a in argv])
    for s, h in saved.items():
        signal.signal(s, h)


def test_tensor_name_that_is_not_utf8(hf, out, cli):
    """A header name with a lone surrogate (valid JSON, not encodable as UTF-8)."""
    name = "model.layers.0.x\udc80y"
    _add_tensor(hf, "placeholder", torch.ones(2))
    header, data = header_of(os.path.join(hf, "model.safetensors"))
    header[name] = header.pop("placeholder")
    write_safetensors_raw(os.path.join(hf, "model.safetensors"), header, data)
    exc = fails_cleanly(lambda: api.import_hf(hf, out), MappingError, out, hf)
    assert exc.unconsumed == [name]
    with real_streams() as read:
        assert cli("import", hf, "-o", out) == 2
    _, err = read()
    assert err.splitlines() == [(r"nemo-convert: error: the checkpoint does not match the model family's mapping; "
                                 r"source tensors not consumed: model.layers.0.x\udc80y")]
    rep = api.import_hf(hf, out, allow_unmapped=("*x*",))
    assert rep.dropped == [name]


def test_file_and_folder_names_that_are_not_utf8(pristine, tmp_path, cli):
    base = os.fsencode(str(tmp_path))
    src = os.fsdecode(base + b"/model-\xff\xfe")
    shutil.copytree(pristine["hf"], src)
    # the weights, under a non-UTF-8 shard name that the index names with a JSON escape
    shard = "model-\udcff.safetensors"
    os.rename(os.path.join(src, "model.safetensors"), os.path.join(src, shard))
    keys = list(load_st(os.path.join(src, shard)))
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: shard for k in keys}}, f)
    before = digest(src)
    nemo = os.fsdecode(base + b"/out-\xe9.nemo")
    with real_streams() as read:
        assert cli("import", src, "-o", nemo) == 0
        assert cli("import", src, "-o", nemo, "--overwrite", "--json") == 0
    stdout, stderr = read()
    assert json.loads(stdout)["output"] == nemo
    assert r"out-\udce9.nemo" in stderr  # the summary line, escaped
    back = os.fsdecode(base + b"/back-\x80")
    assert cli("export", nemo, "-o", back, "-q") == 0
    assert_same_weights(pristine["hf"], back)
    assert digest(src) == before


def test_nemo_member_name_that_is_not_utf8(pristine, tmp_path, out):
    members = members_of(pristine["nemo"])
    extra = tarfile.TarInfo(os.fsdecode(b"./extra-\xff\xfe.bin"))
    extra.size = 3
    bad = write_tar(str(tmp_path / "names.nemo"), members + [(extra, b"abc")])
    before = digest(bad)
    api.export_hf(bad, out)  # an unreferenced extra member is ignored
    assert_same_weights(pristine["hf"], out)
    assert digest(bad) == before


# ====================================================================================== NaN / Inf
WARNING = ("2 tensor(s) hold NaN or Inf values: decoder.final_layernorm.weight (2), "
           "embedding.word_embeddings.weight (2)")


@pytest.fixture
def nan_hf(hf: str) -> str:
    path = os.path.join(hf, "model.safetensors")
    t = load_file(path)
    t["model.embed_tokens.weight"][3, :2] = float("nan")
    t["model.norm.weight"][0] = float("inf")
    t["model.norm.weight"][1] = -float("inf")
    save_file(t, path, metadata={"format": "pt"})
    return hf


def test_check_finite_reports_nan_and_inf(nan_hf, tmp_path, cli):
    nemo = str(tmp_path / "nan.nemo")
    before = digest(nan_hf)
    rep = api.import_hf(nan_hf, nemo, check_finite=True)
    assert rep.non_finite == {"embedding.word_embeddings.weight": 2, "decoder.final_layernorm.weight": 2}
    assert rep.warnings == [WARNING]
    # the CLI: the report's non_finite in --json, one warning line on stderr
    with real_streams() as read:
        assert cli("import", nan_hf, "-o", str(tmp_path / "cli.nemo"), "--check-finite", "--json") == 0
    stdout, stderr = read()
    assert json.loads(stdout)["non_finite"] == rep.non_finite
    assert [x for x in stderr.splitlines() if x.strip()] == ["warning: " + WARNING]
    # without the flag: no counting, no warning; the NaN payloads survive bit for bit
    assert api.import_hf(nan_hf, nemo, overwrite=True).non_finite == {}
    back = str(tmp_path / "back")
    rep = api.export_hf(nemo, back, check_finite=True)
    assert rep.non_finite == {"model.embed_tokens.weight": 2, "model.norm.weight": 2}
    assert_same_weights(nan_hf, back)
    assert digest(nan_hf) == before


def test_check_finite_warning_is_one_line_when_not_a_terminal(nan_hf, tmp_path, cli):
    """Logs get the whole warning and summary on one line each (not wrapped at 80 columns)."""
    with real_streams() as read:
        assert cli("import", nan_hf, "-o", str(tmp_path / "a-rather-long-output-name-for-the-summary.nemo"),
                   "--check-finite") == 0
    lines = [x for x in read()[1].splitlines()  # (minus the progress bar and the notes)
             if x.strip() and "━" not in x and not x.startswith("note: ")]
    assert lines[0] == "warning: " + WARNING
    assert lines[1].startswith("wrote ") and lines[1].endswith("family llama, layout dist"), lines


def test_tied_embeddings_holding_nan(tmp_path):
    """A stored lm_head bit-identical to the tied embedding, NaN included, is accepted
    (NaN != NaN must not make the copies "differ")."""
    hf = make_tiny_llama(str(tmp_path / "tied"), tokenizer=False, tie_word_embeddings=True)
    path = os.path.join(hf, "model.safetensors")
    t = load_file(path)
    t["model.embed_tokens.weight"][0, 0] = float("nan")
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    save_file(t, path, metadata={"format": "pt"})
    rep = api.import_hf(hf, str(tmp_path / "tied.nemo"), check_finite=True)
    assert rep.non_finite == {"embedding.word_embeddings.weight": 1}


# ====================================================================================== absurd sizes
def test_safetensors_header_claiming_absurd_shapes(hf, out):
    path = os.path.join(hf, "model.safetensors")
    header, data = header_of(path)
    entry = header["model.norm.weight"]
    entry["shape"] = [2**40, 2**40]
    entry["data_offsets"] = [entry["data_offsets"][0], entry["data_offsets"][0] + 2**80 * 4]
    write_safetensors_raw(path, header, data)
    fails_cleanly(lambda: api.import_hf(hf, out), InputError, out, hf, match="model.safetensors")


def test_safetensors_tensors_sharing_bytes(hf, out):
    """``k_proj`` pointed at the first bytes of ``q_proj``: overlapping offsets."""
    path = os.path.join(hf, "model.safetensors")
    header, data = header_of(path)
    q, k = header["model.layers.0.self_attn.q_proj.weight"], header["model.layers.0.self_attn.k_proj.weight"]
    n = k["data_offsets"][1] - k["data_offsets"][0]
    k["data_offsets"] = [q["data_offsets"][0], q["data_offsets"][0] + n]
    write_safetensors_raw(path, header, data)
    fails_cleanly(lambda: api.import_hf(hf, out), InputError, out, hf, match="overlap")


class _Storage:
    pass


_STORAGE = _Storage()


class _Claim:
    """Pickles as a tensor of ``size`` over the 4-byte storage ``_STORAGE``."""

    def __init__(self, size: tuple[int, ...]) -> None:
        self.size = size

    def __reduce__(self) -> Any:
        stride = tuple(int(torch.tensor(self.size[i + 1:]).prod()) for i in range(len(self.size)))
        return (torch._utils._rebuild_tensor_v2, (_STORAGE, 0, self.size, stride, False, collections.OrderedDict()))


class _TorchPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return ("storage", torch.FloatStorage, "0", "cpu", 1) if obj is _STORAGE else None


def test_torch_bin_claiming_more_than_its_storage(hf, out):
    """A pytorch_model.bin whose embedding claims 2^31 x 2^31 floats over 4 bytes."""
    real = load_file(os.path.join(hf, "model.safetensors"))
    os.remove(os.path.join(hf, "model.safetensors"))
    buf = io.BytesIO()
    _TorchPickler(buf, protocol=2).dump({k: _Claim((2**31, 2**31) if k == STATE[0] else tuple(v.shape))
                                         for k, v in real.items()})
    with zipfile.ZipFile(os.path.join(hf, "pytorch_model.bin"), "w") as zf:
        zf.writestr("archive/data.pkl", buf.getvalue())
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/data/0", struct.pack("<f", 1.0))
        zf.writestr("archive/version", "3\n")
    fails_cleanly(lambda: api.import_hf(hf, out), InputError, out, hf, match="reads past the end")


def test_tar_member_claiming_more_than_the_archive(pristine, tmp_path, out):
    """The size field of the first member's header set to 8 GiB (base-256 encoding)."""
    with open(pristine["nemo"], "rb") as f:
        data = bytearray(f.read())
    with tarfile.open(pristine["nemo"], "r:") as tf:
        first = next(m for m in tf.getmembers() if m.isfile())
    hdr = first.offset_data - 512  # its ustar header (after any PAX header)
    data[hdr + 124:hdr + 136] = b"\x80" + (8 << 30).to_bytes(11, "big")
    data[hdr + 148:hdr + 156] = b" " * 8
    data[hdr + 148:hdr + 156] = b"%06o\0 " % sum(data[hdr:hdr + 512])
    bad = str(tmp_path / "huge.nemo")
    with open(bad, "wb") as f:
        f.write(bytes(data))
    fails_cleanly(lambda: api.export_hf(bad, out), InputError, out, bad)


def test_dcp_metadata_claiming_bytes_past_its_data_file(pristine, tmp_path, out):
    folder = tmp_path / "unpacked"
    with tarfile.open(pristine["nemo"], "r:") as tf:
        tf.extractall(folder, filter="data")
    md_path = folder / "model_weights" / ".metadata"
    md = pickle.loads(md_path.read_bytes())  # trusted here: our own output, torch's classes
    for info in md.storage_data.values():
        info.offset += 10**12
    md_path.write_bytes(pickle.dumps(md))
    fails_cleanly(lambda: api.export_hf(str(folder), out), InputError, out, str(folder), match="truncated")


# ====================================================================================== config vs tensors
def test_nemo_config_contradicting_its_tensors(pristine, tmp_path, out):
    members = members_of(pristine["nemo"])
    for i, (info, data) in enumerate(members):
        if info.name.endswith("model_config.yaml"):
            cfg = yaml.safe_load(data)
            cfg["hidden_size"] = cfg["hidden_size"] // 2
            new = yaml.safe_dump(cfg).encode()
            info.size = len(new)
            members[i] = (info, new)
    bad = write_tar(str(tmp_path / "contradicts.nemo"), members)
    fails_cleanly(lambda: api.export_hf(bad, out), ConfigError, out, bad)


# ====================================================================================== YAML tags
TAGS = {
    "apply": "!!python/object/apply:test_hostile_inputs._touch_marker ['{m}']",
    "new": "!!python/object/new:test_hostile_inputs._touch_marker ['{m}']",
    "name": "!!python/name:test_hostile_inputs._touch_marker ''",
    "module": "!!python/module:test_hostile_inputs ''",
    "os-system": "!!python/object/apply:os.system ['touch {m}']",
    "full-uri": "!<tag:yaml.org,2002:python/object/apply:test_hostile_inputs._touch_marker> ['{m}']",
    "on-a-key": "? !!python/object/apply:test_hostile_inputs._touch_marker ['{m}']\n: 1",
}


@pytest.mark.parametrize("tag", list(TAGS))
def test_model_config_yaml_with_python_tags(pristine, tmp_path, out, tag):
    marker = tmp_path / "MARKER"
    members = members_of(pristine["nemo"])
    for i, (info, data) in enumerate(members):
        if info.name.endswith("model_config.yaml"):
            line = TAGS[tag].format(m=marker)
            new = (line if line.startswith("?") else "evil: " + line).encode() + b"\n" + data
            info.size = len(new)
            members[i] = (info, new)
    bad = write_tar(str(tmp_path / "tagged.nemo"), members)
    fails_cleanly(lambda: api.export_hf(bad, out), InputError, out, bad,
                  match="not a valid YAML config (could not determine a constructor for the tag")
    fails_cleanly(lambda: api.inspect_checkpoint(bad), InputError, out, bad)
    assert not marker.exists()


@pytest.fixture(scope="module")
def nemo2(pristine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A NeMo 2 folder (weights/ with the module. prefix, context/model.yaml) built from
    the pristine .nemo, and its model.yaml as a dict: the arguments NeMo's ``HFLlamaImporter.config``
    passes (NeMo 8cfedd7 ``llama.py`` lines 754-775), nothing else."""
    from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter
    from nemo_convert.formats.io.sink import DirectorySink

    folder = str(tmp_path_factory.mktemp("nemo2") / "ckpt")
    with api.open_checkpoint(pristine["nemo"]) as ck:
        cfg = ck.config
        w = DistWeightsWriter(DirectorySink(folder), [ck.source.info(k) for k in ck.source.keys()],
                              prefix="module.", folder="weights")
        for k in ck.source.keys():
            w.write(k, ck.source.load(k))
        w.close()
    model = {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaModel",
             "config": {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaConfig",
                        **{k: cfg[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                               "num_query_groups", "kv_channels", "rotary_base", "layernorm_epsilon")},
                        "seq_length": cfg["encoder_seq_length"], "init_method_std": 0.02, "gated_linear_unit": True,
                        "fp16": False, "bf16": False, "share_embeddings_and_output_weights": False,
                        "make_vocab_size_divisible_by": 8}}
    os.makedirs(os.path.join(folder, "context"))
    return {"folder": folder, "model": model}


def _nemo2_copy(nemo2: dict[str, Any], tmp_path: Any, text: str) -> str:
    folder = shutil.copytree(nemo2["folder"], str(tmp_path / "nemo2"))
    with open(os.path.join(folder, "context", "model.yaml"), "w") as f:
        f.write(text)
    return folder


def test_nemo2_context_yaml_tags_are_inert(pristine, nemo2, tmp_path, out):
    """Fiddle-style tags anywhere in context/model.yaml become inert strings: the
    conversion works and nothing runs."""
    marker = tmp_path / "MARKER"
    body = yaml.safe_dump(nemo2["model"], sort_keys=False)
    body = body.replace("config:\n", "config:\n  activation_func: !!python/name:torch.nn.functional.silu ''\n")
    body += "".join(f"evil_{k}: {v.format(m=marker)}\n" for k, v in TAGS.items() if not v.startswith("?"))
    folder = _nemo2_copy(nemo2, tmp_path, body)
    before = digest(folder)
    api.export_hf(folder, out)
    assert_same_weights(pristine["hf"], out)
    assert not marker.exists()
    assert digest(folder) == before


@pytest.mark.parametrize("where,expected", [("num_layers", ConfigError), ("hidden_size", ConfigError),
                                            ("config", InputError)])
def test_nemo2_context_yaml_tag_in_a_needed_field(nemo2, tmp_path, out, where, expected):
    marker = tmp_path / "MARKER"
    model = json.loads(json.dumps(nemo2["model"]))
    tag = TAGS["apply"].format(m=marker)
    if where == "config":
        model["config"] = "XXTAGXX"
    else:
        model["config"][where] = "XXTAGXX"
    text = yaml.safe_dump(model, sort_keys=False)
    assert text.count("XXTAGXX") == 1
    folder = _nemo2_copy(nemo2, tmp_path, text.replace("XXTAGXX", tag))
    fails_cleanly(lambda: api.export_hf(folder, out), expected, out, folder)
    assert not marker.exists()
