"""Property-based fuzzing of every reader of untrusted bytes.

The property, for every input: the reader either succeeds — and then everything it hands
out (members, tensors, config values) can be read — or it raises our own
:class:`~nemo_convert.errors.NemoConvertError` with a one-line message. Nothing else
escapes (``KeyError``, ``struct.error``, ``UnicodeDecodeError``, ``zipfile.BadZipFile``,
``RecursionError``, ``MemoryError``, …), and no pickle or YAML tag ever runs code: the
pickles below are built to call :func:`_touch_marker` (or ``os.system``/``eval``/``open``)
and the marker file must never appear.

Runs are deterministic (``derandomize=True``, no example database), 60–200 examples per
property, the whole file in well under a minute.

Known escapes — bugs in reader code these tests do not own — are listed in
``KNOWN_ESCAPES``. The property tests tolerate exactly those (the exception type *and* the
innermost ``nemo_convert`` function it left), so that any *new* kind of escape still fails.
Each one has a small deterministic reproducer at the end of this file, marked
``xfail(strict=True)``: when the bug is fixed the reproducer passes, strict xfail turns that
into a failure, and whoever fixed it deletes the mark and the ``KNOWN_ESCAPES`` entry.
"""

from __future__ import annotations

import builtins
import collections
import datetime
import gzip
import io
import itertools
import json
import os
import pathlib
import pickle
import shutil
import struct
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_convert.errors import NemoConvertError, UnsafePickleError
from nemo_convert.formats.dist_checkpoint.distckpt_meta import load_metadata
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter
from nemo_convert.formats.nemo.nemo import load_yaml
from nemo_convert.formats.nemo2.nemo2 import load_context_yaml
from nemo_convert.formats.io.sink import DirectorySink
from nemo_convert.formats.io.tar_archive import TarWriter, open_nemo_container
from nemo_convert.tensors.base import ByteRegion
from nemo_convert.tensors.safe_unpickle import safe_load_pickle_bytes
from nemo_convert.tensors.safetensors_source import SafetensorsFile, ShardedSafetensors
from nemo_convert.tensors.torch_zip import LazyTensor, read_torch_zip

pytestmark = pytest.mark.slow  # hypothesis: hundreds of generated inputs per test

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
FEW = settings(FUZZ, max_examples=60)


# =====================================================================================
# The property
# =====================================================================================
# name -> (exception types, innermost nemo_convert function, the reproducer test below)
KNOWN_ESCAPES: dict[str, tuple[tuple[type[BaseException], ...], str]] = {}


def _innermost(exc: BaseException) -> str:
    """The qualified name of the innermost ``nemo_convert`` function ``exc`` passed through."""
    name, tb = "?", exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if f"{os.sep}nemo_convert{os.sep}" in code.co_filename:
            name = code.co_qualname.split(".<locals>.")[0]  # a comprehension counts as its function
        tb = tb.tb_next
    return name


def known_escape(exc: BaseException) -> str | None:
    where = _innermost(exc)
    for label, (types, func) in KNOWN_ESCAPES.items():
        if isinstance(exc, types) and where == func:
            return label
    return None


STATS: collections.Counter[tuple[str, str]] = collections.Counter()  # (test, outcome) -> count


