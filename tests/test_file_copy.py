"""Tensors that are ranges of an input file are copied file to file; the bytes and every
zip CRC come out exactly as when written from memory."""

from __future__ import annotations

import io
import os
import tarfile
import time
import zipfile
import zlib

import pytest
import torch
from safetensors.torch import save_file

from nemo_convert import api
from nemo_convert.formats.io import output_file
from nemo_convert.formats.io.output_file import OutputFile, tensor_chunks, write_tensor
from nemo_convert.formats.io.tar_writer import TarWriter
from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter
from nemo_convert.tensors.base import ByteRegion
from nemo_convert.tensors.file_map import file_origin
from nemo_convert.tensors.pieces import materialize, rows
from nemo_convert.tensors.safetensors_source import SafetensorsFile
from nemo_convert.tensors.torch_zip_source import TorchZipSource

GEOM = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64)


@pytest.fixture
def mapped(tmp_path):
    path = str(tmp_path / "w.safetensors")
    save_file({"a": torch.arange(64, dtype=torch.float32).reshape(8, 8),
               "b": torch.arange(100, 164, dtype=torch.float32).reshape(8, 8)}, path)
    src = SafetensorsFile(path)
    yield src, path
    src.close()


def test_file_origin_names_the_bytes_of_views_on_an_input(mapped):
    src, path = mapped
    a = src.load("a")
    got = file_origin(a)
    assert got is not None and got.path == path and got.length == 256
    with open(path, "rb") as f:
        f.seek(got.offset)
        assert f.read(256) == a.numpy().tobytes()
    rows_2_to_5 = file_origin(a.narrow(0, 2, 3))
    assert rows_2_to_5 is not None and rows_2_to_5.offset == got.offset + 64 and rows_2_to_5.length == 96
    assert file_origin(a.t()) is None  # not contiguous
    assert file_origin(a * 1) is None  # computed
    assert file_origin(torch.zeros(3)) is None


def test_a_closed_source_is_never_a_copy_origin(tmp_path):
    path = str(tmp_path / "w.safetensors")
    save_file({"a": torch.ones(4, 4)}, path)
    src = SafetensorsFile(path)
    t = src.load("a")
    src.close()
    assert file_origin(t) is None  # the file is closed: the writer writes from memory


def test_copy_range_appends_in_the_kernel_and_requests_writeback(tmp_path, mapped):
    src, _ = mapped
    a = src.load("a")
    origin = file_origin(a)
    assert origin is not None
    out = str(tmp_path / "o.bin")
    with OutputFile(out, chunk=256) as f:
        f.write(b"head")
        assert f.copy_range(origin.fileno, origin.offset, origin.length)
        f.write(b"tail")
        if output_file._SYNC_FILE_RANGE is not None:
            assert f.writeback_requested == 256
    with open(out, "rb") as g:
        assert g.read() == b"head" + a.numpy().tobytes() + b"tail"


def test_without_copy_file_range_the_bytes_are_written_from_memory(tmp_path, mapped, monkeypatch):
    src, _ = mapped
    a, b = src.load("a"), src.load("b")

    def refuse(*args):  # e.g. across file systems on an old kernel
        raise OSError(18, "EXDEV")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    out = str(tmp_path / "o.bin")
    with OutputFile(out) as f:
        assert not f.copy_range(file_origin(a).fileno, 0, 16)  # type: ignore[union-attr]
        write_tensor(f, rows([b[4:], a, b[:4]]))
    with open(out, "rb") as g:
        assert g.read() == torch.cat([b[4:], a, b[:4]]).numpy().tobytes()


