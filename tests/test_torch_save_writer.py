"""The streaming ``torch.save`` writer's shortcuts (small writes collected, small records
built once per process and copied) write the bytes the plain path writes, which torch loads."""

from __future__ import annotations

import io

import pytest
import torch

from nemo_convert.formats.torch_zip import torch_save
from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter

TENSORS = [torch.arange(16, dtype=torch.float32), torch.randn(3, 4).to(torch.bfloat16), torch.zeros(0),
           torch.randn(70_000), torch.tensor(2.5)]


def _single(t: torch.Tensor, lead: bytes = b"") -> bytes:
    buf = io.BytesIO()
    buf.write(lead)
    TorchSaveWriter(buf).save_tensor(t)
    return buf.getvalue()[len(lead):]


def _dict(tensors: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    w = TorchSaveWriter(buf)
    for k, t in tensors.items():
        w.add(k, t)
    w.close()
    return buf.getvalue()


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_save, "_CACHED_RECORD", -1)
    monkeypatch.setattr(torch_save, "_SMALL", -1)
    monkeypatch.setattr(torch_save, "_single_pickle", torch_save._pickle)
    monkeypatch.setattr(torch_save, "_TEMPLATE_MAX", -1)


def test_shortcuts_write_the_plain_bytes(monkeypatch):
    many = {f"layer.{i}.w": torch.randn(4, 4) for i in range(300)}  # a data.pkl larger than the cached records
    got = [_single(t) for t in TENSORS] + [_single(t) for t in TENSORS] + [_dict(many), _single(TENSORS[1], b"x" * 77)]
    _plain(monkeypatch)
    want = [_single(t) for t in TENSORS] * 2 + [_dict(many), _single(TENSORS[1], b"x" * 77)]
    assert got == want
    for t, data in zip(TENSORS, got):
        back = torch.load(io.BytesIO(data), weights_only=True)
        assert back.dtype == t.dtype and torch.equal(back.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    loaded = torch.load(io.BytesIO(got[-2]), weights_only=True)
    assert list(loaded) == list(many) and all(torch.equal(loaded[k], many[k]) for k in many)


def test_archives_one_after_another_in_one_stream_each_load():
    """A dist checkpoint's data file is a run of one-tensor archives (offsets relative to
    each): every one reads back, whether its records came from the cache or not."""
    buf = io.BytesIO()
    spans = []
    for t in TENSORS * 2:
        start = buf.tell()
        TorchSaveWriter(buf).save_tensor(t, flush=False)
        spans.append((start, buf.tell()))
    data = buf.getvalue()
    for t, (a, b) in zip(TENSORS * 2, spans):
        back = torch.load(io.BytesIO(data[a:b]), weights_only=True)
        assert torch.equal(back.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


def test_template_archives_of_mapped_tensors_and_pieces_write_the_plain_bytes(tmp_path, monkeypatch):
    """The one-tensor template (dist checkpoint chunks) fills in the CRC and the bytes of
    tensors mapped from an input file (copied file to file by ``copy_range``) and of
    :class:`Pieces` exactly as the plain path writes them; a larger tensor takes the plain path."""
    from nemo_convert.formats.io.output_file import open_output
    from nemo_convert.tensors.file_map import FileMap
    from nemo_convert.tensors.pieces import Pieces

    src = tmp_path / "src.bin"
    src.write_bytes(torch.randn(1024).numpy().tobytes())
    fmap = FileMap(str(src))
    mapped = [fmap.tensor(0, (16, 8), torch.float32), fmap.tensor(512, (64,), torch.float32)]
    pieces = Pieces([mapped[0], torch.arange(6, dtype=torch.float32), mapped[1]], (2, 99), torch.float32)
    cases = mapped + [pieces, torch.randn(5, 3).to(torch.bfloat16), torch.randn(5, 3).to(torch.bfloat16),
             torch.randn(256)]
    monkeypatch.setattr(torch_save, "_TEMPLATE_MAX", 600)  # the 1 KiB one below goes the plain way

    def archives(name: str) -> bytes:
        path = str(tmp_path / name)
        with open_output(path) as out:
            for t in cases:
                TorchSaveWriter(out).save_tensor(t, flush=False)
        with open(path, "rb") as f:
            return f.read()

    got = archives("template.bin")
    _plain(monkeypatch)
    assert got == archives("plain.bin")
    fmap.close()
