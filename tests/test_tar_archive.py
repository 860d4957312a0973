"""Tests of the streaming tar writer and the in-place / gzip / folder readers."""

from __future__ import annotations

import gzip
import io
import mmap
import os
import shutil
import subprocess
import tarfile

import pytest

from nemo_convert.errors import InputError
from nemo_convert.formats.io import tar_writer as ta
from nemo_convert.formats.io.tar_archive import (
    DirectoryContainer,
    MemberNotFoundError,
    TarArchive,
    TarWriter,
    find_member,
    open_nemo_container,
    tar_size_field,
)

HAVE_TAR = shutil.which("tar") is not None
LONG = "model_weights/" + "d" * 120 + "/ünïcode_" + "f" * 90 + ".distcp"


def _write_sample(path: str, payload: bytes, *, mtime: int = 1_700_000_000) -> None:
    with TarWriter(path, mtime=mtime) as w:
        w.add_bytes("model_config.yaml", b"precision: bf16\n")
        with w.open_member("model_weights/__0_0.distcp") as s:
            for i in range(0, len(payload), 700_001):
                assert s.tell() == i
                s.write(payload[i : i + 700_001])
        w.add_bytes("model_weights/.metadata", b"")
        w.add_bytes(LONG, b"long")


@pytest.fixture()
def payload() -> bytes:
    return os.urandom(3 * 1024 * 1024 + 17)


def test_writer_output_read_by_tarfile(tmp_path, payload):
    p = str(tmp_path / "a.nemo")
    _write_sample(p, payload)
    assert os.path.getsize(p) % ta.RECORD == 0
    with tarfile.open(p, "r:") as tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        assert names == [".", "./model_config.yaml", "./model_weights", "./model_weights/__0_0.distcp",
                         "./model_weights/.metadata", "./model_weights/" + "d" * 120, "./" + LONG]
        for m in members:
            assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 1_700_000_000)
            assert m.mode == (0o755 if m.isdir() else 0o644)
        assert tf.extractfile("./model_weights/__0_0.distcp").read() == payload
        assert tf.extractfile("./" + LONG).read() == b"long"
        assert tf.extractfile("./model_config.yaml").read() == b"precision: bf16\n"