def outcome(fn: Callable[[], Any]) -> str:
    """Run ``fn``: ``"ok"``, ``"error"`` (a one-line NemoConvertError) or ``"known: …"``;
    any other exception fails the test with its type, message and where it left us."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
    try:
        fn()
    except NemoConvertError as exc:
        msg = str(exc)
        assert msg.strip() and "\n" not in msg, f"not a one-line message: {msg!r}"
        result = "error"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        label = known_escape(exc)
        if label is None:
            raise AssertionError(f"{type(exc).__name__} escaped from {_innermost(exc)}: {str(exc)[:300]}") from exc
        result = f"known: {label}"
    else:
        result = "ok"
    STATS[test, result] += 1
    return result


@pytest.fixture(scope="module", autouse=True)
def _print_stats() -> Any:
    """With ``NEMO_CONVERT_FUZZ_STATS=1`` (and ``-s``), print how the inputs fared."""
    yield
    if os.environ.get("NEMO_CONVERT_FUZZ_STATS"):
        for (test, result), n in sorted(STATS.items()):
            print(f"{test:45s} {result:60s} {n}")


# =====================================================================================
# Shared strategies and helpers
# =====================================================================================
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
WIDE_INTS = st.one_of(st.integers(-3, 64), st.sampled_from([2**31, 2**32 + 1, 2**62, 2**63, 2**64 + 7]))


@st.composite
def mutated(draw: st.DrawFn, data: bytes, hot: tuple[tuple[int, int], ...] = ()) -> bytes:
    """``data`` with 1–6 edits: byte overwrites (often inside the ``hot`` ranges),
    bit flips, truncation, insertion, deletion, duplication."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["set", "set", "flip", "truncate", "insert", "delete", "dup"]))
        if not out:
            kind = "insert"
        if kind in ("set", "flip"):
            if hot and draw(st.booleans()):
                lo, hi = draw(st.sampled_from(hot))
                i = draw(st.integers(lo, max(lo, min(hi, len(out)) - 1)))
            else:
                i = draw(st.integers(0, len(out) - 1))
            if i >= len(out):
                continue
            if kind == "set":
                out[i] = draw(st.integers(0, 255))
            else:
                out[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del out[draw(st.integers(0, len(out))):]
        elif kind == "insert":
            i = draw(st.integers(0, len(out)))
            out[i:i] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "delete":
            i = draw(st.integers(0, len(out) - 1))
            del out[i:i + draw(st.integers(1, 64))]
        else:
            i = draw(st.integers(0, len(out) - 1))
            out[i:i] = out[i:i + draw(st.integers(1, 600))]
    return bytes(out)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(path: pathlib.Path | str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


# =====================================================================================
# safetensors header parser
# =====================================================================================
_ST_TENSORS = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16),
               "c": torch.arange(3, dtype=torch.int64), "e": torch.empty(0, 2)}
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}


def _st_parts() -> tuple[dict[str, Any], bytes]:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, t in _ST_TENSORS.items():
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return header, data


def _st_bytes(header: Any, data: bytes, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    n = len(raw) if length is None else length
    return struct.pack("<Q", n % 2**64) + raw + data


def read_safetensors(path: str) -> None:
    sf = SafetensorsFile(path)
    try:
        for k in sf.keys():
            info = sf.info(k)
            t = sf.load(k)
            assert tuple(t.shape) == tuple(info.shape) and t.dtype == info.dtype
    finally:
        sf.close()


@FUZZ
@given(data=st.binary(max_size=1024) | st.builds(lambda n, b: struct.pack("<Q", n) + b,
                                                  st.integers(0, 600), st.binary(max_size=600)))
def test_safetensors_random_bytes(work, data):
    outcome(lambda: read_safetensors(_write(work / "r.safetensors", data)))


_FIELDS = ("dtype", "shape", "data_offsets")
_FIELD_VALUES = st.one_of(
    JSON,
    st.sampled_from(["F32", "BF16", "F16", "I64", "U8", "BOOL", "F8_E4M3", "f32", "", "Q4"]),
    st.lists(WIDE_INTS, max_size=4),
)


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "e", "__metadata__", "new"]),
                                st.sampled_from([*_FIELDS, "entry", "drop"]), _FIELD_VALUES), max_size=4),
       length=st.one_of(st.none(), st.integers(-12, 12), st.integers(0, 2**64 - 1)),
       tail=st.integers(-40, 40))
def test_safetensors_header_mutations(work, edits, length, tail):
    """Valid files whose header entries get random dtypes, shapes, offsets (absurd,
    negative, overlapping, past the end), whose length field lies, whose data is cut."""
    header, data = _st_parts()
    for name, field, value in edits:
        if field == "drop":
            header.pop(name, None)
        elif field == "entry" or not isinstance(header.get(name), dict):
            header[name] = value
        else:
            header[name][field] = value
    raw = json.dumps(header).encode()
    n = None if length is None else (len(raw) + length if -12 <= length <= 12 else length)
    data = data[:tail] if tail < 0 else data + b"\0" * tail
    outcome(lambda: read_safetensors(_write(work / "m.safetensors", _st_bytes(raw, data, n))))


@FUZZ
@given(st.data())
def test_safetensors_header_byte_flips(work, data):
    header, body = _st_parts()
    raw = json.dumps(header).encode()
    blob = _st_bytes(raw, body)
    bad = data.draw(mutated(blob, hot=((0, 8), (8, 8 + len(raw)))))
    outcome(lambda: read_safetensors(_write(work / "f.safetensors", bad)))


