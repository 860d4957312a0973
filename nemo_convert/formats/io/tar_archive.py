"""``.nemo`` containers: a streaming tar writer and in-place readers.

A ``.nemo`` file is a plain, uncompressed POSIX tar whose members are named
``./model_config.yaml``, ``./model_weights/.metadata``, … (what ``tarfile`` mode ``"w:"``
writes for ``tar.add(folder, arcname=".")``). :class:`TarWriter` writes that layout
member by member straight into the output file, patching each header once the member's
size is known, so no member is ever buffered or copied twice.

:func:`open_nemo_container` reads a ``.nemo`` tar in place (members are byte ranges of the
tar, ready for ``mmap``), an old gzipped ``.nemo`` (extracted, safely, into a temporary
folder), or an unpacked folder, all behind the :class:`Container` interface.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
import weakref
import zlib
from typing import Any, cast

from nemo_convert.errors import InputError
from nemo_convert.tensors.base import ByteRegion, RegionReader

from nemo_convert.formats.io.tar_writer import _COPY_CHUNK, BLOCK, TarWriter, tar_size_field  # noqa: F401  (re-exported)

RECORD = 20 * BLOCK  # tarfile and GNU tar pad archives to whole records
_MAX_META_HEADER = 1 << 20  # PAX / GNU long-name header blocks larger than this are refused
_GZIP_MAX_RATIO = 1100  # deflate cannot expand data by more than ~1032x
_DISK_FRACTION = 0.9  # gzip extraction may use at most this share of the free space

# ======================================================================================
# Reading
# ======================================================================================


def _norm(name: str) -> str:
    """``name`` without empty and ``.`` components (``./a//b/`` -> ``a/b``)."""
    return "/".join(p for p in name.split("/") if p not in ("", "."))


class MemberNotFoundError(InputError, KeyError):
    """A container has no member of the requested name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Container:
    """A read-only view of a ``.nemo``: a tar read in place, a gzipped tar, or a folder.

    Member names are ``/``-separated and relative, with any leading ``./`` removed.
    :meth:`names` lists regular files only; :meth:`is_dir` answers for folders (explicit
    entries or implied by a member's path).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._files: dict[str, ByteRegion] = {}
        self._dirs: set[str] = set()
        self._explicit_dirs: set[str] = set()

    def _refuse(self, raw: str, why: str) -> InputError:
        return InputError(f"{self.path}: refusing member {raw!r} ({why})")

    def _add_parents(self, name: str, raw: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self._files:
                raise self._refuse(raw, f"{parent!r} is a file")
            self._dirs.add(parent)

    def _add_file(self, name: str, region: ByteRegion, raw: str) -> None:
        if name in self._files or name in self._dirs:
            raise self._refuse(raw, "duplicate name")
        self._add_parents(name, raw)
        self._files[name] = region

    def _add_dir(self, name: str, raw: str) -> None:
        if name in self._files or name in self._explicit_dirs:
            raise self._refuse(raw, "duplicate name")
        self._add_parents(name, raw)
        self._dirs.add(name)
        self._explicit_dirs.add(name)

    def names(self) -> list[str]:
        """Every regular-file member, in archive (or sorted walk) order."""
        return list(self._files)

    def exists(self, name: str) -> bool:
        """Whether ``name`` is a file or a folder of the container."""
        name = _norm(name)
        return name in self._files or name in self._dirs

    def is_dir(self, name: str) -> bool:
        """Whether ``name`` is a folder (an explicit entry or a member's parent)."""
        return _norm(name) in self._dirs

    def region(self, name: str) -> ByteRegion:
        """The bytes of member ``name`` (``./`` prefixes are ignored): a range of the tar,
        or a whole file. Raises :class:`MemberNotFoundError`."""
        try:
            return self._files[_norm(name)]
        except KeyError:
            what = "a folder, not a file" if name in self._dirs else "no such member"
            raise MemberNotFoundError(f"{self.path}: {name!r}: {what}") from None

    def read_bytes(self, name: str) -> bytes:
        """The whole content of member ``name``."""
        return self.region(name).read()

    def open(self, name: str) -> RegionReader:
        """A seekable, read-only file object over member ``name``."""
        return RegionReader(self.region(name))

    def close(self) -> None:
        """Release resources (a gzipped archive's temporary folder)."""

    def __enter__(self) -> "Container":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _GuardedTarInfo(tarfile.TarInfo):
    """Refuses PAX / GNU long-name blocks large enough to exhaust memory when parsed."""

    def _proc_member(self, tf):  # type: ignore[no-untyped-def]
        meta = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
        if self.type in meta and self.size > _MAX_META_HEADER:
            raise tarfile.HeaderError(f"extended header of {self.size} bytes")
        return super()._proc_member(tf)


class TarArchive(Container):
    """A ``.nemo`` tar opened in place; a gzipped one is extracted to a temporary folder.

    Absolute names, ``..`` components, links, device files, sparse members and duplicate
    names are refused with :class:`InputError`. Gzip extraction also refuses members whose
    declared size could not come from the compressed file, and stops before using more
    than 90 % of the free space of ``tmp_dir`` (default: the system temp folder).
    """

    def __init__(self, path: str, *, tmp_dir: str | None = None) -> None:
        super().__init__(path)
        self.extracted_dir: str | None = None
        self._finalizer: weakref.finalize | None = None
        try:
            tf = tarfile.open(path, "r:", tarinfo=_GuardedTarInfo)
        except tarfile.ReadError as e:
            self._open_gzip(tmp_dir, e)
            return
        except tarfile.TarError as e:
            raise InputError(f"{path}: corrupt tar archive ({e})") from None
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
        with tf:
            self._scan_plain(tf)

    def _member_name(self, ti: tarfile.TarInfo) -> str | None:
        """The normalised name of ``ti``, ``None`` for the root; refuses unsafe members."""
        raw = ti.name
        if raw.startswith("/"):
            raise self._refuse(raw, "absolute path")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self._refuse(raw, "'..' in path")
        kind = ("symlink" if ti.issym() else "hardlink" if ti.islnk() else
                "device or fifo" if ti.isdev() else "sparse file" if ti.issparse() else
                None if ti.isfile() or ti.isdir() else f"member type {ti.type!r}")
        if kind:
            raise self._refuse(raw, kind)
        if not parts and not ti.isdir():
            raise self._refuse(raw, "empty file name")
        return "/".join(parts) or None

    def _scan_plain(self, tf: tarfile.TarFile) -> None:
        size = os.fstat(cast(Any, tf.fileobj).fileno()).st_size  # a real file: opened from a path
        try:
            for ti in tf:
                name = self._member_name(ti)
                if name is None:
                    continue
                if ti.isdir():
                    self._add_dir(name, ti.name)
                    continue
                if ti.offset_data + ti.size > size:
                    raise InputError(f"{self.path}: tar archive is truncated (in {ti.name!r})")
                self._add_file(name, ByteRegion(self.path, ti.offset_data, ti.size), ti.name)
        except tarfile.TarError as e:
            raise InputError(f"{self.path}: corrupt tar archive ({e})") from None
        with open(self.path, "rb") as f:
            f.seek(tf.offset)
            trailer = f.read(BLOCK)
        if len(trailer) < BLOCK or trailer.count(0) != BLOCK:
            raise InputError(f"{self.path}: tar archive is truncated or corrupt at byte {tf.offset}")

    def _open_gzip(self, tmp_dir: str | None, plain_error: Exception) -> None:
        with open(self.path, "rb") as f:
            magic = f.read(2)
        if magic != b"\x1f\x8b":
            raise InputError(f"{self.path}: not a .nemo archive (neither a tar nor a gzipped "
                             f"tar: {plain_error})")
        self.extracted_dir = tempfile.mkdtemp(prefix="nemo-convert-gz-", dir=tmp_dir)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.extracted_dir, True)
        try:
            self._extract_gzip()
        except (tarfile.TarError, zlib.error, EOFError) as e:
            self.close()
            raise InputError(f"{self.path}: corrupt gzipped tar archive ({e})") from None
        except OSError as e:  # e.g. a member name too long for the file system
            self.close()
            raise InputError(f"{self.path}: cannot extract the gzipped archive ({e.strerror or e})") from None
        except BaseException:
            self.close()
            raise

    def _extract_gzip(self) -> None:
        assert self.extracted_dir is not None
        root = os.path.realpath(self.extracted_dir)
        absurd = os.path.getsize(self.path) * _GZIP_MAX_RATIO + (1 << 20)
        budget = int(shutil.disk_usage(root).free * _DISK_FRACTION)
        try:
            tf = tarfile.open(self.path, "r|gz", tarinfo=_GuardedTarInfo)
        except tarfile.ReadError as e:
            raise InputError(f"{self.path}: not a .nemo archive (gzip data is not a tar: {e})") from None
        with tf:
            for ti in tf:
                name = self._member_name(ti)
                if name is None:
                    continue
                dest = os.path.join(root, *name.split("/"))
                if os.path.commonpath([root, os.path.realpath(os.path.dirname(dest))]) != root:
                    raise self._refuse(ti.name, "leaves the extraction folder")
                if ti.isdir():
                    self._add_dir(name, ti.name)
                    os.makedirs(dest, exist_ok=True)
                    continue
                if ti.size > absurd:
                    raise self._refuse(ti.name, f"declares {ti.size} bytes, impossible for the "
                                       "compressed size")
                budget -= ti.size
                if budget < 0:
                    raise InputError(f"{self.path}: extracting it would nearly fill the disk "
                                     f"of {root}")
                self._add_file(name, ByteRegion(dest, 0, ti.size), ti.name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                self._copy_out(tf, ti, dest)

    def _copy_out(self, tf: tarfile.TarFile, ti: tarfile.TarInfo, dest: str) -> None:
        src = tf.extractfile(ti)
        assert src is not None
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            left = ti.size
            while left:
                chunk = src.read(min(_COPY_CHUNK, left))
                if not chunk:
                    raise InputError(f"{self.path}: gzipped tar is truncated (in {ti.name!r})")
                out.write(chunk)
                left -= len(chunk)

    def close(self) -> None:
        """Delete the extraction folder of a gzipped archive (nothing for a plain tar)."""
        if self._finalizer is not None:
            self._finalizer()


class DirectoryContainer(Container):
    """An unpacked ``.nemo`` folder. Symlinks are followed only if they stay inside it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        root = os.path.realpath(path)
        stack: list[tuple[str, str, tuple[str, ...]]] = [("", root, (root,))]
        while stack:
            rel, real, ancestors = stack.pop()
            entries = sorted(os.scandir(real), key=lambda e: e.name)
            for entry in entries:
                name, target = rel + entry.name, os.path.join(real, entry.name)
                if entry.is_symlink():
                    target = os.path.realpath(target)
                    if os.path.commonpath([root, target]) != root:
                        raise self._refuse(name, "symlink pointing outside the folder")
                    if target in ancestors:
                        raise self._refuse(name, "symlink loop")
                try:
                    st = os.stat(target)
                except OSError:
                    raise self._refuse(name, "dangling symlink") from None
                if stat.S_ISDIR(st.st_mode):
                    self._add_dir(name, name)
                    stack.append((name + "/", target, ancestors + (target,)))
                elif stat.S_ISREG(st.st_mode):
                    self._add_file(name, ByteRegion(target, 0, st.st_size), name)
                else:
                    raise self._refuse(name, "not a regular file or folder")
        self._files = dict(sorted(self._files.items()))


def open_nemo_container(path: str, *, tmp_dir: str | None = None) -> Container:
    """Open a ``.nemo`` tar (in place), a gzipped ``.nemo`` or an unpacked folder."""
    if os.path.isdir(path):
        return DirectoryContainer(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    return TarArchive(path, tmp_dir=tmp_dir)


def find_member(container: Container, suffix: str) -> str:
    """The single member whose name is ``suffix`` or ends in ``/<suffix>``.

    What precedes ``suffix`` in the result is the archive's member prefix (like NeMo's
    ``detect_prefix``). Raises :class:`InputError` when there is none or more than one.
    """
    suffix = suffix.strip("/")
    found = [n for n in container.names() if n == suffix or n.endswith("/" + suffix)]
    if len(found) != 1:
        what = "no member" if not found else f"{len(found)} members ({', '.join(found[:5])})"
        raise InputError(f"{container.path}: {what} named {suffix!r}; expected exactly one")
    return found[0]
