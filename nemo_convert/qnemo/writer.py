"""Streaming ``rank{i}.safetensors`` writers over any member stream (a file or a tar member).

The header comes from the plan (every name, shape and dtype is known before writing);
tensor bytes follow one by one in that order. Nothing is buffered beyond one tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

import torch

from nemo_convert.errors import NemoConvertError
from nemo_convert.formats.io.output_file import write_tensor
from nemo_convert.formats.hf.safetensors_writer import build_header
from nemo_convert.tensors.base import TensorInfo

METADATA = {"format": "pt"}


class RankStream:
    """Writes one safetensors file into ``f``; tensors must arrive in header order."""

    def __init__(self, f: BinaryIO, infos: Sequence[TensorInfo], name: str) -> None:
        self._f, self._infos, self._name, self._next = f, list(infos), name, 0
        f.write(build_header(self._infos, METADATA))

    def write(self, name: str, t: torch.Tensor) -> int:
        if self._next >= len(self._infos):
            raise NemoConvertError(f"internal error: {self._name}: {name} is one tensor too many")
        want = self._infos[self._next]
        if name != want.name or tuple(t.shape) != want.shape or t.dtype != want.dtype:
            raise NemoConvertError(f"internal error: {self._name} expected {want.name} {list(want.shape)} "
                                   f"{want.dtype}, got {name} {list(t.shape)} {t.dtype}")
        write_tensor(self._f, t)
        self._next += 1
        return want.nbytes

    def check_done(self) -> None:
        if self._next != len(self._infos):
            raise NemoConvertError(f"internal error: {self._name}: wrote {self._next} of "
                                   f"{len(self._infos)} tensors")
