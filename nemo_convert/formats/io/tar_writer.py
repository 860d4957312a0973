"""Streaming writer of plain POSIX tar archives (the ``.nemo`` container).

Members are written straight into the output file and each header is patched once the
member's size is known, so no member is buffered or copied twice.
"""

from __future__ import annotations

import io
import os
import shutil
from contextlib import contextmanager
from typing import BinaryIO, Iterator

from nemo_convert.formats.io.output_file import open_output


BLOCK = 512
RECORD = 20 * BLOCK  # tarfile and GNU tar pad archives to whole records
_OCTAL_SIZE_LIMIT = 8**11  # the 11-digit octal size field holds up to 8 GiB - 1
_COPY_CHUNK = 16 << 20
_MAX_META_HEADER = 1 << 20  # PAX / GNU long-name header blocks larger than this are refused
_GZIP_MAX_RATIO = 1100  # deflate cannot expand data by more than ~1032x
_DISK_FRACTION = 0.9  # gzip extraction may use at most this share of the free space


def tar_size_field(size: int) -> bytes:
    """The 12-byte size field for ``size``: octal below 8 GiB, GNU base-256 above."""
    if size < 0:
        raise ValueError("negative member size")
    if size < _OCTAL_SIZE_LIMIT:
        return b"%011o\0" % size
    if size >= 256**11:
        raise ValueError(f"member of {size} bytes is too large for a tar header")
    return b"\x80" + size.to_bytes(11, "big")


