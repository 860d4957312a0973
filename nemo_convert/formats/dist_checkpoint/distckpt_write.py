"""A streaming writer of Megatron-Core ``torch_dist`` checkpoints.

Tensors arrive chunk by chunk (typically one layer of a stacked ``[L, …]`` tensor at a
time) and each chunk is ``torch.save``-d straight into one open data member of a
:class:`~nemo_convert.formats.io.sink.MemberSink`, exactly as torch's ``FileSystemWriter``
serialises a tensor item; nothing stacked is ever built. Small Python objects
(``_extra_state`` ``[None]`` lists) are buffered and appended to the same data member at
:meth:`DistCheckpointWriter.close`, which then writes ``.metadata``, ``common.pt`` and,
last, ``metadata.json``.

For several processes, each rank writes its own ``__<rank>_0.distcp`` with
``close(finalize=False)``, sends :meth:`DistCheckpointWriter.records` to rank 0, and rank 0
calls :func:`write_dist_metadata` with all of them.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import torch

from nemo_convert.errors import NemoConvertError, ShapeError
from nemo_convert.formats.dist_checkpoint.distckpt import (
    COMMON_PT,
    DCP_METADATA,
    METADATA_JSON,
    TORCH_DIST_CONFIG,
    ChunkRecord,
    DistRecords,
    ObjectRecord,
    DCP_VERSION,
    metadata_entries,
    format_box,
    merge_records,
)
from nemo_convert.formats.dist_checkpoint.dcp_pickle import write_metadata
from nemo_convert.formats.io.sink import MemberSink
from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter

if TYPE_CHECKING:
    from typing_extensions import Self

_EXTRA_STATE_VALUE: list[None] = [None]
#: Bytes of BYTE_IO objects gathered before they are written (:meth:`DistCheckpointWriter.close`).
_OBJECTS_BATCH = 1 << 20


def _member(folder: str, name: str) -> str:
    folder = folder.strip("/")
    return f"{folder}/{name}" if folder else name


class _CountingStream:
    """A write-only stream that counts the bytes passing through it.

    Positions are counted here rather than asked of the sink's stream, so a sink whose
    stream cannot ``tell()`` (or counts differently) still gives correct offsets.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.pos = 0  # the end of what was written
        self._here = 0  # the current position (differs while a header is patched)
        try:
            self._can_seek = bool(raw.seekable())
        except (AttributeError, OSError):
            self._can_seek = False

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self._raw.write(data)
        self._here += n
        self.pos = max(self.pos, self._here)
        return n

    def tell(self) -> int:
        return self._here

    def copy_range(self, fileno: int, offset: int, size: int) -> bool:
        """Append bytes of an input file in the kernel, where the stream below can."""
        copy = getattr(self._raw, "copy_range", None)
        if copy is None or not copy(fileno, offset, size):
            return False
        self._here += size
        self.pos = max(self.pos, self._here)
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0 or not self._can_seek:
            raise OSError("only absolute seeks within the data member are supported")
        self._raw.seek(pos)
        self._here = pos
        return pos

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._can_seek


def _save_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


_NONE_LIST_BYTES: list[bytes] = []


def _object_bytes(obj: object) -> bytes:
    """``torch.save(obj)``; for ``[None]`` (every Transformer-Engine ``_extra_state``: one
    per linear module, layer and expert) saved once per process and reused — ``torch.save``
    writes the same bytes for the same object (its ``serialization_id`` is a hash of them)."""
    if type(obj) is list and len(obj) == 1 and obj[0] is None:
        if not _NONE_LIST_BYTES:
            _NONE_LIST_BYTES.append(_save_bytes([None]))
        return _NONE_LIST_BYTES[0]
    return _save_bytes(obj)


