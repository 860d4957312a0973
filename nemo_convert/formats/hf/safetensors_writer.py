"""Streaming safetensors writer: the header is written from the plan, then tensor bytes
follow one by one as the engine produces them. Nothing is buffered beyond one tensor."""

from __future__ import annotations

import json
import os
import struct
from json.encoder import encode_basestring_ascii
from typing import BinaryIO, Sequence


from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.io.output_file import open_output, tensor_bytes, write_tensor  # noqa: F401  (tensor_bytes re-exported)
from nemo_convert.tensors.pieces import Lazy
from nemo_convert.tensors.base import NAME_TO_SAFETENSORS, TensorInfo


def build_header(infos: Sequence[TensorInfo], metadata: dict[str, str] | None = None) -> bytes | bytearray:
    """The safetensors header (length prefix included) for tensors written in this order:
    ``json.dumps`` of ``{"__metadata__": metadata, name: {"dtype", "shape", "data_offsets"},
    …}`` with ``separators=(",", ":")``, padded with spaces to a multiple of 8 bytes.

    Written entry by entry into one buffer rather than through that dict: the dict (three
    containers per tensor) and the JSON text beside it were the export's peak, ~0.8 KiB per
    tensor of a one-shard model (docs/performance.md, "Memory, third round"). Names are
    escaped by the encoder ``json.dumps`` uses (ASCII only); names that repeat (a dict
    would keep one entry) take the dict's way."""
    names = [info.name for info in infos]
    if metadata:
        names.append("__metadata__")
    if len(set(names)) != len(names) or not all(type(d) is int for info in infos for d in info.shape):
        return _header_by_dict(infos, metadata)
    del names
    out = bytearray(8)
    out += b"{"
    if metadata:
        out += b'"__metadata__":' + json.dumps(metadata, separators=(",", ":")).encode("utf-8")
    quote = encode_basestring_ascii
    offset = 0
    for info in infos:
        if len(out) > 9:
            out += b","
        end = offset + info.nbytes
        out += (f'{quote(info.name)}:{{"dtype":"{NAME_TO_SAFETENSORS[info.dtype_name]}","shape":'
                f'[{",".join([str(d) for d in info.shape])}],"data_offsets":[{offset},{end}]}}').encode("ascii")
        offset = end
    out += b"}"
    out += b" " * (-(len(out) - 8) % 8)  # align the data section to 8 bytes
    out[:8] = struct.pack("<Q", len(out) - 8)
    return out


def _header_by_dict(infos: Sequence[TensorInfo], metadata: dict[str, str] | None) -> bytes:
    """:func:`build_header` through the dict (names that repeat)."""
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