@pytest.mark.skipif(not HAVE_TAR, reason="no tar binary")
def test_writer_output_read_by_gnu_tar(tmp_path, payload):
    p = str(tmp_path / "a.nemo")
    _write_sample(p, payload)
    out = subprocess.run(["tar", "-tvf", p], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    assert [line.split()[-1] for line in lines] == [
        "./", "./model_config.yaml", "./model_weights/", "./model_weights/__0_0.distcp",
        "./model_weights/.metadata", "./model_weights/" + "d" * 120 + "/", "./" + LONG]
    assert lines[0].startswith("drwxr-xr-x 0/0") and lines[1].startswith("-rw-r--r-- 0/0")
    assert str(len(payload)) in lines[3]
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run(["tar", "-xf", p, "-C", str(dest)], check=True)
    assert (dest / "model_weights" / "__0_0.distcp").read_bytes() == payload
    assert (dest / LONG).read_bytes() == b"long"


def test_writer_is_deterministic(tmp_path, payload):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _write_sample(a, payload)
    _write_sample(b, payload)
    assert open(a, "rb").read() == open(b, "rb").read()


def test_member_stream_seek_and_add_file(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(100_000))
    p = str(tmp_path / "a.tar")
    with TarWriter(p) as w:
        with w.open_member("h.bin") as s:
            s.write(b"\0" * 8 + b"body")
            s.seek(0)
            s.write(b"HEADER!!")
            s.seek(0, 2)
            assert s.tell() == 12
            s.write(memoryview(bytearray(b"tail")))
        w.add_file("dir/copy.bin", str(src))
        w.add_dir("empty")
    with TarArchive(p) as arc:
        assert arc.read_bytes("h.bin") == b"HEADER!!bodytail"
        assert arc.read_bytes("dir/copy.bin") == src.read_bytes()
        assert arc.is_dir("empty") and arc.is_dir("dir") and arc.exists("empty")
        assert arc.names() == ["h.bin", "dir/copy.bin"]


def _archive_with_copies(tmp_path, name: str) -> bytes:
    p = str(tmp_path / name)
    with TarWriter(p) as w:
        w.add_bytes("first.txt", b"odd-sized member\n")
        for i, size in enumerate((0, 1, 513, 3_000_017)):
            src = tmp_path / f"part{i}.bin"
            src.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
            w.add_file(f"parts/{i}.bin", str(src))
        with w.open_member("after.bin") as s:  # buffered writes still line up after a kernel copy
            s.write(b"after")
    return open(p, "rb").read()


def test_add_file_in_kernel_equals_the_user_space_copy(tmp_path, monkeypatch):
    calls = []
    real = os.copy_file_range

    def counting(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", counting)
    kernel = _archive_with_copies(tmp_path, "kernel.tar")
    assert calls  # the kernel path was taken
    monkeypatch.setattr(os, "copy_file_range", lambda *a: (_ for _ in ()).throw(OSError(18, "EXDEV")))
    user = _archive_with_copies(tmp_path, "user.tar")
    assert kernel == user
    with tarfile.open(str(tmp_path / "kernel.tar")) as tf:
        assert tf.extractfile("./parts/3.bin").read() == (tmp_path / "part3.bin").read_bytes()
        assert tf.extractfile("./after.bin").read() == b"after"


def test_writer_misuse(tmp_path):
    w = TarWriter(str(tmp_path / "a.tar"))
    with w.open_member("a") as s:
        s.write(b"x")
        with pytest.raises(RuntimeError):
            w.add_bytes("b", b"")
        with pytest.raises(RuntimeError):
            with w.open_member("c"):
                pass
    for bad in ("../x", "/abs", "", "a/../b"):
        with pytest.raises(ValueError):
            w.add_bytes(bad, b"")
    with pytest.raises(ValueError):
        w.add_bytes("a", b"")  # duplicate
    with pytest.raises(ValueError):
        w.add_bytes("a/b", b"")  # 'a' is a file
    with pytest.raises(OSError):
        with w.open_member("d") as s:
            raise OSError("disk full")
    with pytest.raises(RuntimeError):
        w.add_bytes("e", b"")  # the writer failed
    w.close()
    with pytest.raises(ValueError):
        s.write(b"late")


def test_size_field_encoding():
    assert tar_size_field(0) == b"00000000000\0"
    assert tar_size_field(8**11 - 1) == b"77777777777\0"
    for size in (8**11, 9 << 30, 5 << 40, 256**11 - 1):
        field = tar_size_field(size)
        assert len(field) == 12 and field[0] == 0x80
        assert tarfile.nti(field) == size
    with pytest.raises(ValueError):
        tar_size_field(256**11)
    header = ta._header(b"./big.bin", 20 << 30, b"0", 0o644, 0)
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
    assert info.size == 20 << 30 and info.name == "./big.bin"


def _sparse_ok(folder) -> bool:
    probe = os.path.join(folder, "probe")
    with open(probe, "wb") as f:
        f.seek(64 << 20)
        f.write(b"x")
    sparse = os.stat(probe).st_blocks * 512 < (1 << 20)
    os.unlink(probe)
    return sparse


def test_member_over_8gib_as_sparse_file(tmp_path):
    if not _sparse_ok(tmp_path):
        pytest.skip("filesystem without sparse files")
    p = str(tmp_path / "big.nemo")
    big = (8 << 30) + 4096 + 1
    with TarWriter(p) as w:
        with w.open_member("model_weights/huge.distcp") as s:
            s.seek(big - 1)
            s.write(b"Z")
        w.add_bytes("model_config.yaml", b"after")
    with tarfile.open(p, "r:") as tf:
        assert tf.getmember("./model_weights/huge.distcp").size == big
        assert tf.extractfile("./model_config.yaml").read() == b"after"
    if HAVE_TAR:
        out = subprocess.run(["tar", "-tvf", p], capture_output=True, text=True, check=True)
        assert str(big) in out.stdout and "./model_config.yaml" in out.stdout
    with TarArchive(p) as arc:
        region = arc.region("model_weights/huge.distcp")
        assert region.length == big and region.read(big - 1, 1) == b"Z"
        assert arc.read_bytes("model_config.yaml") == b"after"


def test_reader_regions_are_the_member_bytes(tmp_path, payload):
    p = str(tmp_path / "a.nemo")
    _write_sample(p, payload)
    with open_nemo_container(p) as arc:
        assert isinstance(arc, TarArchive) and arc.extracted_dir is None
        assert arc.names() == ["model_config.yaml", "model_weights/__0_0.distcp",
                               "model_weights/.metadata", LONG]
        r = arc.region("model_weights/__0_0.distcp")
        assert r.path == p and r.offset % 512 == 0 and r.length == len(payload)
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            assert m[r.offset : r.offset + r.length] == payload
        with arc.open("model_weights/__0_0.distcp") as fh:
            fh.seek(1000)
            assert fh.read(10) == payload[1000:1010]
        assert arc.read_bytes("model_weights/.metadata") == b""
        assert arc.is_dir("model_weights") and not arc.is_dir("model_config.yaml")
        assert arc.exists("model_weights/") and not arc.exists("nope")
        with pytest.raises(MemberNotFoundError) as e:
            arc.region("nope")
        assert isinstance(e.value, KeyError) and isinstance(e.value, InputError)
        assert str(e.value) == f"{p}: 'nope': no such member"
        assert find_member(arc, "model_config.yaml") == "model_config.yaml"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_reads_archives_written_like_nemo(tmp_path, fmt):
    src = tmp_path / "src"
    (src / "model_weights").mkdir(parents=True)
    (src / "model_config.yaml").write_bytes(b"cfg")
    (src / "model_weights" / "common.pt").write_bytes(b"c" * 1000)
    p = str(tmp_path / "n.nemo")
    with tarfile.open(p, "w:", format=fmt) as tar:
        tar.add(str(src), arcname=".")
    with open_nemo_container(p) as arc:
        assert sorted(arc.names()) == ["model_config.yaml", "model_weights/common.pt"]
        assert arc.read_bytes("model_weights/common.pt") == b"c" * 1000


def _hostile(path: str, kind: str, mode: str = "w:") -> None:
    with tarfile.open(path, mode) as tar:
        good = tarfile.TarInfo("./model_config.yaml")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"cfg"))
        if kind == "dup":
            tar.addfile(good, io.BytesIO(b"cfg"))
            return
        info = tarfile.TarInfo({"dotdot": "./../evil", "abs": "/tmp/evil-abs", "symlink": "./link",
                                "hardlink": "./hard", "fifo": "./fifo", "dotdot2": "a/../../evil"}[kind])
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "model_config.yaml"
        elif kind == "fifo":
            info.type = tarfile.FIFOTYPE
        else:
            info.size = 4
        tar.addfile(info, io.BytesIO(b"evil") if info.size else None)