class DistCheckpointWriter:
    """Writes one ``torch_dist`` checkpoint (or one rank's part of it) into a sink.

    Usage::

        w = DistCheckpointWriter(sink, "model_weights")
        w.declare("model.decoder.layers.mlp.linear_fc2.weight", (L, H, F), torch.bfloat16)
        for l in range(L):
            w.write_chunk("model.decoder.layers.mlp.linear_fc2.weight", (l, 0, 0), t[None])
            w.add_extra_state("model.decoder.layers.mlp.linear_fc2._extra_state", l, L)
        w.close()

    Only one sink member is open at a time: the data member stays open from the first
    chunk until :meth:`close`, so other members must be written before or after.
    Used as a context manager, the writer closes on success and abandons the data
    member (passing the exception to the sink) on error.
    """

    def __init__(self, sink: MemberSink, folder: str = "model_weights", *,
                 data_file: str = "__0_0.distcp", align: int = 64) -> None:
        if "/" in data_file or data_file in ("", ".", ".."):
            raise ValueError(f"bad data file name {data_file!r}")
        self._sink = sink
        self._folder = folder
        self._data_file = data_file
        self._align = max(1, align)
        self._tensors: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        # The records share the declared key strings and the chunk shapes (a stacked key
        # has a chunk per layer and expert, all of one shape): not one copy per chunk.
        self._one: dict[Any, Any] = {}
        self._chunks: list[ChunkRecord] = []
        self._objects: dict[str, bytes] = {}
        self._object_records: list[ObjectRecord] = []
        self._ctx: contextlib.AbstractContextManager[BinaryIO] | None = None
        self._stream: _CountingStream | None = None
        self._done = False

    # ------------------------------------------------------------------ declaring

    def declare(self, key: str, global_shape: Sequence[int], dtype: torch.dtype) -> None:
        """Announce tensor ``key`` with its global (unsharded) shape and dtype."""
        self._check_open()
        shape = tuple(int(s) for s in global_shape)
        if any(s < 0 for s in shape):
            raise ShapeError(f"{key}: negative size in {list(shape)}")
        if key in self._objects:
            raise ShapeError(f"{key} is already an object item")
        key = self._one.setdefault(key, key)
        prev = self._tensors.setdefault(key, (shape, dtype))
        if prev != (shape, dtype):
            raise ShapeError(f"{key}: declared as {list(prev[0])} {prev[1]}, now as {list(shape)} {dtype}")

    # ------------------------------------------------------------------ writing

    def write_chunk(self, key: str, offsets: Sequence[int], tensor: torch.Tensor) -> None:
        """Stream one chunk of ``key`` at ``offsets`` (one per dimension) into the data file."""
        self._check_open()
        if key not in self._tensors:
            raise ShapeError(f"{key}: write_chunk before declare")
        shape, dtype = self._tensors[key]
        key = self._one[key]
        offs = tuple(int(o) for o in offsets)
        sizes = tuple(tensor.shape)
        sizes = self._one.setdefault(sizes, sizes)
        if tensor.dtype != dtype:
            raise ShapeError(f"{key}: chunk dtype {tensor.dtype} differs from the declared {dtype}")
        if len(offs) != len(shape) or len(sizes) != len(shape):
            raise ShapeError(f"{key}: chunk offsets {list(offs)} / shape {list(sizes)} do not match "
                             f"the {len(shape)}-d global shape {list(shape)}")
        if any(o < 0 or o + s > g for o, s, g in zip(offs, sizes, shape)):
            raise ShapeError(f"{key}: chunk {format_box(offs, sizes)} lies outside the global shape {list(shape)}")
        stream = self._data_stream()
        self._pad(stream)
        start = stream.pos
        TorchSaveWriter(cast(BinaryIO, stream)).save_tensor(tensor, flush=False)  # what torch.save writes
        self._chunks.append(ChunkRecord(key, offs, sizes, self._data_file, start, stream.pos - start))

    def add_extra_state(self, key: str, layer: int | None, num_layers: int | None, *,
                        value: object = _EXTRA_STATE_VALUE) -> str:
        """Add a Transformer-Engine style ``_extra_state`` object; returns its item key.

        The item is ``<key>/shard_<layer>_<num_layers>`` for a stacked layer and
        ``<key>/shard_0_1`` otherwise; its value defaults to ``[None]`` (what Megatron-Core
        expects for the local and unquantised TE layers).
        """
        if layer is None:
            suffix = "shard_0_1"
        else:
            if num_layers is None or not 0 <= layer < num_layers:
                raise ShapeError(f"{key}: layer {layer} outside 0..{num_layers}")
            suffix = f"shard_{layer}_{num_layers}"
        item = f"{key}/{suffix}"
        self.add_object(item, value)
        return item

    def add_object(self, key: str, obj: object) -> None:
        """Add a BYTE_IO item holding ``torch.save(obj)``."""
        self.add_object_bytes(key, _object_bytes(obj))

    def add_object_bytes(self, key: str, data: bytes) -> None:
        """Add a BYTE_IO item with these exact bytes (e.g. copied from another checkpoint)."""
        self._check_open()
        if key in self._objects or key in self._tensors:
            raise ShapeError(f"{key} was added twice")
        self._objects[key] = bytes(data)

    # ------------------------------------------------------------------ finishing

    def records(self) -> DistRecords:
        """What this writer wrote (complete once :meth:`close` has run)."""
        return DistRecords(tensors=dict(self._tensors), chunks=list(self._chunks),
                           objects=list(self._object_records))

    def close(self, *, finalize: bool = True) -> DistRecords:
        """Finish the data member; with ``finalize``, also write the checkpoint metadata.

        Checks that every declared tensor is tiled exactly by its chunks and raises
        :class:`~nemo_convert.errors.ShapeError` listing the gaps otherwise. Pass
        ``finalize=False`` on every rank but the one that calls :func:`write_dist_metadata`.
        """
        if self._done:
            return self.records()
        records = DistRecords(tensors=dict(self._tensors), chunks=list(self._chunks))
        if finalize:  # fail before writing anything more
            metadata_entries(records, ShapeError)
        if self._objects or self._ctx is not None:
            stream = self._data_stream()
            # The objects (one per Transformer-Engine module, layer and expert: tens of
            # thousands) are gathered with their padding (:meth:`_pad`'s) and written a
            # megabyte at a time, not two writes each through the stream's layers.
            pending, at = bytearray(), stream.pos
            for key, data in self._objects.items():
                rem = at % self._align
                if rem:
                    pending += b"\0" * (self._align - rem)
                    at += self._align - rem
                pending += data
                self._object_records.append(ObjectRecord(key, self._data_file, at, len(data)))
                at += len(data)
                if len(pending) >= _OBJECTS_BATCH:
                    stream.write(pending)
                    pending = bytearray()
            if pending:
                stream.write(pending)
            assert stream.pos == at
            self._objects.clear()
            ctx, self._ctx, self._stream = self._ctx, None, None
            assert ctx is not None
            ctx.__exit__(None, None, None)
        self._done = True
        if finalize:
            write_dist_metadata(self._sink, self._folder, [self.records()])
        return self.records()

    def abort(self, exc: BaseException | None = None) -> None:
        """Abandon the checkpoint: close the data member, handing ``exc`` to the sink."""
        self._done = True
        ctx, self._ctx, self._stream = self._ctx, None, None
        if ctx is not None:
            if exc is None:
                exc = NemoConvertError("dist checkpoint writing was aborted")
            with contextlib.suppress(BaseException):
                ctx.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(exc)

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._done:
            raise ValueError("the dist checkpoint writer is closed")

    def _data_stream(self) -> _CountingStream:
        if self._stream is None:
            ctx = self._sink.open_member(_member(self._folder, self._data_file))
            raw = ctx.__enter__()
            self._ctx = ctx
            self._stream = _CountingStream(raw)
        return self._stream

    def _pad(self, stream: _CountingStream) -> None:
        # Readers locate items by (offset, length) only, so zero padding between items
        # is invisible to them; aligned items let our reader memory-map tensor bytes.
        rem = stream.pos % self._align
        if rem:
            stream.write(b"\0" * (self._align - rem))


def write_dist_metadata(sink: MemberSink, folder: str, records_list: Sequence[DistRecords], *,
                        config: dict[str, Any] | None = None, common: object = None) -> None:
    """Write ``.metadata`` (merging every rank's records), ``common.pt`` (``torch.save`` of
    ``common``, default ``{}``), then ``metadata.json``.

    Raises :class:`~nemo_convert.errors.ShapeError` if the ranks disagree about a tensor,
    or if the merged chunks do not tile a tensor exactly (listing the gaps and overlaps).
    """
    merged = merge_records(records_list, ShapeError)
    tensors, objects = metadata_entries(merged, ShapeError)
    with sink.open_member(_member(folder, DCP_METADATA)) as f:  # streamed: not whole in memory
        write_metadata(f.write, tensors, objects, DCP_VERSION)
    sink.add_bytes(_member(folder, COMMON_PT), _save_bytes({} if common is None else common))
    sink.add_bytes(_member(folder, METADATA_JSON), json.dumps(config or TORCH_DIST_CONFIG).encode())
