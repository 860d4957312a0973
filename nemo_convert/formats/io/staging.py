"""Atomic outputs: write beside the target under a hidden name, then rename into place.

:func:`staged_output` guarantees that the target path is only ever absent, the old
complete output, or the new complete output: never a partial file or folder.

* An exception (``KeyboardInterrupt`` and ``SystemExit`` included) removes the staging
  entry. :func:`install_signal_handlers` turns ``SIGTERM`` into :class:`Terminated`, a
  ``KeyboardInterrupt``, so the same cleanup runs when a job is terminated.
* ``SIGKILL`` (or a power cut) cannot be caught: it leaves a hidden staging entry named
  ``.<name>.nemo-convert-partial-<pid>-<random>`` beside the target, never a partial
  target. :func:`cleanup_stale_staging` removes such leftovers once their process is gone.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator

from nemo_convert.errors import OutputExistsError

_PARTIAL = "partial"
_OLD = "old"
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM)
_STAGING_RE = re.compile(r"^\..+\.nemo-convert-(partial|old)-(\d+)-[0-9a-f]+$")


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


def _install(staging: str, target: str, shown: str, *, overwrite: bool) -> None:
    """Move the finished ``staging`` entry to ``target`` (see :func:`staged_output`)."""
    if not os.path.lexists(target):
        err = _renameat2(staging, target, _RENAME_NOREPLACE)  # no race with a new target
        if err == 0:
            return
        if err in _UNSUPPORTED and not os.path.lexists(target):
            os.rename(staging, target)
            return
        if err not in _UNSUPPORTED and err != errno.EEXIST:
            raise OSError(err, os.strerror(err), target)
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
def staged_output(target: str, *, overwrite: bool, is_dir: bool) -> Iterator[str]:
    """Yield a hidden staging path beside ``target``; install it there on success.

    Raises :class:`OutputExistsError` before anything is written when ``target`` exists
    and ``overwrite`` is false. The parent folder is created if missing (and the folders
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
    shown, target = target, os.path.abspath(target)
    if os.path.lexists(target) and not overwrite:
        raise OutputExistsError(f"{shown} exists; pass --overwrite to replace it")
    parent = os.path.dirname(target)
    created = _missing_ancestors(parent)
    try:
        os.makedirs(parent, exist_ok=True)
    except BaseException:
        _remove_created(created)
        raise
    try:  # leftovers of killed runs (hours old, their process gone)
        cleanup_stale_staging(parent)
    except OSError:
        pass
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
        _install(staging, target, shown, overwrite=overwrite)
        _fsync_path(parent, directory=True)
    except BaseException as exc:
        _remove(staging)
        _remove_created(created)
        _name_the_target(exc, staging, shown)
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


def cleanup_stale_staging(folder: str, *, max_age_s: float = 3600.0) -> list[str]:
    """Remove staging leftovers (``.<name>.nemo-convert-partial-…`` and ``…-old-…``) in
    ``folder`` that were last modified more than ``max_age_s`` seconds ago and whose
    process is no longer running on this machine. Returns the removed paths.

    The pid test only means something on the machine that wrote the entry; the age
    threshold is what protects a run on another host sharing the folder.
    """
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    for entry in entries:
        m = _STAGING_RE.match(entry.name)
        if not m:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if age >= max_age_s and not _pid_alive(int(m.group(2))):
            _remove(entry.path)
            removed.append(entry.path)
    return removed


def check_target(target: str, *, overwrite: bool) -> None:
    """Fail early (before any work) when ``target`` exists and ``overwrite`` is false."""
    if os.path.lexists(target) and not overwrite:
        raise OutputExistsError(f"{target} exists; pass --overwrite to replace it")


def refuse_overlap(src: str, target: str) -> None:
    """Refuse an output that is the input, lies inside it, or contains it: overwriting it
    would destroy the input."""
    a, b = os.path.realpath(src), os.path.realpath(target)
    if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
        raise OutputExistsError(f"{target}: the output would overwrite or sit inside the input {src}; "
                                "choose another output path")