@FUZZ
@given(spans=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=5))
def test_safetensors_accepted_spans_are_disjoint(work, spans):
    """Tensors placed at random (often overlapping) byte ranges: the parser accepts the
    file only if no two non-empty tensors share a byte, and then each tensor is exactly
    its bytes. (Zero-size tensors hide overlaps: see the xfail reproducer.)"""
    header = {f"t{i}": {"dtype": "U8", "shape": [n], "data_offsets": [b, b + n]} for i, (b, n) in enumerate(spans)}
    body = bytes(range(64))
    path = _write(work / "s.safetensors", _st_bytes(header, body))
    ranges = sorted((b, b + n) for b, n in spans)
    overlap = any(b1 < e0 for (_, e0), (b1, _) in itertools.pairwise(ranges))
    if overlap:
        with pytest.raises(NemoConvertError, match="overlap"):
            SafetensorsFile(path)
        return
    sf = SafetensorsFile(path)
    try:
        for i, (b, n) in enumerate(spans):
            assert bytes(sf.load(f"t{i}").numpy()) == body[b:b + n]
    finally:
        sf.close()


# =====================================================================================
# safetensors index (ShardedSafetensors)
# =====================================================================================
@pytest.fixture(scope="module")
def index_folder(work) -> pathlib.Path:
    """``model/`` with one valid shard (tensors ``a``, ``b``), a valid shard *outside* it
    (``outside.safetensors``) that must never be used, and a sub-folder shard."""
    from safetensors.torch import save_file

    folder = work / "model"
    (folder / "sub").mkdir(parents=True)
    save_file({"a": torch.ones(2), "b": torch.zeros(3)}, str(folder / "model.safetensors"))
    save_file({"c": torch.ones(1)}, str(folder / "sub" / "x.safetensors"))
    save_file({"a": torch.ones(2), "b": torch.zeros(3)}, str(work / "outside.safetensors"))
    return folder


_SHARD_NAMES = st.sampled_from(["model.safetensors", "../outside.safetensors", "sub/x.safetensors", "sub",
                                "", ".", "..", "missing.safetensors", "model.safetensors\0x", "/etc/passwd",
                                "model.safetensors/", "./model.safetensors"])
_INDEXES = st.one_of(
    JSON,
    st.fixed_dictionaries({"weight_map": JSON}),
    st.fixed_dictionaries({"weight_map": st.dictionaries(st.sampled_from(["a", "b", "c", "z"]) | st.text(max_size=3),
                                                         _SHARD_NAMES | JSON, max_size=4)},
                          optional={"metadata": JSON}),
)


def read_index(folder: pathlib.Path) -> None:
    src = ShardedSafetensors(str(folder / "model.safetensors.index.json"))
    try:
        for k in src.keys():
            # never a shard outside the folder
            assert os.path.dirname(os.path.realpath(src.group(k))) == os.path.realpath(folder), src.group(k)
            src.load(k)
    finally:
        src.close()


@FUZZ
@given(index=_INDEXES)
def test_index_random_json(index_folder, index):
    _write(index_folder / "model.safetensors.index.json", json.dumps(index).encode())
    outcome(lambda: read_index(index_folder))


@FEW
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_index_random_bytes(index_folder, raw):
    _write(index_folder / "model.safetensors.index.json", raw)
    outcome(lambda: read_index(index_folder))


# =====================================================================================
# .nemo tar reader (plain and gzipped)
# =====================================================================================
@pytest.fixture(scope="module")
def tar_sample(work) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """A .nemo written by our TarWriter (config, weights, a GNU long name) and the byte
    ranges of its header blocks (the "hot" spots for mutation)."""
    path = str(work / "sample.nemo")
    with TarWriter(path, mtime=1_700_000_000) as w:
        w.add_bytes("model_config.yaml", b"precision: bf16\nhidden_size: 8\n")
        w.add_bytes("model_weights/__0_0.distcp", bytes(range(256)) * 12)
        w.add_bytes("model_weights/.metadata", b"\x80\x04N.")
        w.add_bytes("model_weights/" + "d" * 100 + "/" + "f" * 100, b"long")
    with open(path, "rb") as f:
        data = f.read()
    with tarfile.open(path, "r:") as tf:
        hot = tuple((m.offset, m.offset_data) for m in tf.getmembers())
    return data, hot


