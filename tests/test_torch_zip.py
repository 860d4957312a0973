"""The torch zip reader and the safe unpickler, checked against real ``torch.save`` files."""

from __future__ import annotations

import base64
import collections
import fractions
import gc
import os
import pickle
import sys
import tarfile
import types
import zipfile
import zlib
from typing import Any

import numpy as np
import pytest
import torch
from pickle_fakes import NONE_DICT, fake_omegaconf, omegaconf_modules, omegaconf_tree

from nemo_convert.errors import InputError, UnsafePickleError
from nemo_convert.tensors.base import ByteRegion, TensorSource
from nemo_convert.tensors.safe_unpickle import safe_load_pickle_bytes
from nemo_convert.tensors.torch_zip import LazyTensor, read_torch_zip
from nemo_convert.tensors.torch_zip_source import TorchZipSource, open_torch_file


def _save(obj: Any, path: Any, **kw: Any) -> str:
    torch.save(obj, str(path), **kw)
    return str(path)


def _region(path: str) -> ByteRegion:
    return ByteRegion(path, 0, os.path.getsize(path))


def _assert_same(loaded: torch.Tensor, original: torch.Tensor) -> None:
    original = original.detach()
    assert loaded.dtype == original.dtype and loaded.shape == original.shape
    if original.dtype.is_floating_point and original.element_size() == 1:  # fp8: compare bits
        loaded, original = loaded.view(torch.uint8), original.view(torch.uint8)
    assert torch.equal(loaded, original)


def _mixed_state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w32": torch.randn(5, 7, generator=g),
        "w64": torch.randn(3, generator=g, dtype=torch.float64),
        "w16": torch.randn(4, 4, generator=g).half(),
        "wbf": torch.randn(2, 8, generator=g).bfloat16(),
        "fp8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "fp8b": torch.randn(6, generator=g).to(torch.float8_e5m2),
        "i64": torch.arange(10),
        "i32": torch.arange(-4, 4, dtype=torch.int32),
        "i8": torch.arange(-3, 3, dtype=torch.int8),
        "u8": torch.arange(7, dtype=torch.uint8),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "param": torch.nn.Parameter(torch.ones(3, 2)),
    }


# ----------------------------------------------------------------------- tensors
def test_mixed_dtypes_are_bit_exact(tmp_path: Any) -> None:
    sd = _mixed_state_dict()
    path = _save(sd, tmp_path / "m.pt")
    with open_torch_file(path) as src:
        assert isinstance(src, TensorSource)
        assert src.keys() == list(sd)
        for key, original in sd.items():
            assert src.info(key).shape == tuple(original.shape)
            assert src.info(key).dtype == original.dtype
            _assert_same(src.load(key), original)
            assert src.group(key) == path
        assert src.lazy("param").is_parameter
        with pytest.raises(KeyError):
            src.info("nope")
        with pytest.raises(KeyError):
            src.group("nope")


def test_shared_storage_views_and_transposes(tmp_path: Any) -> None:
    base = torch.arange(48, dtype=torch.float32)
    sd = collections.OrderedDict(
        whole=base.view(6, 8),
        rows=base[8:24].view(2, 8),  # storage offset 8
        col=base.view(6, 8)[:, 3],  # stride 8
        t=base.view(6, 8).t(),  # non-contiguous
        step=base[1::5],
        last=base[47],  # 0-d with an offset
    )
    sd["t_bf16"] = torch.randn(3, 5).bfloat16().t()
    sd["neg"] = base[:4]._neg_view()  # saved with a neg bit: loaded as resolved values
    path = _save(sd, tmp_path / "v.pt")
    src = open_torch_file(path)
    keys = {src.lazy(k).storage_key for k in ("whole", "rows", "col", "t", "step", "last")}
    assert len(keys) == 1
    assert src.lazy("rows").storage_offset == 8 and src.lazy("col").stride == (8,)
    assert not src.lazy("t").is_contiguous() and src.lazy("whole").is_contiguous()
    for key, original in sd.items():
        loaded = src.load(key)
        _assert_same(loaded, original)
        assert loaded.stride() == original.stride()
    # the views share one mapping, as in torch: offsets are element offsets into it
    whole, rows = src.load("whole"), src.load("rows")
    assert rows.data_ptr() - whole.data_ptr() == 8 * 4
    src.close()