@pytest.mark.parametrize("mode", ["w:", "w:gz"])
@pytest.mark.parametrize("kind", ["dotdot", "dotdot2", "abs", "symlink", "hardlink", "fifo", "dup"])
def test_hostile_archives_are_refused(tmp_path, kind, mode):
    p = str(tmp_path / "evil.nemo")
    _hostile(p, kind, mode)
    scratch = tmp_path / "scratch" / "tmp"
    scratch.mkdir(parents=True)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(InputError) as e:
        open_nemo_container(p, tmp_dir=str(scratch))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: refusing member ")
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(scratch) == []  # the extraction folder was removed
    assert not os.path.exists(tmp_path / "scratch" / "evil")
    assert not os.path.exists("/tmp/evil-abs")


def test_gzip_nemo_is_extracted_and_cleaned(tmp_path, payload):
    plain = str(tmp_path / "a.nemo")
    _write_sample(plain, payload)
    gz = str(tmp_path / "old.nemo")
    with open(plain, "rb") as f, gzip.open(gz, "wb", compresslevel=1) as g:
        shutil.copyfileobj(f, g)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    arc = open_nemo_container(gz, tmp_dir=str(scratch))
    assert isinstance(arc, TarArchive) and arc.extracted_dir
    assert arc.extracted_dir.startswith(str(scratch))
    assert arc.names() == ["model_config.yaml", "model_weights/__0_0.distcp",
                           "model_weights/.metadata", LONG]
    r = arc.region("model_weights/__0_0.distcp")
    assert r.path.startswith(arc.extracted_dir) and r.offset == 0
    assert arc.read_bytes("model_weights/__0_0.distcp") == payload
    assert arc.is_dir("model_weights")
    arc.close()
    assert os.listdir(scratch) == []