def read_container(path: str, tmp_dir: str) -> None:
    c = open_nemo_container(path, tmp_dir=tmp_dir)
    try:
        for name in c.names():
            data = c.read_bytes(name)
            assert len(data) == c.region(name).length
            assert c.exists(name) and not c.is_dir(name)
    finally:
        c.close()


def _check_tar(work: pathlib.Path, data: bytes, name: str) -> None:
    scratch = work / "scratch"
    scratch.mkdir(exist_ok=True)
    outcome(lambda: read_container(_write(work / name, data), str(scratch)))
    # a gzipped archive is extracted here and removed on close or failure: nothing left
    assert os.listdir(scratch) == []


@FEW
@given(data=st.binary(max_size=3000) | st.binary(max_size=3000).map(lambda b: b"\x1f\x8b" + b))
def test_tar_random_bytes(work, data):
    _check_tar(work, data, "random.nemo")


@FUZZ
@given(st.data())
def test_tar_mutations(work, tar_sample, data):
    raw, hot = tar_sample
    _check_tar(work, data.draw(mutated(raw, hot=hot)), "mutated.nemo")


@FUZZ
@given(st.data())
def test_gzip_tar_mutations(work, tar_sample, data):
    """A mutated tar, gzipped (valid gzip, corrupt tar); or a valid gzip mutated."""
    raw, hot = tar_sample
    if data.draw(st.booleans()):
        blob = gzip.compress(data.draw(mutated(raw, hot=hot)), compresslevel=1, mtime=0)
    else:
        blob = data.draw(mutated(gzip.compress(raw, compresslevel=1, mtime=0), hot=((0, 10),)))
    _check_tar(work, blob, "mutated-gz.nemo")


# =====================================================================================
# YAML: model_config.yaml (load_yaml) and NeMo 2 context/model.yaml (load_context_yaml)
# =====================================================================================
def _touch_marker(path: str) -> str:
    """What every evil pickle and YAML tag here tries to call."""
    with open(path, "w") as f:
        f.write("pwned")
    return path


@pytest.fixture(scope="module")
def marker(work) -> pathlib.Path:
    return work / "MARKER"


_SCALARS = st.sampled_from([
    "1", "-0x1F", "1e309", ".nan", "~", "null", "yes", "2001-12-14", "2001-13-14", "2001-12-14t21:59:43.10-05:00",
    "!!int foo", "!!float foo", "!!bool foo", "!!timestamp foo", "!!binary '###'", "!!binary aGk=",
    "!!set {a, b}", "!!omap [a: 1]", "!!pairs 5", "!!str 3", "!!null x", "!!map [1]", "!!seq {a: 1}",
    "&a [1, *a]", "*nowhere", "{<<: 5}", "{<<: [5, {a: 1}]}", "[[[[", "'unterminated", '"\\xZZ"', '"\\udc80"',
    "? [a, b]\n  : c", "!custom 1", "!<tag:yaml.org,2002:python/none> ''", "|\n  block", "%YAML 1.1",
    "{a: 1, a: 2}", "\t1", "@", "`x`", "- [1, {b: [2]}]",
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/apply:test_fuzz._touch_marker ['{marker}']",
    "!!python/object/new:test_fuzz._touch_marker ['{marker}']",
    "!!python/object/apply:builtins.eval [\"open('{marker}', 'w')\"]",
    "!!python/name:test_fuzz._touch_marker ''", "!!python/module:os ''",
    "!<tag:yaml.org,2002:python/object/apply:test_fuzz._touch_marker> ['{marker}']",
    "!!python/object:test_fuzz.Evil {a: 1}",
])
_KEYS = st.sampled_from(["model", "nemo_convert", "tokenizer", "hidden_size", "config", "_target_", "a", "<<"])


_WORDS = st.text(st.characters(categories=["L", "N", "P", "S", "Zs"]), max_size=12)
_PLAIN = st.sampled_from(["1", "2.5", "true", "bf16", "'quoted'", "[1, 2]", "{a: 1}", "null", "~", ""])


