"""Megatron-LM's ``args`` as real runs write them, read without ``--trust-pickle``.

``tests/data/megatron_lm_args/<tag>.common.pt`` were written by Megatron-LM's own argument
code (``parse_args`` + ``validate_args``, then what ``pretrain`` adds) at each release tag
core_r0.8.0 … core_v0.19.0, for a tiny Llama run (``make_args.py`` there says how; its
``index.json`` records each tag's commit and the globals its pickle names). Each must read
inertly (the Megatron enums become ``Class.name`` strings), translate to the tiny Llama's
config and, as the ``common.pt`` of a Megatron-LM directory, export to the source's
tensors. A class outside the allow-list is refused by name, with nothing written.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import pickle
import shutil
import signal
from typing import Any

import pytest
import torch

from nemo_convert import api
from nemo_convert.errors import UnsafePickleError, UnsupportedError
from nemo_convert.formats.megatron.provider_read import args_to_nemo
from nemo_convert.formats.megatron.megatron_dir import _load_pickle_file
from nemo_convert.tensors.pickle_standins import MEGATRON_ENUMS
from tiny_models import hf_tensors, read_json

DATA = os.path.join(os.path.dirname(__file__), "data", "megatron_lm_args")
with open(os.path.join(DATA, "index.json")) as _f:
    INDEX: dict[str, Any] = json.load(_f)
#: The tiny Llama's GPT runs' fixtures (the hybrid runs', ``+hybrid*``, are
#: tests/test_megatron_lm_hybrid_args.py's; the other families', ``+nemotron4`` / ``+qwen2`` /
#: ``+mistral``, tests/test_megatron_lm_family_args.py's).
GPT = sorted(n for n in INDEX if "+hybrid" not in n and n.partition("+")[2] not in ("nemotron4", "qwen2", "mistral"))
#: Every release tag read (the brief's range: Megatron-Core 0.8 to 0.19).
TAGS = ("core_r0.8.0", "core_r0.9.0", "core_r0.10.0", "core_r0.11.0", "core_v0.12.3", "core_v0.13.1",
        "core_v0.14.0", "core_v0.15.3", "core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0")


def _globals(path: str) -> list[str]:
    import pickletools
    import zipfile

    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return sorted({a.replace(" ", ".") for op, a, _ in pickletools.genops(data) if op.name == "GLOBAL"})


def test_fixtures_cover_every_release_and_every_megatron_class() -> None:
    assert {k.split("+")[0] for k in INDEX} == set(TAGS)
    named = {g for v in INDEX.values() for g in v["globals"]}
    foreign = {g for g in named if not g.startswith(("torch.", "argparse."))}
    # every Megatron (and signal) class a run's args name is admitted, and nothing more is
    assert foreign == set(MEGATRON_ENUMS), foreign ^ set(MEGATRON_ENUMS)
    for name, entry in INDEX.items():
        assert _globals(os.path.join(DATA, f"{name}.common.pt")) == entry["globals"], name
        assert len(entry["commit"]) == 40 and entry["attributes"] > 300


@pytest.mark.parametrize("name", GPT)
def test_real_args_read_inertly_and_translate(name: str) -> None:
    common = _load_pickle_file(os.path.join(DATA, f"{name}.common.pt"), False)
    args = common["args"]
    assert isinstance(args, dict) and len(args) == INDEX[name]["attributes"]
    assert args["model_type"] == "ModelType.encoder_or_decoder"
    if "AttnBackend" in str(INDEX[name]["globals"]):
        assert args["attention_backend"] == "AttnBackend.fused"  # --attention-backend fused
    if "signal.Signals" in INDEX[name]["globals"]:
        assert args["exit_signal"] == "Signals.SIGTERM"
    if "+cuda-graph-scope" in name:
        assert args["cuda_graph_scope"] == ["CudaGraphScope.attn", "CudaGraphScope.mlp"]
    if "+cuda-graph-modules" in name:
        assert args["cuda_graph_modules"] == ["CudaGraphModule.attn", "CudaGraphModule.mlp"]
    assert args["params_dtype"] is torch.bfloat16
    cfg = args_to_nemo(args, name)
    want = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, num_query_groups=2,
                kv_channels=16, max_position_embeddings=256, normalization="rmsnorm", activation="fast-swiglu",
                share_embeddings_and_output_weights=False, bias=False, precision="bf16", rotary_base=10000.0,
                layernorm_epsilon=1e-5)
    assert {k: cfg[k] for k in want} == want


@pytest.fixture(scope="module")
def megatron_bridge_dir(tmp_path_factory: Any) -> tuple[str, str]:
    from nemo_convert.examples import make_tiny_llama

    root = tmp_path_factory.mktemp("mlm_args")
    src = make_tiny_llama(str(root / "hf"))
    mb = str(root / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    return src, mb


def megatron_lm_dir(mb: str, out: str, common: str | bytes | dict[str, Any]) -> str:
    """The Megatron-Bridge directory as Megatron-LM lays it out, ``common.pt`` = ``common``:
    a fixture's bytes, its path, or (a dict) the common state holding those args."""
    it = os.path.join(out, "iter_0000100")
    shutil.copytree(os.path.join(mb, "iter_0000000"), it)
    for name in ("run_config.yaml", "train_state.pt", "nemo_convert.json"):
        os.remove(os.path.join(it, name))
    shutil.rmtree(os.path.join(it, "tokenizer"), ignore_errors=True)
    if isinstance(common, dict):
        torch.save({"args": argparse.Namespace(**common), "checkpoint_version": 3.0, "iteration": 100},
                   os.path.join(it, "common.pt"))
    elif isinstance(common, bytes):
        with open(os.path.join(it, "common.pt"), "wb") as f:
            f.write(common)
    else:
        shutil.copyfile(common, os.path.join(it, "common.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("100")
    return out


def exports_to_source(cli: Any, src: str, mlm: str, back: str) -> dict[str, Any]:
    """``export`` of the Megatron-LM directory ``mlm`` to ``back`` (no ``--trust-pickle``):
    it succeeds and its tensors equal the HF source's; returns its ``config.json``."""
    code, _, err = cli("export", mlm, "-o", back, "-q")
    assert code == 0, err
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    return read_json(os.path.join(back, "config.json"))


@pytest.mark.parametrize("name", GPT)
def test_megatron_lm_directory_with_real_args_exports(megatron_bridge_dir: tuple[str, str], tmp_path: Any,
                                                      cli: Any, name: str) -> None:
    src, mb = megatron_bridge_dir
    mlm = megatron_lm_dir(mb, str(tmp_path / "mlm"), os.path.join(DATA, f"{name}.common.pt"))
    cfg = exports_to_source(cli, src, mlm, str(tmp_path / "back"))
    assert (cfg["vocab_size"], cfg["num_key_value_heads"], cfg["intermediate_size"]) == (320, 2, 96)


# ------------------------------------------------------------------- hostile args
class _Foreign(enum.Enum):
    """Pickled under the global name given to :func:`_save_naming`."""

    one = 1
    two = 2


def _save_naming(obj: Any, path: str, global_name: str) -> None:
    """``torch.save(obj)`` with :class:`_Foreign` written as the global ``global_name`` (as
    a Megatron class of that name would be), without that class existing here."""
    module, name = global_name.rsplit(".", 1)

    class Renaming(pickle._Pickler):  # the pure-Python pickler lets save_global be replaced
        def save_global(self, obj: Any, name_: Any = None) -> None:
            if obj is _Foreign:
                self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
                self.memoize(obj)
                return
            super().save_global(obj, name_)

    module_like = type("PickleModule", (), {"__name__": "pickle", "Pickler": Renaming, "dump": staticmethod(pickle.dump)})
    torch.save(obj, path, pickle_module=module_like)


def _args(**over: Any) -> argparse.Namespace:
    common = _load_pickle_file(os.path.join(DATA, "core_v0.16.1.common.pt"), False)
    return argparse.Namespace(**{**common["args"], "params_dtype": torch.float32, "exit_signal": signal.SIGTERM,
                                 **over})


@pytest.mark.parametrize("global_name", ["megatron.core.transformer.enums.AttnMaskType",
                                         "megatron.training.config.TrainingConfig", "builtins.eval"])
def test_args_with_a_class_not_allowed_is_refused_by_name(megatron_bridge_dir: tuple[str, str], tmp_path: Any,
                                                          cli: Any, global_name: str) -> None:
    _, mb = megatron_bridge_dir
    path = str(tmp_path / "common.pt")
    _save_naming({"args": _args(attention_mask_type=_Foreign.two), "iteration": 100}, path, global_name)
    mlm = megatron_lm_dir(mb, str(tmp_path / "mlm"), path)
    code, _, err = cli("export", mlm, "-o", str(tmp_path / "never"))
    assert code == 2 and f"refuses to load global '{global_name}'" in err, err
    assert len(err.strip().splitlines()) == 1 and "--trust-pickle" in err
    assert not os.path.exists(tmp_path / "never")
    with pytest.raises(UnsafePickleError, match=global_name):
        _load_pickle_file(path, False)


def test_admitted_enums_are_inert(tmp_path: Any) -> None:
    """An admitted enum takes one scalar and nothing else; a value whose name differs
    between releases stays a number; a non-GPT model type is refused by name."""
    path = str(tmp_path / "c.pt")
    _save_naming({"args": _args(model_type=_Foreign.two)}, path, "megatron.core.enums.ModelType")
    args = _load_pickle_file(path, False)["args"]
    assert args["model_type"] == "ModelType(2)"  # encoder_and_decoder ≤ 0.13, retro_encoder 0.14-0.15
    with pytest.raises(UnsupportedError, match=r"model_type=ModelType\(2\) is not a decoder-only GPT model"):
        args_to_nemo(args, "x")
    from nemo_convert.errors import InputError
    from nemo_convert.tensors.safe_unpickle import safe_load_pickle_bytes

    attn = b"cmegatron.core.transformer.enums\nAttnBackend\n"
    assert safe_load_pickle_bytes(attn + b"(K\x02tR.") == "AttnBackend.fused"
    with pytest.raises(UnsafePickleError, match="os.system"):
        safe_load_pickle_bytes(attn + b"(cos\nsystem\nK\x01tR.")
    with pytest.raises(InputError, match="AttnBackend from unexpected arguments"):
        safe_load_pickle_bytes(attn + b"(](K\x01etR.")
    with pytest.raises(InputError, match="sets state on an enum member"):
        safe_load_pickle_bytes(attn + b"(K\x02tR}b.")