def test_gzip_absurd_sizes_and_disk_cap(tmp_path, monkeypatch):
    bomb = tarfile.TarInfo("./model_weights/big")
    bomb.size = 1 << 40
    p = str(tmp_path / "bomb.nemo")
    with gzip.open(p, "wb") as g:
        g.write(bomb.tobuf(tarfile.PAX_FORMAT))
    with pytest.raises(InputError, match="impossible for the compressed size"):
        open_nemo_container(p, tmp_dir=str(tmp_path))
    small = str(tmp_path / "small.nemo")
    with tarfile.open(small, "w:gz") as tar:
        info = tarfile.TarInfo("w.bin")
        info.size = 10_000
        tar.addfile(info, io.BytesIO(b"\0" * 10_000))
    monkeypatch.setattr(ta.shutil, "disk_usage", lambda _p: shutil._ntuple_diskusage(1, 1, 5000))
    with pytest.raises(InputError, match="fill the disk"):
        open_nemo_container(small, tmp_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["bomb.nemo", "small.nemo"]


def test_huge_extended_header_is_refused(tmp_path):
    p = str(tmp_path / "pax.nemo")
    size = 2 << 20
    with open(p, "wb") as f:
        f.write(ta._header(b"././@PaxHeader", size, b"x", 0o644, 0))
        f.write(b"9" * size + b"\0" * 1024)
    with pytest.raises(InputError, match="extended header"):
        open_nemo_container(p)


def test_not_an_archive_truncated_and_missing(tmp_path, payload):
    junk = tmp_path / "junk.nemo"
    junk.write_bytes(b"hello, this is not a tar" * 100)
    with pytest.raises(InputError, match=r"junk.nemo: not a .nemo archive \("):
        open_nemo_container(str(junk))
    empty = tmp_path / "empty.nemo"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="not a .nemo archive"):
        open_nemo_container(str(empty))
    gz_junk = tmp_path / "gz.nemo"
    gz_junk.write_bytes(gzip.compress(b"not a tar" * 200))
    with pytest.raises(InputError, match="not a .nemo archive"):
        open_nemo_container(str(gz_junk), tmp_dir=str(tmp_path))
    with pytest.raises(InputError, match="no such file"):
        open_nemo_container(str(tmp_path / "missing.nemo"))
    full = str(tmp_path / "full.nemo")
    _write_sample(full, payload)
    data = open(full, "rb").read()
    for cut in (len(data) // 2, 512 * 3, ta.BLOCK * 2 + 512):
        cutp = tmp_path / f"cut{cut}.nemo"
        cutp.write_bytes(data[:cut])
        with pytest.raises(InputError, match="truncated|corrupt"):
            open_nemo_container(str(cutp))


def test_directory_container(tmp_path):
    root = tmp_path / "unpacked"
    (root / "model_weights").mkdir(parents=True)
    (root / "model_config.yaml").write_bytes(b"cfg")
    (root / "model_weights" / "common.pt").write_bytes(b"common")
    (root / "alias.yaml").symlink_to("model_config.yaml")
    (root / "wlink").symlink_to("model_weights")
    with open_nemo_container(str(root)) as c:
        assert isinstance(c, DirectoryContainer)
        assert c.names() == ["alias.yaml", "model_config.yaml", "model_weights/common.pt",
                             "wlink/common.pt"]
        assert c.read_bytes("alias.yaml") == b"cfg"
        r = c.region("model_weights/common.pt")
        assert (r.offset, r.length) == (0, 6)
        assert c.is_dir("model_weights") and c.exists("model_config.yaml")
        assert find_member(c, "model_config.yaml") == "model_config.yaml"
        with pytest.raises(InputError, match="2 members"):
            find_member(c, "common.pt")  # reached directly and through the link
    outside = tmp_path / "secret"
    outside.write_bytes(b"s")
    (root / "escape").symlink_to(outside)
    with pytest.raises(InputError, match="escape.*outside"):
        open_nemo_container(str(root))
    os.unlink(root / "escape")
    (root / "model_weights" / "loop").symlink_to("..")
    with pytest.raises(InputError, match="loop"):
        open_nemo_container(str(root))


def test_find_member(tmp_path):
    p = str(tmp_path / "a.nemo")
    with TarWriter(p) as w:
        w.add_bytes("model_config.yaml", b"")
        w.add_bytes("sub/model_config.yaml", b"")
        w.add_bytes("x_model_weights.ckpt", b"")
        w.add_bytes("mp_rank_00/model_weights.ckpt", b"")
    with open_nemo_container(p) as arc:
        assert find_member(arc, "model_weights.ckpt") == "mp_rank_00/model_weights.ckpt"
        with pytest.raises(InputError, match="2 members"):
            find_member(arc, "model_config.yaml")
        with pytest.raises(InputError, match="no member named 'tokenizer.model'"):
            find_member(arc, "tokenizer.model")


def test_lookup_accepts_dot_slash_names(tmp_path):
    p = str(tmp_path / "a.nemo")
    with TarWriter(p) as w:
        w.add_bytes("model_weights/common.pt", b"c")
    with open_nemo_container(p) as arc:
        assert arc.read_bytes("./model_weights/common.pt") == b"c"
        assert arc.is_dir("./model_weights/") and arc.exists("./model_weights/common.pt")
        with pytest.raises(MemberNotFoundError, match="a folder, not a file"):
            arc.region("model_weights")