def count_copies(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """From now on, the sizes of the byte ranges copied file to file (0 for a refusal)."""
    copied: list[int] = []
    real = OutputFile.copy_range

    def counting(self, fileno, offset, size):  # type: ignore[no-untyped-def]
        ok = real(self, fileno, offset, size)
        copied.append(size if ok else 0)
        return ok

    monkeypatch.setattr(OutputFile, "copy_range", counting)
    return copied


def _torch_save_bytes(tensors: dict, tar: bool, tmp_path) -> bytes:
    """A torch.save zip of ``tensors`` written by our writer: into a tar member (a stream
    that copies file ranges) or into memory (one that cannot)."""
    if not tar:
        buf = io.BytesIO()
        w = TorchSaveWriter(buf)
        for k, t in tensors.items():
            w.add(k, t)
        w.close()
        return buf.getvalue()
    path = str(tmp_path / "t.tar")
    with TarWriter(path) as tw, tw.open_member("w.ckpt") as stream:
        w = TorchSaveWriter(stream)
        for k, t in tensors.items():
            w.add(k, t)
        w.close()
    with tarfile.open(path) as tf:
        return tf.extractfile("./w.ckpt").read()  # type: ignore[union-attr]


def test_torch_save_records_are_identical_however_their_bytes_travel(tmp_path, mapped):
    src, _ = mapped
    a, b = src.load("a"), src.load("b")
    tensors = {"whole": a, "pieces": rows([b[6:], torch.full((2, 8), 7.0), a[:3]]), "computed": a + b}
    copied = _torch_save_bytes(tensors, True, tmp_path)
    in_memory = _torch_save_bytes({k: materialize(v) for k, v in tensors.items()}, False, tmp_path)
    assert copied == in_memory
    assert zipfile.ZipFile(io.BytesIO(copied)).testzip() is None  # every CRC right
    back = torch.load(io.BytesIO(copied), weights_only=True)
    assert all(torch.equal(back[k], materialize(v)) for k, v in tensors.items())


def test_a_stored_record_crc_is_reused_not_recomputed(tmp_path):
    path = str(tmp_path / "m.pt")
    torch.save({"w": torch.arange(1024, dtype=torch.float32)}, path)
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    src = TorchZipSource(ByteRegion(path, 0, os.path.getsize(path)))
    try:
        t = src.load("w")
        (chunk,) = tensor_chunks(t)
        assert chunk.origin is not None and chunk.origin.crc32 == info.CRC
        assert info.CRC == zlib.crc32(t.numpy().tobytes())
        # a slice of the record is not the record: its CRC must be computed
        (part,) = tensor_chunks(t[:10])
        assert part.origin is not None and part.origin.crc32 is None
    finally:
        src.close()


def _zips_in(path: str) -> list[bytes]:
    """Every torch.save zip stored in a .nemo: model_weights.ckpt members, and each item
    of the dist data files (located by its first record's local header)."""
    out = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            data = tf.extractfile(m).read()  # type: ignore[union-attr]
            if m.name.endswith("model_weights.ckpt"):
                out.append(data)
            elif m.name.endswith(".distcp"):
                at = data.find(b"PK\x03\x04")
                while at >= 0:
                    end = data.index(b"PK\x05\x06", at) + 22
                    out.append(data[at:end])
                    at = data.find(b"PK\x03\x04", end)
    return out


@pytest.mark.parametrize("steps", [
    [("import", dict(layout="dist"))],
    [("import", dict(layout="legacy", parallel=api.Parallelism(2, 1)))],
    [("import", dict(layout="dist")), ("reshard", dict(tp=2, layout="legacy"))],
    [("import", dict(layout="legacy", parallel=api.Parallelism(2, 2))), ("reshard", dict(tp=1, layout="legacy"))],
    [("import", dict(layout="legacy", parallel=api.Parallelism(4, 1))), ("reshard", dict(tp=2, layout="dist"))],
])
def test_every_written_zip_record_has_the_right_crc(tmp_path, tiny_llama, steps):
    src = tiny_llama(**GEOM, dtype=torch.bfloat16)
    current = src
    for i, (op, kw) in enumerate(steps):
        out = str(tmp_path / f"{i}.nemo")
        (api.import_hf if op == "import" else api.reshard)(current, out, **kw)
        current = out
    zips = _zips_in(current)
    assert zips
    for data in zips:
        assert zipfile.ZipFile(io.BytesIO(data)).testzip() is None


def test_reshard_copies_most_bytes_file_to_file(tmp_path, tiny_llama, monkeypatch):
    """The fast path is taken: a dist → legacy TP2 reshard copies every byte in the kernel
    but the row-parallel slices (strided: gathered in memory) and the vocabulary padding."""
    src = tiny_llama(**GEOM, dtype=torch.bfloat16)
    a = str(tmp_path / "a.nemo")
    api.import_hf(src, a, layout="dist")
    copied = count_copies(monkeypatch)
    b = str(tmp_path / "b.nemo")
    api.reshard(a, b, tp=2, layout="legacy")
    written = 0
    with tarfile.open(b) as tf:
        for rank in ("mp_rank_00", "mp_rank_01"):
            sd = torch.load(io.BytesIO(tf.extractfile(f"./{rank}/model_weights.ckpt").read()),  # type: ignore[union-attr]
                            weights_only=True)
            written += sum(t.numel() * t.element_size() for t in sd.values())
    row_parallel = 2 * 2 * (32 * 32 + 32 * 64)  # bf16 bytes of linear_proj and linear_fc2, 2 layers
    padding = 2 * 8 * 32 * 2  # vocab 1000 padded to 1008 rows at TP2: zero rows of embedding and output layer
    assert sum(copied) == written - row_parallel - padding


def test_import_of_a_bf16_checkpoint_copies_every_byte_file_to_file(tmp_path, tiny_llama, monkeypatch):
    """Renames, and the QKV and gated fc1 fuses (pieces of the HF tensors), all go file to file."""
    src = tiny_llama(**GEOM, dtype=torch.bfloat16)
    copied = count_copies(monkeypatch)
    rep = api.import_hf(src, str(tmp_path / "a.nemo"), layout="dist")
    assert sum(copied) == rep.bytes
    # a cast builds new tensors: nothing can be copied
    copied.clear()
    api.import_hf(src, str(tmp_path / "b.nemo"), layout="dist", dtype="fp32")
    assert sum(copied) == 0


def test_a_corrupt_input_record_stays_detectably_corrupt(tmp_path, tiny_llama):
    """A whole record passed through keeps the input's stored CRC: flipped bits in the
    input are not re-checksummed into a valid-looking output."""
    src = tiny_llama(**GEOM, dtype=torch.bfloat16)
    good = str(tmp_path / "good.nemo")
    api.import_hf(src, good, layout="legacy")
    with tarfile.open(good) as tf:
        member = tf.getmember("./model_weights.ckpt")
        data = tf.extractfile(member).read()  # type: ignore[union-attr]
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)  # the largest tensor's record
    name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    at = member.offset_data + info.header_offset + 30 + name_len + extra_len + 100
    bad = str(tmp_path / "bad.nemo")
    blob = bytearray(open(good, "rb").read())
    blob[at] ^= 0x40
    with open(bad, "wb") as f:
        f.write(blob)
    out = str(tmp_path / "out.nemo")
    api.reshard(bad, out, tp=1, layout="dist")
    reports = [zipfile.ZipFile(io.BytesIO(z)).testzip() for z in _zips_in(out)]
    assert sum(r is not None for r in reports) == 1  # exactly the flipped tensor's record
    api.reshard(good, str(tmp_path / "ok.nemo"), tp=1, layout="dist")
    assert all(zipfile.ZipFile(io.BytesIO(z)).testzip() is None for z in _zips_in(str(tmp_path / "ok.nemo")))


