"""Every public function takes ``pathlib.Path`` (any ``os.PathLike``) where it takes a path
(issue 20, item 6: ``export_hf``, ``reshard``, ``verify``, ``inspect_checkpoint``,
``open_checkpoint`` and ``quantize`` failed with ``'PosixPath' object has no attribute
'endswith'``).

The functions are enumerated from ``nemo_convert.api.__all__``: a new public function fails
:func:`test_every_public_function_is_called_here` until it is added to :data:`CALLS` (or to
:data:`NO_PATHS`, with the reason).
"""

from __future__ import annotations

import copy
import inspect
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from nemo_convert import api
from tiny_models import make_tiny_llama

#: The module's fixture builds every kind of checkpoint and each test runs a conversion:
#: about 10 s together, too much for the under-a-minute ``-m "not slow"`` suite.
pytestmark = pytest.mark.slow

#: Public functions without a path parameter.
NO_PATHS = {"get_registry": "no arguments but a flag", "registry_with": "plugin objects",
            "plan_import": "a family, a config dict and an open tensor source"}
#: Parameter names that are paths, wherever they occur.
PATH_PARAMS = {"src", "out", "path", "a", "b", "hparams", "calib_data", "clip_image"}


@pytest.fixture(scope="module")
def w(tmp_path_factory) -> dict[str, Path]:
    """A tiny HF Llama, its .nemo, a training checkpoint of it, a calibration text: all as Paths."""
    from nemo_convert.convert.common import SECTION
    from nemo_convert.examples import write_training_checkpoint

    base = tmp_path_factory.mktemp("paths")
    hf = Path(make_tiny_llama(str(base / "hf")))
    nemo = base / "m.nemo"
    api.import_hf(str(hf), str(nemo))
    with api.open_checkpoint(str(nemo)) as ck:
        weights = {k: ck.source.load(k) for k in ck.source.keys()}
        cfg = copy.deepcopy(ck.config)
    cfg.pop(SECTION, None)
    cfg["tokenizer"] = dict(cfg.get("tokenizer") or {}, library="sentencepiece", model="tokenizer.model")
    (base / "run").mkdir()
    ckpt = Path(write_training_checkpoint(str(base / "run" / "step=1.ckpt"), weights, cfg))
    shutil.copyfile(hf / "tokenizer.model", base / "run" / "tokenizer.model")
    calib = base / "calib.txt"
    calib.write_text("The quick brown fox jumps over the lazy dog.\nHello, world!\n")
    return {"base": base, "hf": hf, "nemo": nemo, "ckpt": ckpt, "calib": calib}


def _out(w: dict[str, Path], name: str) -> Path:
    return w["base"] / "out" / name


#: name → a call with every path as a ``Path``, and a check of what it returned.
CALLS: dict[str, Callable[[dict[str, Path]], Any]] = {
    "import_hf": lambda w: api.import_hf(w["hf"], _out(w, "i.nemo")).output,
    "export_hf": lambda w: api.export_hf(w["nemo"], _out(w, "e")).output,
    "reshard": lambda w: api.reshard(w["nemo"], _out(w, "r.nemo"), tp=2).output,
    "from_ckpt": lambda w: api.from_ckpt(w["ckpt"], _out(w, "c.nemo"), hparams=None).output,
    "quantize": lambda w: api.quantize(w["nemo"], _out(w, "q.qnemo"), algo="fp8", dtype="bf16", calib_data=w["calib"],
                                       calib_size=2, calib_seq_len=8).output,
    "add_tokens": lambda w: api.add_tokens(w["hf"] / "tokenizer.model", _out(w, "t.model"), ["<x>"]).output,
    "verify": lambda w: api.verify(w["hf"], w["nemo"]).ok,
    "inspect_checkpoint": lambda w: api.inspect_checkpoint(w["nemo"])["path"],
    "open_checkpoint": lambda w: _open(w["nemo"]),
    "is_megatron_dir": lambda w: api.is_megatron_dir(w["hf"]),
    "resolve_hf_source": lambda w: api.resolve_hf_source(w["hf"]),
}


def _open(path: Path) -> str:
    with api.open_checkpoint(path) as ck:
        assert len(list(ck.source.keys())) > 0
        return ck.path


def _public_functions() -> set[str]:
    return {n for n in api.__all__ if inspect.isfunction(getattr(api, n))}


def test_every_public_function_is_called_here():
    assert _public_functions() == set(CALLS) | set(NO_PATHS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_public_functions_take_paths(w, name):
    got = CALLS[name](w)
    expected = {"import_hf": _out(w, "i.nemo"), "export_hf": _out(w, "e"), "reshard": _out(w, "r.nemo"),
                "from_ckpt": _out(w, "c.nemo"), "quantize": _out(w, "q.qnemo"), "add_tokens": _out(w, "t.model"),
                "verify": True, "inspect_checkpoint": w["nemo"], "open_checkpoint": w["nemo"],
                "is_megatron_dir": False, "resolve_hf_source": w["hf"]}[name]
    if isinstance(expected, Path):  # reports name the output as a plain string
        assert got == str(expected) and type(got) is str and os.path.exists(got)
    else:
        assert got == expected


def test_path_parameters_are_annotated_as_pathlike():
    for name in CALLS:
        for p in inspect.signature(getattr(api, name)).parameters.values():
            if p.name in PATH_PARAMS:
                assert "os.PathLike[str]" in str(p.annotation), (name, p.name, p.annotation)
