"""Atomic outputs: write beside the target under a hidden name, then rename into place.

:func:`staged_output` guarantees that the target path is only ever absent, the old
complete output, or the new complete output: never a partial file or folder.

* An exception (``KeyboardInterrupt`` and ``SystemExit`` included) removes the staging
  entry. :func:`install_signal_handlers` turns ``SIGTERM`` into :class:`Terminated`, a
  ``KeyboardInterrupt``, so the same cleanup runs when a job is terminated.
* ``SIGKILL`` (or a power cut) cannot be caught: it leaves a hidden staging entry named
  ``.<name>.nemo-convert-partial-<pid>-<random>`` beside the target, never a partial
  target. Nothing removes it behind the user's back: the next run writing into that folder
  warns about it (:func:`warn_about_partials`), and ``nemo-convert clean FOLDER``
  (:func:`find_partials`, :func:`remove_partials`) removes such leftovers once their process
  is gone.
* ``--overwrite`` replaces only an output of the kind being written, or an empty folder
  (:mod:`~nemo_convert.formats.io.replace`), checked before any work (:func:`check_target`)
  and again just before the install.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Iterator

from nemo_convert.errors import OutputExistsError
from nemo_convert.formats.io.replace import check_not_empty, check_output_path, check_replaceable

_PARTIAL = "partial"
_OLD = "old"
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM)
#: Our staging entries: ``.<name>.nemo-convert-partial-<pid>-<hex>`` (and ``-old-``, an old
#: output renamed aside; ``.parts``, the parts folder of a several-process tar).
_STAGING_RE = re.compile(r"^\..+\.nemo-convert-(partial|old)-(\d+)-[0-9a-f]+(\.parts)?$")


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives ``SIGTERM`` (or ``SIGHUP``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def _hidden_name(target: str, kind: str) -> str:
    folder, base = os.path.split(target)
    return os.path.join(folder, f".{base}.nemo-convert-{kind}-{os.getpid()}-{os.urandom(4).hex()}")


def _fsync_path(path: str, *, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError:
        if not directory:  # some filesystems cannot fsync folders; files must succeed
            raise
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    """fsync every file below ``path``, then every folder bottom-up, then ``path`` itself."""
    for folder, dirs, files in os.walk(path, topdown=False):
        for name in files:
            full = os.path.join(folder, name)
            if not os.path.islink(full):
                _fsync_path(full, directory=False)
        _fsync_path(folder, directory=True)


def _remove(path: str) -> None:
    """Delete a file or folder tree if it exists; never follows a symlink."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _discard(path: str) -> None:
    """:func:`_remove` for the cleanup after a failure: best effort, it never raises. On a
    read-only file system even unlinking a name that was never created fails (``EROFS``);
    that must not replace the error that made the run fail."""
    try:
        _remove(path)
    except OSError:
        pass


_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _renameat2(src: str, dst: str, flags: int) -> int:
    """Linux ``renameat2``; 0 on success, else the errno (``ENOSYS`` if unavailable)."""
    import ctypes  # here: every command imports this module, few rename a folder

    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return errno.ENOSYS
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


def _install(staging: str, target: str, shown: str, *, overwrite: bool, kind: str) -> None:
    """Move the finished ``staging`` entry to ``target`` (see :func:`staged_output`); an
    existing target is checked again (:func:`~nemo_convert.formats.io.replace.check_replaceable`):
    something may have appeared there while the output was written."""
    if not os.path.lexists(target):
        err = _renameat2(staging, target, _RENAME_NOREPLACE)  # no race with a new target
        if err == 0:
            return
        if err in _UNSUPPORTED and not os.path.lexists(target):
            os.rename(staging, target)
            return
        if err not in _UNSUPPORTED and err != errno.EEXIST:
            raise OSError(err, os.strerror(err), target)
    check_replaceable(target, kind, shown=shown)
    if not overwrite:
        raise OutputExistsError(f"{shown} exists; pass --overwrite to replace it")
    staged_is_dir = os.path.isdir(staging)
    target_is_dir = os.path.isdir(target) and not os.path.islink(target)
    if not staged_is_dir and not target_is_dir:
        os.replace(staging, target)  # atomic: the old file is replaced in one step
        return
    if _renameat2(staging, target, _RENAME_EXCHANGE) == 0:  # atomic swap
        _remove(staging)  # which now holds the old output
        return
    aside = _hidden_name(target, _OLD)
    os.rename(target, aside)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(aside, target)
        raise
    _remove(aside)