def test_lightning_like_ckpt(tmp_path: Any) -> None:
    sd = collections.OrderedDict(
        (f"model.layers.{i}.weight", torch.randn(4, 4).bfloat16()) for i in range(3))
    ckpt = {
        "epoch": 3,
        "global_step": 1200,
        "pytorch-lightning_version": "2.1.0",
        "state_dict": sd,
        "hyper_parameters": {"cfg": {"hidden": 4, "optim": {"name": "adam", "betas": [0.9, 0.98]},
                                     "tokenizer": {"model": None}}},
        "optimizer_states": [{
            "state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(4, 4)}},
            "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.98), "params": [0]}],
        }],
        "lr_schedulers": [{"last_epoch": 7, "_last_lr": [1e-4]}],
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 4}}}},
        "np_scalar": np.float64(0.25),
        "np_int": np.int64(7),
        "np_array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "misc": {"set": {1, 2}, "fs": frozenset({"a"}), "c": 1 + 2j, "b": b"\x00\xff",
                 "sl": slice(1, 3)},
    }
    path = _save(ckpt, tmp_path / "last.ckpt")
    src = open_torch_file(path)
    assert src.keys() == list(sd)
    for key in sd:
        _assert_same(src.load(key), sd[key])
    tree = src.tree
    assert tree["epoch"] == 3 and tree["pytorch-lightning_version"] == "2.1.0"
    assert tree["hyper_parameters"] == ckpt["hyper_parameters"]
    assert tree["lr_schedulers"] == ckpt["lr_schedulers"]
    assert tree["np_scalar"] == 0.25 and isinstance(tree["np_scalar"], np.float64)
    assert tree["np_int"] == 7
    np.testing.assert_array_equal(tree["np_array"], ckpt["np_array"])
    assert tree["misc"] == ckpt["misc"]
    group = tree["optimizer_states"][0]["param_groups"][0]
    assert group == {"lr": 1e-4, "betas": (0.9, 0.98), "params": [0]}
    assert isinstance(tree["optimizer_states"][0]["state"][0]["exp_avg"], LazyTensor)

    opt = TorchZipSource(_region(path), select="optimizer_states")
    assert opt.keys() == ["0.state.0.step", "0.state.0.exp_avg"]
    _assert_same(opt.load("0.state.0.exp_avg"), ckpt["optimizer_states"][0]["state"][0]["exp_avg"])
    with pytest.raises(InputError, match="no top-level key 'nope'"):
        TorchZipSource(_region(path), select="nope")


def test_plain_state_dict_and_read_torch_zip(tmp_path: Any) -> None:
    sd = collections.OrderedDict(
        a=torch.ones(2), nested={"b": torch.zeros(3), "c": [torch.ones(1)]})
    path = _save(sd, tmp_path / "model_weights.ckpt")
    assert open_torch_file(path).keys() == ["a", "nested.b", "nested.c.0"]
    tree = read_torch_zip(_region(path))
    assert type(tree) is dict and list(tree) == ["a", "nested"]
    _assert_same(tree["nested"]["b"].load(), sd["nested"]["b"])