@st.composite
def yaml_docs(draw: st.DrawFn, marker: str) -> bytes:
    """A mapping document (top level, or under ``model:``/``config:``) whose values are
    mostly plain, sometimes tricky or tagged; sometimes byte-mutated afterwards."""
    nest = draw(st.sampled_from(["", "model:\n", "config:\n"]))
    indent = "  " if nest else ""
    lines = [nest.rstrip("\n")] if nest else []
    for i in range(draw(st.integers(1, 6))):
        value = draw(st.one_of(_PLAIN, _PLAIN, _SCALARS, _WORDS)).replace("{marker}", marker)
        key = draw(_KEYS | st.just(f"k{i}"))
        lines.append(f"{indent}{key}: {value}" if draw(st.integers(0, 5)) else f"{indent}{value}")
    text = "\n".join(lines) + "\n"
    if draw(st.integers(0, 2)):
        return text.encode()
    return draw(mutated(text.encode()))


def assert_inert(value: Any, seen: set[int] | None = None) -> None:
    """Only plain data (aliases may make it cyclic): no object a tag constructed."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        for k, v in value.items():
            assert_inert(k, seen)
            assert_inert(v, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            assert_inert(v, seen)
    else:
        assert isinstance(value, (str, bytes, int, float, bool, type(None), datetime.date)), type(value)


def _check_yaml(fn: Callable[[], Any], marker: pathlib.Path) -> None:
    outcome(fn)
    assert not marker.exists(), "a YAML tag ran code"


@FUZZ
@given(st.data())
def test_load_yaml(marker, data):
    doc = data.draw(yaml_docs(str(marker)) | st.binary(max_size=300))
    _check_yaml(lambda: load_yaml(doc, "model_config.yaml"), marker)


@FUZZ
@given(st.data())
def test_load_context_yaml(work, marker, data):
    doc = data.draw(yaml_docs(str(marker)) | st.binary(max_size=300))
    path = _write(work / "model.yaml", doc)

    def read() -> None:
        assert_inert(load_context_yaml(path))
    _check_yaml(read, marker)


def test_python_tags_are_inert_in_context_yaml(work, marker):
    """The NeMo 2 loader keeps every Python tag as a plain string; nothing is imported."""
    path = _write(work / "tags.yaml", (
        f"a: !!python/object/apply:test_fuzz._touch_marker ['{marker}']\n"
        f"b: !!python/name:os.system ''\n"
        f"c: !!python/object/new:subprocess.Popen [['touch', '{marker}']]\n").encode())
    cfg = load_context_yaml(path)
    assert all(isinstance(v, str) and v.startswith("<tag ") for v in cfg.values()), cfg
    assert not marker.exists()
    with pytest.raises(NemoConvertError):
        load_yaml(pathlib.Path(path).read_bytes(), "model_config.yaml")
    assert not marker.exists()


# =====================================================================================
# Pickles: the restricted unpickler, torch.save zips, DCP .metadata
# =====================================================================================
class Evil:
    """Pickles as a call of ``fn(*args)``."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


def _evil_payloads(marker: str) -> list[Any]:
    return [Evil(_touch_marker, marker), Evil(os.system, f"touch {marker}"),
            Evil(subprocess.call, ["touch", marker]), Evil(builtins.eval, f"open({marker!r}, 'w')"),
            Evil(builtins.exec, f"open({marker!r}, 'w').close()"), Evil(builtins.open, marker, "w"),
            Evil(pathlib.Path.touch, pathlib.Path(marker)), Evil(shutil.copyfile, __file__, marker)]


def _evil_opcodes(marker: str) -> list[bytes]:
    """Hand-written pickles reaching for code through each opcode that names a global."""
    m = marker.encode()
    return [
        b"cos\nsystem\n(S'touch " + m + b"'\ntR.",                          # GLOBAL + REDUCE
        b"(S'touch " + m + b"'\nios\nsystem\n.",                            # INST
        b"\x80\x04\x8c\x02os\x8c\x06system\x93X" + struct.pack("<I", len(m) + 6) + b"touch " + m
        + b"\x85R.",                                                       # STACK_GLOBAL
        b"(ctest_fuzz\n_touch_marker\nS'" + m + b"'\no.",                   # OBJ
        b"\x80\x02ctest_fuzz\nEvil\n)\x81}(U\x02fncposix\nsystem\nU\x04args(S'touch " + m + b"'\ntub.",
        b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\nU\x02os\x85RU\x06system\x86R.",
    ]


_BENIGN = [
    {"a": 1, "b": [1.5, None, True], "c": ("x", b"y")},
    collections.OrderedDict(w=[1, 2], s={3}, f=frozenset({4})),
    {"path": pathlib.PurePosixPath("/a/b"), "dtype": torch.bfloat16, "size": torch.Size([2, 3])},
    [complex(1, 2), slice(1, 5, 2), bytearray(b"ab"), {"nested": [[[[{}]]]]}],
]
try:
    import numpy as np

    _BENIGN.append({"arr": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.float64(2.5),
                    "u": np.array(["ab", "c"]), "b": np.array([True, False])})
