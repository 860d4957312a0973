"""Output files start writeback of completed chunks early; the bytes never change."""

from __future__ import annotations

import os
import sys

import pytest

from nemo_convert.formats.io import output_file
from nemo_convert.formats.io.output_file import OutputFile
from nemo_convert.formats.io.tar_writer import TarWriter


def test_bytes_are_what_was_written_including_patches(tmp_path):
    path = str(tmp_path / "out.bin")
    data = os.urandom(300_000)
    with OutputFile(path, chunk=64 << 10) as f:
        for i in range(0, len(data), 7_001):
            f.write(data[i:i + 7_001])
        f.seek(10)
        f.write(b"PATCH")  # a header patched in place, as the tar writer does
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
    want = data[:10] + b"PATCH" + data[15:] + b"tail"
    with open(path, "rb") as g:
        assert g.read() == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux-only")
def test_writeback_is_requested_chunk_by_chunk_on_linux(tmp_path):
    assert output_file._SYNC_FILE_RANGE is not None
    with OutputFile(str(tmp_path / "out.bin"), chunk=64 << 10) as f:
        f.write(b"x" * (100 << 10))
        assert f.writeback_requested == 64 << 10
        f.write(b"x" * (100 << 10))
        assert f.writeback_requested == 192 << 10  # 200 KiB written: three whole chunks
        f.seek(0)
        f.write(b"y")  # moving back never re-requests or shrinks
        assert f.writeback_requested == 192 << 10


def test_a_failing_request_turns_writeback_off_and_changes_nothing(tmp_path, monkeypatch):
    calls = []

    def refuse(fd, offset, nbytes, flags):
        calls.append((offset, nbytes, flags))
        return -1

    monkeypatch.setattr(output_file, "_SYNC_FILE_RANGE", refuse)
    path = str(tmp_path / "out.bin")
    with OutputFile(path, chunk=4096) as f:
        for _ in range(10):
            f.write(b"z" * 5000)
        assert f.writeback_requested == 0
    assert calls == [(0, 4096, 2)]  # tried once, then off
    assert os.path.getsize(path) == 50_000


def test_tar_writer_output_is_unchanged(tmp_path, monkeypatch):
    """The same archive with and without writeback requests."""
    def archive(name: str) -> bytes:
        with TarWriter(str(tmp_path / name)) as tw:
            tw.add_bytes("a/config.yaml", b"k: v\n")
            with tw.open_member("a/weights.bin") as m:
                for i in range(40):
                    m.write(bytes([i]) * 10_000)
        return (tmp_path / name).read_bytes()

    monkeypatch.setattr(output_file, "WRITEBACK_CHUNK", 4096)
    with_wb = archive("one.tar")
    monkeypatch.setattr(output_file, "_SYNC_FILE_RANGE", None)
    assert archive("two.tar") == with_wb
