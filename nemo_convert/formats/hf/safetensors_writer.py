"""Streaming safetensors writer: the header is written from the plan, then tensor bytes
follow one by one as the engine produces them. Nothing is buffered beyond one tensor."""

from __future__ import annotations

import json
import os
import struct
from typing import BinaryIO, Sequence


from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.io.output_file import open_output, tensor_bytes, write_tensor  # noqa: F401  (tensor_bytes re-exported)
from nemo_convert.tensors.pieces import Lazy
from nemo_convert.tensors.base import NAME_TO_SAFETENSORS, TensorInfo


def build_header(infos: Sequence[TensorInfo], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors header (length prefix included) for tensors written in this order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for info in infos:
        header[info.name] = {"dtype": NAME_TO_SAFETENSORS[info.dtype_name], "shape": list(info.shape),
                             "data_offsets": [offset, offset + info.nbytes]}
        offset += info.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


class SafetensorsStreamWriter:
    """Writes one safetensors file whose tensors arrive in the declared order."""

    def __init__(self, path: str, infos: Sequence[TensorInfo], metadata: dict[str, str] | None = None) -> None:
        self.path = path
        self._infos = list(infos)
        self._next = 0
        self._f: BinaryIO = open_output(path)
        self._f.write(build_header(self._infos, metadata))

    @property
    def done(self) -> bool:
        return self._next == len(self._infos)

    def write(self, name: str, t: Lazy) -> None:
        want = self._infos[self._next]
        if name != want.name or tuple(t.shape) != want.shape or t.dtype != want.dtype:
            raise NemoConvertError(f"internal error: {self.path} expected {want.name} {list(want.shape)} "
                                   f"{want.dtype}, got {name} {list(t.shape)} {t.dtype}")
        write_tensor(self._f, t)
        self._next += 1
        if self.done:
            self.close()

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