def _missing_ancestors(folder: str) -> list[str]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    out: list[str] = []
    while folder and not os.path.lexists(folder):
        out.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return out


def _remove_created(folders: list[str]) -> None:
    """Remove the folders we created for an output that was not installed (deepest first),
    each only while it is still empty: never anything someone else put there."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def _shown_path(path: Any, staging: str, shown: str) -> Any:
    """``path`` with the hidden staging entry replaced by the output the user named."""
    if isinstance(path, str) and (path == staging or path.startswith(staging + os.sep)):
        return shown + path[len(staging):]
    return path


def _name_the_target(exc: BaseException, staging: str, shown: str) -> None:
    """Errors name the output the user asked for, never our hidden staging path."""
    if isinstance(exc, OSError):
        exc.filename = _shown_path(exc.filename, staging, shown)
        exc.filename2 = _shown_path(exc.filename2, staging, shown)
    elif exc.args and isinstance(exc.args[0], str) and staging in exc.args[0]:
        exc.args = (exc.args[0].replace(staging, shown),) + exc.args[1:]


@contextmanager
def staged_output(target: str | os.PathLike[str], *, overwrite: bool, is_dir: bool, kind: str) -> Iterator[str]:
    """Yield a hidden staging path beside ``target``; install it there on success.

    ``kind`` is the kind of output written (:data:`~nemo_convert.formats.io.replace.OutputKind`).
    :func:`check_target` runs first: before anything is written, an existing ``target`` is
    refused when ``overwrite`` is false or when it is not an output of ``kind`` (or an
    empty folder); so is an empty path, or one ending in ``/`` for a file. The parent
    folder is created if missing (and the folders
    created for it are removed again when the output is not installed). For ``is_dir``
    the staging folder is created empty; otherwise the caller creates the staging file.

    On normal exit the staged file (or every file and folder of the staged tree) is
    fsynced and renamed onto ``target``. When overwriting, a file replacing a file uses
    one atomic ``rename``; folders are swapped atomically with ``renameat2`` where the
    kernel and filesystem allow it, else the old output is renamed aside, the new one
    renamed in and the old one deleted. Finally the parent folder is fsynced. On any
    exception the staging entry is removed and the exception propagates, with the
    staging path in an ``OSError``'s file names (or the message) replaced by ``target``.
    """
    shown = os.fspath(target)
    check_target(shown, overwrite=overwrite, kind=kind, is_dir=is_dir, warn=False)
    target = os.path.abspath(shown)
    parent = os.path.dirname(target)
    created = _missing_ancestors(parent)
    try:
        os.makedirs(parent, exist_ok=True)
    except BaseException:
        _remove_created(created)
        raise
    staging = _hidden_name(target, _PARTIAL)
    try:
        if is_dir:
            os.mkdir(staging)
        yield staging
        if is_dir != os.path.isdir(staging) or not os.path.exists(staging):
            kind = "folder" if is_dir else "file"
            raise RuntimeError(f"{staging}: the staged output is not a {kind}")
        if is_dir:
            _fsync_tree(staging)
        else:
            _fsync_path(staging, directory=False)
        _install(staging, target, shown, overwrite=overwrite, kind=kind)
        _fsync_path(parent, directory=True)
    except BaseException as exc:
        _name_the_target(exc, staging, shown)
        _discard(staging)
        _remove_created(created)
        raise


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def install_signal_handlers(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> dict[int, Any]:
    """Make ``signals`` raise :class:`Terminated` so staging cleanup runs; return the old
    handlers (for ``signal.signal`` to restore). Must be called from the main thread.
    A signal that is ignored (e.g. ``SIGHUP`` under ``nohup``) stays ignored.

    ``SIGKILL`` cannot be handled: a killed run leaves only a hidden staging entry,
    which :func:`cleanup_stale_staging` removes later.
    """
    return {s: signal.signal(s, _on_signal) for s in signals
            if signal.getsignal(s) is not signal.SIG_IGN}


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


@dataclass(frozen=True)
class Partial:
    """A staging entry of ours in a folder: left by a killed run when its process is gone."""

    path: str
    pid: int
    nbytes: int
    alive: bool
    age_s: float


def _tree_bytes(path: str) -> int:
    """Bytes of the file ``path``, or of every file below the folder ``path`` (no links followed)."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return os.lstat(path).st_size
        total = 0
        for folder, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
        return total
    except OSError:
        return 0


