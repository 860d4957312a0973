"""A third party's families reach every output with no edit to nemo-convert.

``tests/plugin_outoftree`` (a distribution of its own, installed here with pip into a
private folder, found through the entry-point group like any plugin) declares a dense
family and a mixture-of-experts family on the public GPT base
(``nemo_convert_outoftree/__init__.py``). Each goes through import (dist, and legacy at
TP2 × PP2), export, reshard (TP2, and EP2 for the experts), ``--to megatron-bridge`` and
back, ``quantize`` and ``verify``: every export is the source, tensor for tensor, with the
source's logits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from tiny_models import edit_config, hf_tensors, randomize_

from nemo_convert import api
from nemo_convert.plugins import manager

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "plugin_outoftree")
MODULE = "nemo_convert_outoftree"
DIST = "nemo-convert-outoftree"

pytestmark = pytest.mark.slow  # pip install, transformers models, every output


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("oot")
    src, site = base / "src", base / "site"
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--disable-pip-version-check", "--quiet", "--target", str(site), str(src)],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(site)


@pytest.fixture
def registry(site, monkeypatch):
    """The process-wide registry rebuilt with the installed plugin (restored afterwards)."""
    monkeypatch.setattr(manager, "_REGISTRY", manager._REGISTRY)
    monkeypatch.syspath_prepend(site)
    sys.modules.pop(MODULE, None)
    reg = manager.get_registry(refresh=True)
    yield reg
    sys.modules.pop(MODULE, None)


#: family → (transformers config class, its overrides, HF class, the test's parallel layouts)
CASES = {
    "oot-dense": ("LlamaConfig", {}, "LlamaForCausalLM", "OotDenseForCausalLM", "oot_dense"),
    "oot-moe": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
                "MixtralForCausalLM", "OotMoeForCausalLM", "oot_moe"),
}
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)


def _source(folder: str, family: str) -> str:
    import transformers

    cfg_cls, over, model_cls, arch, model_type = CASES[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**{**BASE, **over}))
    randomize_(model, seed=7)
    model.save_pretrained(folder, safe_serialization=True)
    edit_config(folder, architectures=[arch], model_type=model_type)
    return folder


def _logits(folder: str, family: str) -> torch.Tensor:
    """The logits of ``folder`` run by the transformers class that computes the family. The
    class is loaded from a view of the folder whose ``config.json`` names transformers' own
    ``model_type``: transformers 5 picks its weight conversions (Mixtral's per-expert ``w1``/
    ``w3`` into fused experts) by ``model_type``, and leaves unknown ones' weights random."""
    import tempfile

    import transformers

    cfg_cls, _, model_cls, _, _ = CASES[family]
    view = tempfile.mkdtemp(prefix="oot-view-", dir=os.path.dirname(folder))
    for name in os.listdir(folder):
        if name != "config.json":
            os.symlink(os.path.join(folder, name), os.path.join(view, name))
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["model_type"] = getattr(transformers, cfg_cls).model_type
    with open(os.path.join(view, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    model = getattr(transformers, model_cls).from_pretrained(view, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 2, 7, 3]])).logits


def _same(src: str, back: str, family: str) -> None:
    a, b = hf_tensors(src), hf_tensors(back)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    with open(os.path.join(back, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert cfg["architectures"] == [CASES[family][3]]
    assert torch.equal(_logits(back, family), _logits(src, family))


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_third_party_family_reaches_every_output(registry, family, tmp_path):
    provided = registry.families[family]
    assert provided.distribution == DIST and provided.plugin == "outoftree"
    src = _source(str(tmp_path / "hf"), family)
    assert registry.family_for_hf_config(json.load(open(os.path.join(src, "config.json")))).name == family
    moe = family == "oot-moe"

    dist = str(tmp_path / "dist.nemo")
    assert api.import_hf(src, dist).family == family
    _same(src, api.export_hf(dist, str(tmp_path / "back-dist")).output, family)

    legacy = str(tmp_path / "legacy.nemo")
    api.import_hf(src, legacy, layout="legacy", parallel=api.Parallelism(2, 2))
    _same(src, api.export_hf(legacy, str(tmp_path / "back-legacy")).output, family)

    resharded = str(tmp_path / "tp2.nemo")
    api.reshard(dist, resharded, tp=2, ep=2 if moe else 1)
    _same(src, api.export_hf(resharded, str(tmp_path / "back-reshard")).output, family)

    bridge = str(tmp_path / "mb")
    api.import_hf(src, bridge, to="megatron-bridge")
    with open(os.path.join(bridge, "iter_0000000", "run_config.yaml"), encoding="utf-8") as f:
        model = yaml.safe_load(f)["model"]
    target = registry.family(family).megatron_bridge.target  # type: ignore[union-attr]
    assert model["_target_"] == target and bool(model.get("num_moe_experts")) == moe
    _same(src, api.export_hf(bridge, str(tmp_path / "back-bridge")).output, family)

    q = str(tmp_path / "q.qnemo")
    api.quantize(dist, q, algo="none", dtype="bf16")
    with open(os.path.join(q, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["architecture"] == ("MixtralForCausalLM" if moe else "LlamaForCausalLM")

    assert api.verify(src, dist).ok