@pytest.mark.skipif(output_file.crc32_combine is None, reason="deriving CRCs needs zlib-ng's crc32_combine")
def test_the_crc_of_a_record_tail_is_derived_from_its_head(tmp_path):
    """CRCs are linear: with the record's stored CRC and the head's computed one, the tail's
    follows without reading it — and only then."""
    from nemo_convert.tensors.file_map import FileMap

    path = str(tmp_path / "blob")
    data = os.urandom(10_000)
    with open(path, "wb") as f:
        f.write(data)
    fmap = FileMap(path)
    try:
        fmap.note_checksum(1000, 8000, zlib.crc32(data[1000:9000]))
        assert fmap.checksum_of(1000, 8000) == zlib.crc32(data[1000:9000])
        assert fmap.checksum_of(5000, 4000) is None  # the head [1000, 5000) is not known yet
        fmap.remember(1000, 2500, zlib.crc32(data[1000:3500]))
        assert fmap.checksum_of(5000, 4000) is None  # [3500, 5000) is still missing
        fmap.remember(3500, 1500, zlib.crc32(data[3500:5000]))
        assert fmap.checksum_of(5000, 4000) == zlib.crc32(data[5000:9000])
        assert fmap.checksum_of(5000, 3000) is None  # not a tail of the record
        assert fmap.checksum_of(4000, 5000) is None  # no known range ends at 4000
    finally:
        fmap.close()