def test_member_of_an_uncompressed_tar_is_read_in_place(tmp_path: Any) -> None:
    sd = _mixed_state_dict()
    pt = _save(sd, tmp_path / "model_weights.ckpt")
    (tmp_path / "model_config.yaml").write_text("hidden: 4\n" * 100)
    tar_path = str(tmp_path / "model.nemo")
    with tarfile.open(tar_path, "w:") as tar:
        tar.add(str(tmp_path / "model_config.yaml"), arcname="./model_config.yaml")
        tar.add(pt, arcname="./model_weights.ckpt")
    os.remove(pt)
    with tarfile.open(tar_path, "r:") as tar:
        member = tar.getmember("./model_weights.ckpt")
    region = ByteRegion(tar_path, member.offset_data, member.size)
    assert region.offset > 0
    with TorchZipSource(region) as src:
        for key, original in sd.items():
            _assert_same(src.load(key), original)
        assert src.group("w32") == tar_path


def test_large_tensor_load_is_mmap_backed(tmp_path: Any) -> None:
    n = 50_000_000  # 200 MB of float32
    big = torch.full((n,), 1.5)
    big[-1] = 7.0
    path = _save({"big": big}, tmp_path / "big.pt")
    del big
    gc.collect()
    fd = os.open(path, os.O_RDONLY)  # written pages would count as Private_Dirty until
    os.fsync(fd)  # written back: flush them so the numbers measure only our process
    os.close(fd)
    src = open_torch_file(path)
    before = _memory_kb()
    t = src.load("big")
    assert float(t.sum(dtype=torch.float64)) == 1.5 * (n - 1) + 7.0  # touches every page
    after = _memory_kb()
    for name in ("Anonymous", "Private_Dirty"):
        grew = after[name] - before[name]
        assert grew < 40_000, f"{name} grew by {grew} kB: the tensor is not mmap-backed"
    copy = t.clone()  # the measure does see a private copy
    assert _memory_kb()["Anonymous"] - before["Anonymous"] > 150_000
    del t, copy
    src.close()


def _memory_kb() -> dict[str, int]:
    fields = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1])
    return fields