def _header(name: bytes, size: int, typeflag: bytes, mode: int, mtime: int) -> bytes:
    """One ustar header block (uid/gid 0, empty user and group names)."""
    h = bytearray(BLOCK)
    h[0 : len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = h[116:124] = b"%07o\0" % 0
    h[124:136] = tar_size_field(size)
    h[136:148] = b"%011o\0" % max(0, min(mtime, _OCTAL_SIZE_LIMIT - 1))
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    h[329:337] = h[337:345] = b"%07o\0" % 0
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _pax_record(key: str, value: str) -> bytes:
    """A PAX extended-header record ``"<len> key=value\\n"`` (the length counts itself)."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


def _split(name: str) -> list[str]:
    """The components of a ``/``-separated relative name; ``ValueError`` if unsafe."""
    if name.startswith("/"):
        raise ValueError(f"absolute member name {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"bad member name {name!r}")
    return parts


class _MemberStream(io.RawIOBase):
    """The write-only stream of one member being written; positions count from its start."""

    def __init__(self, f: BinaryIO, start: int) -> None:
        super().__init__()
        self._f, self._start = f, start
        self._pos = self.size = 0
        self._synced = True  # the file position equals start + _pos

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def,override]
        self._checkClosed()
        view = memoryview(b).cast("B")
        if not self._synced:
            self._f.seek(self._start + self._pos)
            self._synced = True
        self._f.write(view)
        self._pos += view.nbytes
        self.size = max(self.size, self._pos)
        return view.nbytes

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._checkClosed()
        new = {0: pos, 1: self._pos + pos, 2: self.size + pos}[whence]
        if new < 0:
            raise ValueError("negative seek position")
        self._pos, self._synced = new, False
        return new

    def flush(self) -> None:
        if not self.closed and not self._f.closed:  # a no-op once the archive was aborted
            self._f.flush()

    def copy_range(self, fileno: int, offset: int, size: int) -> bool:
        """Append ``size`` bytes of the open file ``fileno`` from byte ``offset`` in the
        kernel (:meth:`OutputFile.copy_range <nemo_convert.formats.io.output_file.OutputFile.copy_range>`).
        False, with nothing written, where that is not available."""
        self._checkClosed()
        copy = getattr(self._f, "copy_range", None)
        if copy is None:
            return False
        if not self._synced:
            self._f.seek(self._start + self._pos)
            self._synced = True
        if not copy(fileno, offset, size):
            return False
        self._pos += size
        self.size = max(self.size, self._pos)
        return True

    def copy_from(self, src: BinaryIO, size: int) -> bool:
        """Append the first ``size`` bytes of the file ``src`` in the kernel (no pass
        through user memory). False, with nothing written, where that is not available."""
        return self.copy_range(src.fileno(), 0, size)


class TarWriter:
    """Writes a deterministic, uncompressed POSIX tar laid out like a NeMo ``.nemo``.

    Implements :class:`~nemo_convert.formats.io.sink.MemberSink`. Members get the name
    ``./<name>``; the root ``./`` and every parent folder get a directory entry before
    their first member. Headers carry uid/gid 0, no user names, mode 0o644 (files) or
    0o755 (folders) and ``mtime``. Names longer than 100 bytes or not ASCII get a PAX
    ``path`` record; members of 8 GiB or more get a base-256 size field. If writing a
    member fails, the writer is unusable and :meth:`close` leaves the file unterminated
    (the caller's staging discards it).
    """

    def __init__(self, path: str, *, mtime: int = 0) -> None:
        self.path = path
        self._mtime = int(mtime)
        self._f: BinaryIO = open_output(path)
        self._pos = 0
        self._files: set[str] = set()
        self._dirs: set[str] = set()
        self._open: str | None = None
        self._failed = False
        self._write_entry("./", 0, b"5", 0o755)

    # -- low level -------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self._pos += len(data)

    def _pad(self, size: int) -> None:
        self._write(b"\0" * (-size % BLOCK))

    def _write_entry(self, full: str, size: int, typeflag: bytes, mode: int) -> tuple[int, bytes]:
        """Write the (PAX +) ustar header of ``full``; return its offset and name field."""
        encoded = full.encode("utf-8")
        if len(encoded) > 100 or not full.isascii():
            pax = _pax_record("path", full)
            self._write(_header(b"././@PaxHeader", len(pax), b"x", 0o644, self._mtime))
            self._write(pax)
            self._pad(len(pax))
        offset, field = self._pos, encoded[:100]
        self._write(_header(field, size, typeflag, mode, self._mtime))
        return offset, field

    def _check_ready(self) -> None:
        if self._f.closed or self._failed:
            raise RuntimeError(f"{self.path}: tar writer is closed or failed")
        if self._open is not None:
            raise RuntimeError(f"{self.path}: member {self._open!r} is still open")

    def _claim(self, name: str, is_dir: bool) -> str:
        """Validate ``name``, write missing parent folders, reserve it; return it normalised."""
        self._check_ready()
        parts = _split(name)
        rel = "/".join(parts)
        if rel in self._files or (rel in self._dirs and not is_dir):
            raise ValueError(f"{self.path}: member {rel!r} written twice")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self._files:
                raise ValueError(f"{self.path}: {parent!r} is a file, cannot hold {rel!r}")
            if parent not in self._dirs:
                self._dirs.add(parent)
                self._write_entry(f"./{parent}/", 0, b"5", 0o755)
        return rel

    # -- MemberSink --------------------------------------------------------------------
    def add_dir(self, name: str) -> None:
        """Add a directory entry (a no-op if the folder was already written)."""
        rel = self._claim(name, is_dir=True)
        if rel not in self._dirs:
            self._dirs.add(rel)
            self._write_entry(f"./{rel}/", 0, b"5", 0o755)

    def add_bytes(self, name: str, data: bytes | bytearray) -> None:
        """Write a whole member from memory."""
        rel = self._claim(name, is_dir=False)
        self._files.add(rel)
        view = memoryview(data).cast("B")
        self._write_entry(f"./{rel}", view.nbytes, b"0", 0o644)
        self._f.write(view)
        self._pos += view.nbytes
        self._pad(view.nbytes)

    def add_file(self, name: str, path: str) -> None:
        """Copy the file at ``path`` in as member ``name``: in the kernel where possible,
        else in chunks."""
        with open(path, "rb") as src, self.open_member(name) as dst:
            if not dst.copy_from(src, os.fstat(src.fileno()).st_size):  # type: ignore[attr-defined]
                shutil.copyfileobj(src, dst, _COPY_CHUNK)

    @contextmanager
    def open_member(self, name: str) -> Iterator[BinaryIO]:
        """A stream writing member ``name`` straight into the tar; ``tell()`` counts from
        the member's start and ``seek`` works within it. On exit the header is patched
        with the final size and the data padded to a whole block."""
        rel = self._claim(name, is_dir=False)
        self._files.add(rel)
        offset, field = self._write_entry(f"./{rel}", 0, b"0", 0o644)
        stream = _MemberStream(self._f, self._pos)
        self._open = rel
        try:
            yield stream  # type: ignore[misc]
        except BaseException:
            self._failed = True
            raise
        finally:
            stream.close()
            self._open = None
        end = offset + BLOCK + stream.size
        self._f.seek(offset)
        self._f.write(_header(field, stream.size, b"0", 0o644, self._mtime))
        self._f.seek(end)
        self._pos = end
        self._pad(stream.size)

    # -- end ---------------------------------------------------------------------------
    def close(self) -> None:
        """Write the end-of-archive blocks, pad to a whole record, flush, fsync, close."""
        if self._f.closed:
            return
        if self._open is not None:
            raise RuntimeError(f"{self.path}: member {self._open!r} is still open")
        try:
            if not self._failed:
                self._write(b"\0" * (2 * BLOCK))
                self._pad_record()
                self._f.flush()
                os.fsync(self._f.fileno())
        finally:
            self._f.close()

    def _pad_record(self) -> None:
        self._write(b"\0" * (-self._pos % RECORD))

    def abort(self) -> None:
        """Close the file without terminating the archive."""
        self._failed = True
        self._open = None
        self._f.close()

    def __enter__(self) -> "TarWriter":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
