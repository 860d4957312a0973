"""The streaming safetensors writer's header: written entry by entry, the bytes of
``json.dumps`` over the header dict (what it was built from before, and what the
safetensors format reads)."""

from __future__ import annotations

import json
import random
import struct

import pytest
import torch

from nemo_convert.formats.hf.safetensors_writer import build_header
from nemo_convert.tensors.base import NAME_TO_SAFETENSORS, TensorInfo


def reference(infos: list[TensorInfo], metadata: dict[str, str] | None) -> bytes:
    """The header as a dict through ``json.dumps`` (written independently of the module)."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for info in infos:
        header[info.name] = {"dtype": NAME_TO_SAFETENSORS[info.dtype_name], "shape": list(info.shape),
                             "data_offsets": [offset, offset + info.nbytes]}
        offset += info.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def random_infos(rng: random.Random, n: int) -> list[TensorInfo]:
    alphabet = "abc.XYZ_09\"\\/\t\n\u00e9\u4e2d\U0001f600 "
    dtypes = (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int64, torch.bool)
    names = {f"t{i}." + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for i in range(n)}
    return [TensorInfo(name, tuple(rng.randrange(0, 70000) for _ in range(rng.randrange(0, 4))), rng.choice(dtypes))
            for name in sorted(names)]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300])
@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}, {"a": "\u00e9\"x", "b": ""}])
def test_header_is_json_dumps_of_the_dict(n: int, metadata: dict[str, str] | None) -> None:
    infos = random_infos(random.Random(n), n)
    got = build_header(infos, metadata)
    assert bytes(got) == reference(infos, metadata)
    assert (len(got) - 8) % 8 == 0


def test_header_with_repeated_names_is_the_dicts() -> None:
    """A name given twice keeps the dict's one entry (its first place, its last value);
    ``__metadata__`` as a tensor name too."""
    infos = [TensorInfo("a", (2,), torch.float32), TensorInfo("b", (3,), torch.bfloat16),
             TensorInfo("a", (5, 1), torch.int64)]
    assert bytes(build_header(infos)) == reference(infos, None)
    meta = [TensorInfo("__metadata__", (1,), torch.float32)]
    assert bytes(build_header(meta, {"format": "pt"})) == reference(meta, {"format": "pt"})


def test_header_negative_control() -> None:
    """The comparison can fail: another order of the same tensors gives other bytes."""
    infos = random_infos(random.Random(3), 20)
    assert bytes(build_header(infos[::-1])) != reference(infos, None)


@pytest.mark.parametrize("n", [0, 1, 2, 1500])
def test_index_is_json_dump_of_the_sorted_map(tmp_path, n: int) -> None:
    """``model.safetensors.index.json``, written entry by entry, is the bytes of
    ``json.dump(..., indent=2)`` over the map sorted by name (names of any characters)."""
    from nemo_convert.formats.hf.hf import _write_index

    rng = random.Random(n)
    alphabet = "ab.\"\\/\t\n\u00e9\u4e2d\U0001f600 "
    weight_map = {f"t{i}" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(6))):
                  f"model-{rng.randrange(3) + 1:05d}-of-00003.safetensors" for i in range(n)}
    total = rng.randrange(1 << 50)
    _write_index(str(tmp_path / "got.json"), total, weight_map)
    with open(tmp_path / "want.json", "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    assert (tmp_path / "got.json").read_bytes() == (tmp_path / "want.json").read_bytes()