except ImportError:  # pragma: no cover
    pass


@st.composite
def wrapped_evil(draw: st.DrawFn, marker: str) -> bytes:
    """An evil payload somewhere inside benign data, pickled with any protocol."""
    evil = draw(st.sampled_from(_evil_payloads(marker)))
    shape = draw(st.sampled_from(["bare", "list", "dict", "key", "nested", "state"]))
    obj: Any = {"bare": evil, "list": [1, evil], "dict": {"x": evil}, "key": {(1, evil): 2},
                "nested": {"state_dict": {"w": [1, {"deep": (evil,)}]}},
                "state": collections.OrderedDict(cfg=evil)}[shape]
    return pickle.dumps(obj, protocol=draw(st.integers(0, pickle.HIGHEST_PROTOCOL)))


@FUZZ
@given(st.data())
def test_pickle_never_runs_code(marker, data):
    blob = data.draw(wrapped_evil(str(marker)) | st.sampled_from(_evil_opcodes(str(marker))))
    with pytest.raises(NemoConvertError):
        safe_load_pickle_bytes(blob)
    assert not marker.exists(), "a pickle ran code"


@FUZZ
@given(st.data())
def test_safe_unpickler_random_and_mutated(marker, data):
    base = pickle.dumps(data.draw(st.sampled_from(_BENIGN)), protocol=data.draw(st.integers(0, 5)))
    blob = data.draw(mutated(base) | st.binary(max_size=300))
    outcome(lambda: safe_load_pickle_bytes(blob))
    assert not marker.exists()


# --------------------------------------------------------------------- torch.save zips
@pytest.fixture(scope="module")
def torch_sample(work) -> tuple[bytes, dict[str, bytes]]:
    obj = {"state_dict": {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(3, dtype=torch.bfloat16),
                          "t": torch.arange(8.0).view(2, 4).t(), "e": torch.ones(1).expand(4),
                          "p": torch.nn.Parameter(torch.zeros(2))},
           "hyper_parameters": {"lr": 0.1, "names": ["a", "b"]}, "epoch": 3}
    path = work / "sample.pt"
    torch.save(obj, str(path))
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    return path.read_bytes(), members