def test_file_origin_finds_the_map_among_many_by_address(tmp_path):
    """:func:`file_origin` looks a tensor's map up by address (one search, not a question to
    every open map): among many open maps each tensor finds its own file and offset; a
    closed map, a map collected without ``close`` and a computed tensor have no origin."""
    import gc

    from nemo_convert.tensors import file_map
    from nemo_convert.tensors.file_map import FileMap

    maps = []
    for k in range(40):
        path = str(tmp_path / f"f{k}")
        with open(path, "wb") as f:
            f.write(bytes([k]) * (4096 + 8 * k))
        maps.append(FileMap(path))
    try:
        for k, fmap in enumerate(maps):
            t = fmap.tensor(8 * k, (16,), torch.uint8)
            o = file_origin(t)
            assert o is not None and (o.path, o.offset, o.length) == (fmap.path, 8 * k, 16), k
            assert o.source is fmap and bool((t == k).all())
        assert file_origin(torch.zeros(16, dtype=torch.uint8)) is None
        t = maps[3].tensor(0, (8,), torch.uint8)
        maps[3].close()
        assert file_origin(t) is None  # closed: its bytes are not copied from the file
        dropped = maps.pop(5)
        path, size = dropped.path, dropped.size
        del dropped
        gc.collect()  # collected without close: its entry is dead, found as nothing
        again = FileMap(path)  # may reuse the addresses
        maps.append(again)
        o = file_origin(again.tensor(0, (size,), torch.uint8))
        assert o is not None and o.source is again
        starts = [s for s, _, _ in file_map._BY_ADDRESS]
        assert starts == sorted(starts) == file_map._STARTS
        assert all(e <= s for (_, e, _), s in zip(file_map._BY_ADDRESS, starts[1:]))  # never overlapping
    finally:
        for fmap in maps:
            fmap.close()


def test_without_crc_combine_every_byte_is_checksummed(tmp_path, mapped, monkeypatch):
    """The plain-zlib path (no zlib-ng wheel): nothing derived or combined, same bytes."""
    from nemo_convert.tensors import file_map

    src, _ = mapped
    a, b = src.load("a"), src.load("b")
    tensors = {"whole": a, "pieces": rows([b[6:], torch.full((2, 8), 7.0), a[:3]])}
    want = _torch_save_bytes(tensors, True, tmp_path)
    monkeypatch.setattr(output_file, "crc32_combine", None)
    monkeypatch.setattr(file_map, "crc32_combine", None)
    assert _torch_save_bytes(tensors, True, tmp_path) == want


@pytest.mark.parametrize("layout,tp", [("dist", 1), ("legacy", 2)])
def test_export_copies_every_byte_file_to_file(tmp_path, tiny_llama, monkeypatch, layout, tp):
    """QKV split into q, k, v (pieces per query group), gated fc1 split, dim-0 TP-rank
    merges and the vocabulary trim: an uncast export writes from memory only the
    row-parallel merges (interleaved rows)."""
    from tiny_models import hf_tensors

    src = tiny_llama(**GEOM, dtype=torch.bfloat16)
    a = str(tmp_path / "a.nemo")
    api.import_hf(src, a, layout=layout, parallel=api.Parallelism(tp, 1))
    copied = count_copies(monkeypatch)
    out = str(tmp_path / "hf")
    rep = api.export_hf(a, out)
    row_parallel = 2 * 2 * (32 * 32 + 32 * 64) if tp > 1 else 0  # o_proj and down_proj, 2 layers, bf16
    assert sum(copied) == rep.bytes - row_parallel
    want, got = hf_tensors(src), hf_tensors(out)
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_records_too(tmp_path):
    """The checksum thread is per process: a child forked after the parent used it (the
    default multiprocessing start method on Linux) must not wait on the parent's thread."""
    big = {"w": torch.arange(3 << 20, dtype=torch.float32)}  # 12 MiB: checksummed on the thread
    _torch_save_bytes(big, True, tmp_path)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            (tmp_path / "child").mkdir()
            data = _torch_save_bytes(big, True, tmp_path / "child")
            os._exit(0 if zipfile.ZipFile(io.BytesIO(data)).testzip() is None else 3)
        except BaseException:
            os._exit(4)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung writing a record")