# ------------------------------------------------------------------- bad inputs
def test_legacy_format_is_refused(tmp_path: Any) -> None:
    path = _save({"a": torch.ones(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(InputError, match="legacy"):
        open_torch_file(path)


def _rewrite(src: str, dst: str, compression: int, byteorder: bytes | None) -> str:
    """Copy a torch zip member by member, recompressed and with another byteorder record."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            if not info.filename.endswith("/byteorder"):
                zout.writestr(info.filename, zin.read(info))
            elif byteorder is not None:
                zout.writestr(info.filename, byteorder)
    return dst


def test_byteorder_compression_and_truncation(tmp_path: Any) -> None:
    sd = {"a": torch.arange(64.0)}
    path = _save(sd, tmp_path / "a.pt")
    unmarked = _rewrite(path, str(tmp_path / "u.pt"), zipfile.ZIP_STORED, None)
    _assert_same(open_torch_file(unmarked).load("a"), sd["a"])  # no record: native order
    big = _rewrite(path, str(tmp_path / "b.pt"), zipfile.ZIP_STORED, b"big")
    with pytest.raises(InputError, match="big-endian"):
        open_torch_file(big)
    deflated = _rewrite(path, str(tmp_path / "d.pt"), zipfile.ZIP_DEFLATED, b"little")
    with pytest.raises(InputError, match="compressed"):
        open_torch_file(deflated)
    with open(path, "rb") as f:
        data = f.read()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError):
        open_torch_file(str(tmp_path / "cut.pt"))
    with pytest.raises(InputError, match="no such file"):
        open_torch_file(str(tmp_path / "missing.pt"))


class _Evil:
    def __init__(self, call: Any, arg: str) -> None:
        self.call, self.arg = call, arg

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return self.call, (self.arg,)


@pytest.mark.parametrize("how", ["system", "eval"])
def test_malicious_pickle_is_refused(tmp_path: Any, how: str) -> None:
    marker = tmp_path / "MARKER"
    command = f"touch {marker}"
    evil = _Evil(os.system, command) if how == "system" else _Evil(
        eval, f"__import__('os').system({command!r})")
    path = _save({"state_dict": {"w": torch.ones(2)}, "x": evil}, tmp_path / "evil.pt")
    assert not marker.exists()
    expected = f"{os.system.__module__}.system" if how == "system" else "builtins.eval"
    pattern = rf"refuses to load global '{expected}'.*--trust-pickle"
    with pytest.raises(UnsafePickleError, match=pattern):
        open_torch_file(path)
    with pytest.raises(UnsafePickleError):
        safe_load_pickle_bytes(pickle.dumps(evil, protocol=2))
    assert not marker.exists()


def test_trust_mode_allows_unlisted_globals_only_when_asked(tmp_path: Any) -> None:
    path = _save({"w": torch.ones(2), "ratio": fractions.Fraction(1, 3)}, tmp_path / "f.pt")
    with pytest.raises(UnsafePickleError, match="'fractions.Fraction'"):
        open_torch_file(path)
    src = open_torch_file(path, trust_pickle=True)
    assert src.tree["ratio"] == fractions.Fraction(1, 3)
    _assert_same(src.load("w"), torch.ones(2))  # tensors stay lazy even when trusted
    assert safe_load_pickle_bytes(pickle.dumps(fractions.Fraction(2, 5)), trust=True) == \
        fractions.Fraction(2, 5)


def test_build_cannot_alter_allow_listed_objects() -> None:
    # BUILD with slot state on the shared torch.FloatStorage token: must not mutate it.
    attack = (b"\x80\x02ctorch\nFloatStorage\nN}X\x05\x00\x00\x00dtypectorch\nint8\ns\x86b.")
    with pytest.raises(InputError):
        safe_load_pickle_bytes(attack)
    attack = (b"\x80\x02comegaconf.dictconfig\nDictConfig\nN}X\x06\x00\x00\x00sourceX\x01"
              b"\x00\x00\x00xs\x86b.")
    with pytest.raises(InputError):
        safe_load_pickle_bytes(attack)
    from nemo_convert.tensors import safe_unpickle

    assert safe_unpickle._BASE_GLOBALS["torch.FloatStorage"].dtype == "float32"  # torch's name of the dtype
    dict_config = safe_unpickle._BASE_GLOBALS["omegaconf.dictconfig.DictConfig"]
    assert dict_config.source == "omegaconf.dictconfig.DictConfig"


# ------------------------------------------------------------ configs as plain data
def test_omegaconf_configs_become_plain_dicts(tmp_path: Any) -> None:
    model = {"hidden": 64, "lr": 1.5e-4, "bf16": True, "name": "gpt", "layers": [1, {"x": None}],
             "tok": {"model": "${model.name}"}, "missing": "???"}
    plain = {"model": model, "none_dict": None}
    before = omegaconf_modules()  # a real OmegaConf may be imported
    with fake_omegaconf() as classes:
        cfg = omegaconf_tree(classes, {"model": model, "none_dict": NONE_DICT}, typed=True)
        ckpt = {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"cfg": cfg},
                "hparams_type": classes["DictConfig"]}
        path = _save(ckpt, tmp_path / "omega.ckpt")
    assert omegaconf_modules() == before  # the stand-ins are gone; reading imports none
    src = open_torch_file(path)
    assert src.keys() == ["w"]
    assert src.tree["hyper_parameters"] == {"cfg": plain}
    assert src.tree["hparams_type"] == "omegaconf.dictconfig.DictConfig"
    assert omegaconf_modules() == before  # the stand-ins are gone; reading imports none


# OmegaConf 2.3.0's own pickle (protocol 2, as torch.save uses) of
# {"cfg": OmegaConf.create(REAL_OMEGACONF_PLAIN)} plus ``cfg.model.sub = {"a": 1}``.
REAL_OMEGACONF_PICKLE = (
    "eNpllXmD01QUxTszDDCZRUFFkHFl1IJaFhXcC4KCU6gaRaOIMU1f+8KkSU+TjhS4AsLgjAuCC+4fwG/pva+NJuNf"
    "fVnu75x73n3plXFCyZkolUp+q40xP+6otufHUavSDPxUFkHbOsbLo8MlxndfxQRhQ9mZ4iK3o1Kv6aUeJnOlDS9R"
    "FhekXhCp3qnRKxY2cu0mwuays5lre6rlpoOuwpTPP0HUto5EAwuWM80P48Y55afD59O+6zb6QZgGketa4svCjEHE"
    "3TSIIy/E7KrpYUkNMFd3JnnZCr12grsIdztWdun24jjFljVnzsgncbiseq7v+Vphq+/HYciaDEyspmp5/TAdat2j"
    "Z1Zwr437jCZrDG1t05YzwzdUqDoqGnm9X1v9hrNJoul6Pb6N7XVT5nIyqVzvIDxQNhY7cVOF2Kkl0nnCg2U9qSWi"
    "hwgPl/WUtvS0ntGzq3pO79TcySN6y5reqo2dR208ptmBNoJ6u57QDN5VNuHpoNlUkZsEFxQWcvsSsWAiKdd5YeFx"
    "1nqC8CTrrt+8//aszC/tJuwZGaoP/SyIn6dyfp628YzxMe9skG6XeVMqtcOcxThfhj3s1SK3j7Bf2hTqAcKzRepe"
    "oT6Xoz5v4+CQqivHq7v+3rPv9AGPmSLRaO0/iEOG+gLhxYz6EuHlIvWQUF/JUV+18VpGXR3RIq+jUDW0w4QjGe11"
    "wtEirSq0YznaGzbezGhmCNvdFMcZu1Ea9waql+BELt8wSLJzdZKX2bl6i9UWCbVsCE4STo2UC+Mv5RZGZk6Imbdz"
    "Zt6x8a7eViyI+WTB/ndQ5vWOs3ivbFp9n3A6a/UDwoeFVmsloTs5+kc2PjaMRV2pjfFKJvcM4ZPM9FnCp8XJrY0J"
    "xM1BPrPhFSZ3USa34YxxXOfhG19Ngsp8tQjt4hb4gtQ5ZGDjnEGd0ZV6v5H0G4rzl71I4yUsGZshoZPZjAjxugO2"
    "JMxujgkbvYLNebGZ8EkUgymhnxlcJnxeNGhO6/kcbGDjgoGEPCOz7Gvhojn8FRk7wkXj2Xw1OkGS8KcQl4wMEb7I"
    "ZC4TrhRlLonM1ZzMlzauFUaxWq3i+igKVsCKieIG4assilXC2rooVgT7dQ77jY1v/x/Fd2bHPNw0Tr8n3Mqc3ib8"
    "UHR6U5A/5pA/2fjZoG4MJ4nN9dmn/KVEcaRc+fDijiH/Qvg1I/9G+L1IviPkP3LkP238NfogyiwwNan8A0KBKUw="
)


def test_real_omegaconf_pickle_becomes_plain() -> None:
    data = zlib.decompress(base64.b64decode(REAL_OMEGACONF_PICKLE))
    assert safe_load_pickle_bytes(data) == {"cfg": {
        "model": {"hidden_size": 64, "lr": 0.00015, "bf16": True, "name": "gpt",
                  "layers": [1, {"x": None}], "tok": {"model": "${model.name}"},
                  "missing": "???", "sub": {"a": 1}},
        "none_dict": None}}


def test_attribute_dict_and_namespace(tmp_path: Any, monkeypatch: Any) -> None:
    import argparse

    module = "pytorch_lightning.utilities.parsing"
    attr_dict = type("AttributeDict", (dict,), {"__module__": module})
    for parent in ("pytorch_lightning", "pytorch_lightning.utilities", module):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    sys.modules[module].AttributeDict = attr_dict  # type: ignore[attr-defined]
    hparams = attr_dict(lr=0.1, args=argparse.Namespace(layers=2, name="x"))
    path = _save({"state_dict": {"w": torch.ones(1)}, "hyper_parameters": hparams},
                 tmp_path / "h.ckpt")
    monkeypatch.undo()
    tree = open_torch_file(path).tree
    assert type(tree["hyper_parameters"]) is dict
    assert tree["hyper_parameters"] == {"lr": 0.1, "args": {"layers": 2, "name": "x"}}


def test_plain_pickles_of_several_protocols() -> None:
    obj = {"od": collections.OrderedDict(a=1), "dd": collections.defaultdict(list, {1: [2]}),
           "arr": np.arange(4, dtype=np.int16).reshape(2, 2).T, "dt": np.dtype("f4"),
           "bytes": b"", "ba": bytearray(b"ab"), "big": 2 ** 70, "t": (1, "x")}
    for protocol in (0, 2, 4, 5):
        got = safe_load_pickle_bytes(pickle.dumps(obj, protocol=protocol))
        np.testing.assert_array_equal(got.pop("arr"), obj["arr"])
        assert got == {k: v for k, v in obj.items() if k != "arr"}
        assert type(got["od"]) is dict and type(got["dd"]) is dict
    for unsafe in (np.array([1, None], dtype=object), np.dtype([("a", "f4")])):
        with pytest.raises(InputError, match="numpy dtype"):  # numpy's setstate trusts data
            safe_load_pickle_bytes(pickle.dumps(unsafe, protocol=2))


# ------------------------------------------------- archives read from memory (dist chunks)
def _from_memory(path: str, offset: int = 0, length: int | None = None) -> Any:
    """``read_tensor_archive`` of bytes ``[offset, offset + length)`` of ``path`` through the
    map a dist reader holds (the in-memory zip directory), as :class:`LazyTensor` fields."""
    from nemo_convert.tensors.file_map import FileMap
    from nemo_convert.tensors.torch_zip import read_tensor_archive

    length = os.path.getsize(path) - offset if length is None else length
    fmap = FileMap(path)
    return read_tensor_archive(ByteRegion(path, offset, length), fmap.view(offset, length))


def _fields(t: LazyTensor) -> tuple[Any, ...]:
    return (t.storage.key, t.storage.dtype, t.storage.nbytes, t.storage_offset, t.shape, t.stride,
            t.dtype_name, t.requires_grad, t.is_parameter, t.metadata,
            t.storage.archive.stored_range(t.storage))


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24.0).reshape(4, 6),
    lambda: torch.arange(24.0).reshape(4, 6).t(),  # not contiguous
    lambda: torch.arange(24.0).reshape(4, 6)[1:3],  # storage offset
    lambda: torch.randn(3, 5).to(torch.bfloat16),
    lambda: (torch.randn(2, 128) * 8).to(torch.float8_e4m3fn),
    lambda: torch.zeros(0, 4),
    lambda: torch.tensor(7, dtype=torch.int64),
    lambda: torch.nn.Parameter(torch.ones(3)),
])
def test_archive_read_from_memory_matches_zipfile(tmp_path: Any, make: Any) -> None:
    """The plain layout ``torch.save`` writes is read by ``struct`` from the map (twice: the
    second time from the per-process ``data.pkl`` cache), and gives what :mod:`zipfile`
    and the restricted unpickler give."""
    from nemo_convert.tensors.zip_directory import read_directory as _directory

    t = make()
    path = _save(t, tmp_path / "t.pt")
    with open(path, "rb") as f:
        assert _directory(memoryview(f.read())) is not None  # the fast path, not the fallback
    plain = read_torch_zip(_region(path))
    for _ in range(2):
        got = _from_memory(path)
        assert _fields(got) == _fields(plain)
        _assert_same(got.load(), t)


def test_archive_in_memory_inside_a_bigger_file(tmp_path: Any) -> None:
    """A chunk at an offset of its data file (as in a ``.distcp``): offsets are the region's."""
    t = torch.randn(5, 7)
    blob = open(_save(t, tmp_path / "t.pt"), "rb").read()
    big = tmp_path / "data.distcp"
    big.write_bytes(b"\0" * 100 + blob + b"\1" * 50)
    got = _from_memory(str(big), 100, len(blob))
    assert got.storage.archive.stored_range(got.storage)[0] >= 100
    _assert_same(got.load(), t)


def test_archive_in_memory_refuses_what_zipfile_refuses(tmp_path: Any) -> None:
    """Anything but the plain layout (compressed, another byte order, a damaged record, a
    cut archive) goes to :mod:`zipfile` and the same checks: the same refusals."""
    sd = torch.arange(64.0)
    path = _save(sd, tmp_path / "a.pt")
    big = _rewrite(path, str(tmp_path / "b.pt"), zipfile.ZIP_STORED, b"big")
    with pytest.raises(InputError, match="big-endian"):
        _from_memory(big)
    deflated = _rewrite(path, str(tmp_path / "d.pt"), zipfile.ZIP_DEFLATED, b"little")
    with pytest.raises(InputError, match="compressed"):
        _from_memory(deflated)
    data = bytearray(open(path, "rb").read())
    (tmp_path / "cut.pt").write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(InputError):
        _from_memory(str(tmp_path / "cut.pt"))
    at = data.index(b"data.pkl") + len(b"data.pkl")  # the first local header's name: data.pkl follows
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    assert start >= at
    data[start + info.file_size - 2] ^= 0xFF  # data.pkl's bytes no longer match their CRC-32
    (tmp_path / "crc.pt").write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt"):
        _from_memory(str(tmp_path / "crc.pt"))


def test_cached_pickle_still_checks_each_archive_storage(tmp_path: Any) -> None:
    """Two archives with the same ``data.pkl``: the second is not unpickled again, but its
    storage is still looked up and its size checked in its own directory."""
    t = torch.arange(16.0)
    path = _save(t, tmp_path / "a.pt")
    _assert_same(_from_memory(path).load(), t)
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp_path / "short.pt", "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data[:8] if "/data/" in info.filename else data)
    with pytest.raises(InputError, match="has 8 bytes"):
        _from_memory(str(tmp_path / "short.pt"))


def test_dist_writer_chunks_take_the_in_memory_path(tmp_path: Any) -> None:
    """The chunks our dist writer stores (``TorchSaveWriter``) have the plain layout too."""
    import io

    from nemo_convert.formats.torch_zip.torch_save import TorchSaveWriter
    from nemo_convert.tensors.zip_directory import read_directory as _directory

    t = torch.randn(6, 10).to(torch.bfloat16)
    buf = io.BytesIO()
    TorchSaveWriter(buf).save_tensor(t)
    assert _directory(memoryview(buf.getvalue())) is not None
    (tmp_path / "c.pt").write_bytes(buf.getvalue())
    got = _from_memory(str(tmp_path / "c.pt"))
    assert _fields(got) == _fields(read_torch_zip(_region(str(tmp_path / "c.pt"))))
    _assert_same(got.load(), t)


def test_an_archive_is_freed_without_the_cyclic_collector(tmp_path: Any) -> None:
    """Conversions pause the cyclic collector (``gc_paused``): an archive (and its file map)
    must go when its last tensor goes, by reference counting alone. Its storage cache held
    each StorageRef, which holds the archive: a cycle, freed only by a collection."""
    import weakref

    from nemo_convert.tensors.torch_zip import load_archive

    path = tmp_path / "t.pt"
    torch.save({"a": torch.arange(6.0), "b": torch.ones(3)}, path)
    was = gc.isenabled()
    gc.disable()
    try:
        tree, archive = load_archive(ByteRegion(str(path), 0, path.stat().st_size), False)
        assert torch.equal(tree["a"].load(), torch.arange(6.0))
        gone = weakref.ref(archive)
        del tree, archive
        assert gone() is None
    finally:
        if was:
            gc.enable()