def _rezip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _lazies(obj: Any) -> list[LazyTensor]:
    if isinstance(obj, LazyTensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _lazies(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _lazies(v)]
    return []


def read_torch(path: str) -> None:
    tree = read_torch_zip(ByteRegion(path, 0, os.path.getsize(path)))
    for lazy in _lazies(tree):
        t = lazy.load()
        assert tuple(t.shape) == lazy.shape and t.dtype == lazy.dtype


@FUZZ
@given(st.data())
def test_torch_zip_mutations(work, marker, torch_sample, data):
    """Random edits of a torch.save file, or of its data.pkl re-zipped with a good CRC
    (which reaches the unpickler and the tensor rebuilders)."""
    raw, members = torch_sample
    if data.draw(st.booleans()):
        blob = data.draw(mutated(raw))
    else:
        pkl = next(n for n in members if n.endswith("/data.pkl"))
        blob = _rezip({**members, pkl: data.draw(mutated(members[pkl]))})
    outcome(lambda: read_torch(_write(work / "m.pt", blob)))
    assert not marker.exists()


@FEW
@given(st.data())
def test_torch_zip_never_runs_code(work, marker, torch_sample, data):
    _, members = torch_sample
    pkl = next(n for n in members if n.endswith("/data.pkl"))
    evil = data.draw(wrapped_evil(str(marker)) | st.sampled_from(_evil_opcodes(str(marker))))
    path = _write(work / "evil.pt", _rezip({**members, pkl: evil}))
    with pytest.raises(NemoConvertError):
        read_torch(path)
    assert not marker.exists()


# --------------------------------------------------------------------- DCP .metadata
@pytest.fixture(scope="module")
def dcp_folder(work) -> tuple[pathlib.Path, bytes]:
    folder = work / "dcp"
    w = DistCheckpointWriter(DirectorySink(str(folder)), "")
    w.declare("embedding.word_embeddings.weight", (4, 3), torch.float32)
    w.write_chunk("embedding.word_embeddings.weight", (0, 0), torch.arange(12.0).view(4, 3))
    w.declare("decoder.layers.mlp.linear_fc1.weight", (2, 4, 3), torch.bfloat16)
    w.write_chunk("decoder.layers.mlp.linear_fc1.weight", (0, 0, 0), torch.ones(1, 4, 3, dtype=torch.bfloat16))
    w.write_chunk("decoder.layers.mlp.linear_fc1.weight", (1, 0, 0), torch.zeros(1, 4, 3, dtype=torch.bfloat16))
    w.close()
    return folder, (folder / ".metadata").read_bytes()


def read_dcp(folder: pathlib.Path) -> None:
    src = DistCheckpointSource.from_dir(folder)
    try:
        for k in src.keys():
            info = src.info(k)
            t = src.load(k)
            assert tuple(t.shape) == tuple(info.shape) and t.dtype == info.dtype
    finally:
        src.close()


@FUZZ
@given(st.data())
def test_dcp_metadata_mutations(marker, dcp_folder, data):
    folder, good = dcp_folder
    blob = data.draw(mutated(good) | st.binary(max_size=400))
    outcome(lambda: load_metadata(blob, ".metadata"))
    _write(folder / ".metadata", blob)
    try:
        outcome(lambda: read_dcp(folder))
    finally:
        _write(folder / ".metadata", good)
    assert not marker.exists()


@FEW
@given(st.data())
def test_dcp_metadata_never_runs_code(marker, data):
    evil = data.draw(wrapped_evil(str(marker)) | st.sampled_from(_evil_opcodes(str(marker))))
    with pytest.raises(UnsafePickleError):
        load_metadata(evil, ".metadata")
    assert not marker.exists()


# =====================================================================================
# Reproducers of the known escapes (xfail until fixed; see KNOWN_ESCAPES)
# =====================================================================================
def _xfail(reason: str, raises: Any = None) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)


def test_known_safetensors_dtype_list(work):
    header, data = _st_parts()
    header["a"]["dtype"] = ["F32"]
    with pytest.raises(NemoConvertError):
        read_safetensors(_write(work / "k1.safetensors", _st_bytes(header, data)))


def test_known_safetensors_boolean_shape(work):
    header, data = _st_parts()
    header["c"]["shape"] = [True, 3]
    with pytest.raises(NemoConvertError):
        read_safetensors(_write(work / "k2.safetensors", _st_bytes(header, data)))


def test_known_safetensors_deep_header(work):
    raw = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(NemoConvertError):
        read_safetensors(_write(work / "k3.safetensors", struct.pack("<Q", len(raw)) + raw))


def test_known_safetensors_overlap_hidden_by_empty_tensor(work):
    header = {"big": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]},
              "empty": {"dtype": "U8", "shape": [0], "data_offsets": [3, 3]},
              "inside": {"dtype": "U8", "shape": [2], "data_offsets": [5, 7]}}
    with pytest.raises(NemoConvertError, match="overlap"):
        SafetensorsFile(_write(work / "k4.safetensors", _st_bytes(header, bytes(10))))


@pytest.mark.parametrize("value", [["model.safetensors"], 5], ids=["list", "int"])
def test_known_index_non_string_shard(index_folder, value):
    _write(index_folder / "model.safetensors.index.json", json.dumps({"weight_map": {"a": value}}).encode())
    with pytest.raises(NemoConvertError):
        read_index(index_folder)


