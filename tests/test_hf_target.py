"""The built-in output target ``hf`` (issue 23): ``export`` writes through the one output
step, and so a training checkpoint (``from-ckpt --to hf``) or any checkpoint ``reshard``
reads (``reshard --to hf``) goes straight to a Hugging Face folder that transformers loads,
with the logits of the export path. ``import --to hf`` is refused by name."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest
import torch

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from nemo_convert.mapping.plan_view import PlanSource, is_identity, plan_view
from nemo_convert.mapping.planner import identity_plan
from nemo_convert.tensors.base import TensorInfo

HAS_LIGHTNING = importlib.util.find_spec("lightning") is not None


class DictSource:
    """A tiny in-memory :class:`~nemo_convert.tensors.base.TensorSource`."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def info(self, key: str) -> TensorInfo:
        t = self.tensors[key]
        return TensorInfo(key, tuple(t.shape), t.dtype)

    def group(self, key: str) -> str:
        return ""

    def load(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def close(self) -> None:
        pass


def test_plan_view_is_the_source_for_its_identity_plan_only() -> None:
    src = DictSource({"a": torch.ones(2), "b": torch.zeros(3, dtype=torch.bfloat16)})
    lazy = identity_plan(src, {})
    assert plan_view(lazy, src) is src and lazy.copies(src)  # known without making its tasks
    assert not lazy.copies(DictSource({"a": torch.ones(2)}))
    plan = identity_plan(src, {})
    assert [t.outputs for t in plan.tasks] == [("a",), ("b",)] and not plan.copies(src)  # handed out
    assert is_identity(plan, src) and plan_view(plan, src) is src
    # negative controls: a plan over other tensors, or one that re-types an output, is not the identity
    assert not is_identity(plan, DictSource({"a": torch.ones(2)}))
    retyped = identity_plan(src, {})
    task = retyped.tasks[0]
    task.infos = (TensorInfo(task.infos[0].name, task.infos[0].shape, torch.float16),)
    assert not is_identity(retyped, src)
    view = plan_view(retyped, src)
    assert isinstance(view, PlanSource) and view.load("a").dtype == torch.float16


def files_of(folder: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def hf_logits(folder: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for p in model.parameters():  # fresh aligned memory: the logits depend on the values only
            p.data = p.data.clone()
        return model(torch.tensor([[1, 5, 9, 2, 7, 3]])).logits


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A tiny HF Llama with a SentencePiece tokenizer, its legacy ``.nemo`` and its export."""
    from ckpt_builders import GEOM
    from tiny_models import make_tiny_llama

    base = tmp_path_factory.mktemp("dense")
    hf = make_tiny_llama(str(base / "hf"), **GEOM)
    nemo = str(base / "m.nemo")
    api.import_hf(hf, nemo, layout="legacy")
    exported = str(base / "exported")
    api.export_hf(nemo, exported)
    return {"base": base, "hf": hf, "nemo": nemo, "exported": exported}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A tiny random Mixtral (the family matrix's), its dist ``.nemo`` and its export."""
    from test_family_matrix import make_model

    base = tmp_path_factory.mktemp("moe")
    hf = make_model(str(base / "hf"), "mixtral")
    nemo = str(base / "m.nemo")
    api.import_hf(hf, nemo, layout="dist")
    exported = str(base / "exported")
    api.export_hf(nemo, exported)
    return {"base": base, "hf": hf, "nemo": nemo, "exported": exported}


@pytest.mark.slow  # tiny models built with transformers, converted and loaded back: ~10 s
@pytest.mark.parametrize("world", ["dense", "moe"])
def test_reshard_to_hf_writes_the_export(request, tmp_path, world, cli) -> None:
    w = request.getfixturevalue(world)
    out = str(tmp_path / "hf")
    code, _, err = cli("reshard", w["nemo"], "--to", "hf", "-o", out)
    assert code == 0, err
    assert files_of(out) == files_of(w["exported"])  # every file, byte for byte
    assert torch.equal(hf_logits(out), hf_logits(w["exported"]))
    assert torch.equal(hf_logits(out), hf_logits(w["hf"]))


@pytest.mark.slow  # a Lightning checkpoint saved for real (one Adam step), then converted and loaded: ~15 s
@pytest.mark.skipif(not HAS_LIGHTNING, reason="needs lightning")
@pytest.mark.parametrize("world", ["dense", "moe"])
def test_from_ckpt_to_hf_loads_with_the_export_logits(request, tmp_path, world, cli) -> None:
    from ckpt_builders import CKPT_NAME, lightning_save, nemo_config, nemo_tensors, training_config
    from tiny_models import hf_tensors

    w = request.getfixturevalue(world)
    run = tmp_path / "run"
    run.mkdir()
    tok = os.path.join(w["hf"], "tokenizer.model")
    if os.path.exists(tok):
        shutil.copy(tok, run / "tokenizer.model")
    state = {"model." + k: v for k, v in nemo_tensors(w["nemo"]).items()}
    ckpt = lightning_save(state, training_config(nemo_config(w["nemo"])), str(run / CKPT_NAME))
    out = str(tmp_path / "hf")
    missing = [] if os.path.exists(tok) else ["--allow-missing-tokenizer"]
    code, _, err = cli("from-ckpt", ckpt, "--to", "hf", "-o", out, *missing)
    assert code == 0, err
    # the path users had: the training checkpoint to a .nemo, exported
    nemo, via = str(tmp_path / "m.nemo"), str(tmp_path / "via_nemo")
    assert cli("from-ckpt", ckpt, "-o", nemo, *missing)[0] == 0
    api.export_hf(nemo, via)
    got, want = hf_tensors(out), hf_tensors(via)
    assert got.keys() == want.keys()
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    assert all(torch.equal(got[k], v) for k, v in hf_tensors(w["exported"]).items())  # the weights themselves
    with open(os.path.join(out, "config.json")) as a, open(os.path.join(via, "config.json")) as b:
        assert json.load(a) == json.load(b)
    assert torch.equal(hf_logits(out), hf_logits(via))
    # and the folder is one --overwrite replaces as an HF folder
    rep = api.from_ckpt(ckpt, out, to="hf", overwrite=True, allow_missing_tokenizer=True)
    assert rep.layout == "hf" and rep.tensors == len(want)


@pytest.mark.slow  # a tiny Llama built with transformers: ~3 s
def test_import_to_hf_is_refused_by_name(tiny_llama, tmp_path) -> None:
    out = str(tmp_path / "hf")
    with pytest.raises(UnsupportedError, match=r"import --to hf: the source is a Hugging Face folder already"):
        api.import_hf(tiny_llama(), out, to="hf")
    assert not os.path.exists(out)


def test_hf_target_refuses_a_layout_up_front(tmp_path) -> None:
    with pytest.raises(UnsupportedError, match=r"--layout dist is a \.nemo layout; --to hf writes"):
        api.reshard(str(tmp_path / "missing.nemo"), str(tmp_path / "out"), to="hf", layout="dist")