def find_partials(folder: str | os.PathLike[str]) -> list[Partial]:
    """Our staging entries in ``folder`` (names matching ``.<name>.nemo-convert-partial-<pid>-<hex>``,
    ``…-old-…`` and their ``.parts``), sorted by name; an absent folder has none.

    ``alive`` says whether a process with that id runs on *this* machine: an entry written
    from another host sharing the folder looks dead here (see :func:`remove_partials`).
    """
    folder = os.fspath(folder)
    found: list[Partial] = []
    now = time.time()
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        m = _STAGING_RE.match(entry.name)
        if not m:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        pid = int(m.group(2))
        found.append(Partial(entry.path, pid, _tree_bytes(entry.path), _pid_alive(pid), age))
    return found


def remove_partials(partials: list[Partial], *, max_age_s: float = 0.0) -> list[Partial]:
    """Delete the entries of ``partials`` whose process is gone (checked again now) and
    that were last modified at least ``max_age_s`` seconds ago; returns those deleted.
    Never anything else: each name is checked again against our staging pattern.

    The process test only means something on the machine that wrote the entry; an age
    threshold is what protects a run on another host sharing the folder."""
    removed: list[Partial] = []
    for p in partials:
        if p.alive or p.age_s < max_age_s or not _STAGING_RE.match(os.path.basename(p.path)) \
                or _pid_alive(p.pid):
            continue
        _remove(p.path)
        removed.append(p)
    return removed


def cleanup_stale_staging(folder: str | os.PathLike[str], *, max_age_s: float = 3600.0) -> list[str]:
    """Remove staging leftovers (``.<name>.nemo-convert-partial-…`` and ``…-old-…``) in
    ``folder`` that were last modified more than ``max_age_s`` seconds ago and whose
    process is no longer running on this machine (:func:`remove_partials`). Returns the
    removed paths. Nothing calls it on its own: ``nemo-convert clean`` is the command."""
    return [p.path for p in remove_partials(find_partials(folder), max_age_s=max_age_s)]


class PartialsWarning(UserWarning):
    """A folder an output is written into holds partial outputs of killed runs."""


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def warn_about_partials(folder: str) -> list[Partial]:
    """Warn (one line, a :class:`PartialsWarning`) when ``folder`` holds partial outputs of
    runs whose process is gone, naming them, their size and ``nemo-convert clean``;
    returns them."""
    dead = [p for p in find_partials(folder or ".") if not p.alive]
    if dead:
        shown = ", ".join(f"{os.path.basename(p.path)} ({human_size(p.nbytes)})" for p in dead[:3])
        more = f" and {len(dead) - 3} more" if len(dead) > 3 else ""
        where = folder or "."
        warnings.warn(f"{where} holds {len(dead)} partial output(s) of killed runs "
                      f"({human_size(sum(p.nbytes for p in dead))}): {shown}{more}; remove them with "
                      f"`nemo-convert clean {where}`", PartialsWarning, stacklevel=3)
    return dead


def check_target(target: str | os.PathLike[str], *, overwrite: bool, kind: str, is_dir: bool,
                 warn: bool = True) -> None:
    """Fail early (before any work) when ``target`` cannot be written: an empty path, a
    path ending in ``/`` for a file output (:func:`~nemo_convert.formats.io.replace.check_output_path`),
    an existing target that ``--overwrite`` would not replace
    (:func:`~nemo_convert.formats.io.replace.check_replaceable`: not an output of ``kind``,
    nor an empty folder), or any existing target when ``overwrite`` is false. With
    ``warn``, also warn about partial outputs of killed runs in its folder
    (:func:`warn_about_partials`)."""
    target = os.fspath(target)
    check_output_path(target, kind, is_dir=is_dir)
    if os.path.lexists(target):
        check_replaceable(target, kind, shown=target)
        if not overwrite:
            raise OutputExistsError(f"{target} exists; pass --overwrite to replace it")
    if warn:
        warn_about_partials(os.path.dirname(target.rstrip("/" + os.sep)))


def refuse_overlap(src: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Refuse an output that is the input, lies inside it, or contains it: overwriting it
    would destroy the input. An empty ``target`` is refused first (it is no output)."""
    check_not_empty(os.fspath(target))
    a, b = os.path.realpath(src), os.path.realpath(target)
    if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
        raise OutputExistsError(f"{target}: the output would overwrite or sit inside the input {src}; "
                                "choose another output path")
