"""Where writers put files: a folder, or the members of a tar archive being written.

Format writers (the dist checkpoint, ``model_config.yaml``, tokenizer artifacts, per-rank
``model_weights.ckpt``) write through a :class:`MemberSink`, so the same code produces
an unpacked folder or streams straight into a ``.nemo`` tar with no second copy on disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from contextlib import contextmanager
from typing import BinaryIO, Iterator, Protocol

from nemo_convert.formats.io.output_file import open_output


class MemberSink(Protocol):
    """Accepts named files (``/``-separated relative names), one open member at a time."""

    def add_bytes(self, name: str, data: bytes | bytearray) -> None:
        """Write a whole member from memory."""
        ...

    def add_file(self, name: str, path: str) -> None:
        """Copy the file at ``path`` in as member ``name``."""
        ...

    def open_member(self, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A write-only binary stream for member ``name``; ``tell()`` counts from the
        member's start. The member is complete when the context exits."""
        ...


class DirectorySink:
    """Writes members as files under a folder (the unpacked ``.nemo`` form, HF folders)."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def _path(self, name: str) -> str:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts or any(p == ".." for p in parts):
            raise ValueError(f"bad member name {name!r}")
        path = os.path.join(self.root, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def add_bytes(self, name: str, data: bytes | bytearray) -> None:
        with open(self._path(name), "wb") as f:
            f.write(data)

    def add_file(self, name: str, path: str) -> None:
        shutil.copyfile(path, self._path(name))

    @contextmanager
    def open_member(self, name: str) -> Iterator[BinaryIO]:
        with open_output(self._path(name)) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