def test_known_index_deep_json(index_folder):
    _write(index_folder / "model.safetensors.index.json", b'{"weight_map": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(NemoConvertError):
        read_index(index_folder)


_YAML_CONSTRUCTOR = ("PyYAML's SafeConstructor raises ValueError/AttributeError/KeyError for scalars it "
                     "resolves but cannot build ('2001-13-14' is an implicit timestamp, '!!int foo', "
                     "'!!bool foo', '!!timestamp foo') and RecursionError for deep nesting; {} catches only "
                     "YAMLError: catch Exception (and RecursionError) around the load and raise InputError")
_BAD_YAML = [b"a: 2001-13-14\n", b"a: !!timestamp foo\n", b"a: !!int foo\n", b"a: !!float foo\n",
             b"a: !!bool foo\n", b"a: " + b"[" * 20_000 + b"]" * 20_000 + b"\n"]
_BAD_YAML_IDS = ["bad-date", "timestamp-tag", "int-tag", "float-tag", "bool-tag", "deep"]


@pytest.mark.parametrize("doc", _BAD_YAML, ids=_BAD_YAML_IDS)
def test_known_load_yaml_constructor_errors(doc):
    with pytest.raises(NemoConvertError):
        load_yaml(doc, "model_config.yaml")


@pytest.mark.parametrize("doc", _BAD_YAML, ids=_BAD_YAML_IDS)
def test_known_load_context_yaml_constructor_errors(work, doc):
    path = _write(work / "k-context.yaml", doc)
    with pytest.raises(NemoConvertError):
        load_context_yaml(path)


def test_known_numpy_zero_itemsize():
    import numpy as np

    blob = pickle.dumps(np.zeros(0, dtype="S1"), protocol=2).replace(b"S1", b"S0")
    with pytest.raises(NemoConvertError):
        safe_load_pickle_bytes(blob)


def test_known_torch_zip_deflate_flag(work, torch_sample):
    raw, _ = torch_sample
    data = bytearray(raw)
    i = data.find(b"PK\x01\x02")
    while i >= 0:
        name = bytes(data[i + 46:i + 46 + struct.unpack_from("<H", data, i + 28)[0]])
        if name.endswith(b"data.pkl"):
            struct.pack_into("<H", data, i + 10, zipfile.ZIP_DEFLATED)
        i = data.find(b"PK\x01\x02", i + 1)
    with pytest.raises(NemoConvertError):
        read_torch(_write(work / "k-deflate.pt", bytes(data)))


class _Storage:
    pass


class _HugeTensor:
    def __init__(self, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.size, self.stride = size, stride

    def __reduce__(self) -> Any:
        return (torch._utils._rebuild_tensor_v2,
                (_STORAGE, 0, self.size, self.stride, False, collections.OrderedDict()))


_STORAGE = _Storage()


class _TorchPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return ("storage", torch.FloatStorage, "0", "cpu", 1) if obj is _STORAGE else None


def _torch_zip_with(obj: Any) -> bytes:
    buf = io.BytesIO()
    _TorchPickler(buf, protocol=2).dump(obj)
    return _rezip({"archive/data.pkl": buf.getvalue(), "archive/byteorder": b"little",
                   "archive/data/0": struct.pack("<f", 1.0), "archive/version": b"3\n"})


@pytest.mark.parametrize("size", [(2**70,), (2**40, 2**40)], ids=["2^70", "2^80-elements"])
def test_known_torch_tensor_beyond_int64(work, size):
    path = _write(work / "k-huge.pt", _torch_zip_with({"w": _HugeTensor(size, (0,) * len(size))}))
    with pytest.raises(NemoConvertError):
        read_torch(path)


def _dcp_metadata_without(field: str, dcp_folder: tuple[pathlib.Path, bytes]) -> bytes:
    """The sample .metadata with one dataclass field renamed in the pickle (BUILD state)."""
    _, good = dcp_folder
    name = field.encode()
    assert name in good
    return good.replace(name, b"x" * len(name), 1)


def test_known_dcp_metadata_without_fields(dcp_folder):
    with pytest.raises(NemoConvertError):
        load_metadata(_dcp_metadata_without("state_dict_metadata", dcp_folder), ".metadata")


@pytest.mark.parametrize("field", ["chunks", "properties", "relative_path", "offsets"])
def test_known_dcp_entries_without_fields(dcp_folder, field):
    folder, good = dcp_folder
    _write(folder / ".metadata", _dcp_metadata_without(field, dcp_folder))
    try:
        with pytest.raises(NemoConvertError):
            read_dcp(folder)
    finally:
        _write(folder / ".metadata", good)


@pytest.mark.parametrize("name", ["x" * 300, "d" * 300 + "/f"], ids=["file", "folder"])
def test_gzip_member_name_too_long(work, name):
    """A gzipped .nemo member whose name the file system cannot hold (ENAMETOOLONG on
    extraction): an InputError, and the extraction folder is removed. (Found by the
    fuzzer; it used to escape as OSError.)"""
    path = str(work / "k-long.nemo")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo(name)
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    scratch = work / "k-scratch"
    scratch.mkdir(exist_ok=True)
    try:
        with pytest.raises(NemoConvertError, match="cannot extract"):
            read_container(path, str(scratch))
    finally:
        assert os.listdir(scratch) == []

