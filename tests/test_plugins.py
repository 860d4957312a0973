"""The plugin system: discovery through entry points (an out-of-tree distribution built
and installed for real), conflicts, broken and disabled plugins, and documented hooks."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
import torch
from tiny_models import edit_config, hf_tensors

from nemo_convert import ModelFamily, NemoTarget, ShardingStrategy, TokenizerPatcher, api, hookimpl
from nemo_convert.errors import PluginError
from nemo_convert.plugins import hookspecs, manager
from nemo_convert.plugins.manager import (DISABLE_ENV, ENTRY_POINT_GROUP, PluginLoadWarning, build_plugin_manager,
                                          registry_with)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(HERE, "plugin_example")
TOY_DIST = "nemo-convert-toyfamily"
TOY_MODULE = "nemo_convert_toyfamily"
PLUGINS_DOC = os.path.join(ROOT, "docs", "plugins.md")


# --------------------------------------------------------------------------- helpers
def plugin(*, families=(), patchers=(), strategies=()):
    """An in-process plugin object implementing the hooks for the records given."""
    p = types.SimpleNamespace()
    if families:
        @hookimpl
        def nemo_convert_model_families():
            return list(families)
        p.nemo_convert_model_families = nemo_convert_model_families
    if patchers:
        @hookimpl
        def nemo_convert_tokenizer_patchers():
            return list(patchers)
        p.nemo_convert_tokenizer_patchers = nemo_convert_tokenizer_patchers
    if strategies:
        @hookimpl
        def nemo_convert_sharding_strategies():
            return list(strategies)
        p.nemo_convert_sharding_strategies = nemo_convert_sharding_strategies
    return p


def family(name: str, arch: str = "XForCausalLM") -> ModelFamily:
    return ModelFamily(name=name, hf_architectures=(arch,), hf_model_types=(), nemo=NemoTarget("x.Y"),
                       mapping=lambda cfg: None, config_to_nemo=dict, config_to_hf=dict)


def patcher(name: str) -> TokenizerPatcher:
    return TokenizerPatcher(name=name, detect=lambda p: False, add_tokens=lambda s, d, t, o: None)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", DISABLE_ENV)}
    env.update(extra)
    return env


def run_plugins_json(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "nemo_convert", "plugins", "--json"], env=env,
                          capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)



@pytest.fixture
def fresh_registry(monkeypatch):
    """Lets a test rebuild the process-wide registry; the old one is restored afterwards."""
    monkeypatch.setattr(manager, "_REGISTRY", manager._REGISTRY)
    yield manager
    # monkeypatch undo restores the registry object the rest of the session uses


@pytest.fixture
def cli(monkeypatch):
    """Runs ``nemo_convert.cli.main.main`` in-process; restores the signal handlers it installs."""
    from nemo_convert.cli.main import main

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield main
    for s, h in saved.items():
        signal.signal(s, h)


# --------------------------------------------------------------------------- out-of-tree plugin
@pytest.fixture(scope="module")
def toy_site(tmp_path_factory):
    """``tests/plugin_example`` built and installed with pip into a private folder."""
    base = tmp_path_factory.mktemp("toy")
    src, site = base / "src", base / "site"
    # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                           "--no-index", "--disable-pip-version-check", "--quiet", "--target", str(site),
                           str(src)], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / TOY_MODULE / "__init__.py").is_file()
    return str(site)


@pytest.fixture
def toy_installed(toy_site, monkeypatch, fresh_registry):
    """The toy distribution on ``sys.path`` and the process-wide registry rebuilt with it."""
    monkeypatch.syspath_prepend(toy_site)
    sys.modules.pop(TOY_MODULE, None)
    reg = manager.get_registry(refresh=True)
    yield reg
    sys.modules.pop(TOY_MODULE, None)


def test_example_is_not_importable_without_installing():
    # guards the test below: the plugin must come from the installed distribution
    assert TOY_MODULE not in sys.modules
    assert all(d.metadata["Name"] != TOY_DIST for d in importlib.metadata.distributions())
    assert "toy-gpt" not in manager.get_registry().families


@pytest.mark.slow  # pip install / a subprocess
def test_out_of_tree_plugin_is_discovered(toy_installed):
    reg = toy_installed
    assert "toy-gpt" in reg.families
    provided = reg.families["toy-gpt"]
    assert provided.plugin == "toyfamily"
    assert provided.distribution == TOY_DIST
    assert reg.family_for_hf_config({"architectures": ["ToyForCausalLM"]}).name == "toy-gpt"
    assert reg.family_for_hf_config({"architectures": ["LlamaForCausalLM"]}).name == "llama"
    # the module really came from the pip-installed folder
    assert os.path.dirname(os.path.dirname(sys.modules[TOY_MODULE].__file__)) == sys.path[0]
    from nemo_convert.cli.cmd_plugins import collect

    rows = {r["name"]: r for r in collect()["model_families"]}
    assert rows["toy-gpt"]["distribution"] == TOY_DIST
    assert rows["toy-gpt"]["hf_architectures"] == ["ToyForCausalLM"]


@pytest.mark.slow  # pip install / a subprocess
def test_out_of_tree_plugin_listed_by_cli(toy_site):
    data = run_plugins_json(cli_env(PYTHONPATH=toy_site))
    rows = {r["name"]: r for r in data["model_families"]}
    assert rows["toy-gpt"]["distribution"] == TOY_DIST
    assert rows["toy-gpt"]["plugin"] == "toyfamily"
    assert rows["llama"]["distribution"] == "nemo-convert"


@pytest.mark.slow  # pip install / a subprocess
def test_out_of_tree_plugin_converts_a_checkpoint(toy_installed, tiny_llama, tmp_path, cli, capsys):
    src = tiny_llama(tokenizer=False)
    edit_config(src, architectures=["ToyForCausalLM"])
    nemo, back = str(tmp_path / "toy.nemo"), str(tmp_path / "back")
    assert cli(["import", src, "-o", nemo, "--family", "toy-gpt", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["family"] == "toy-gpt"
    info = api.inspect_checkpoint(nemo)
    assert info["family"] == "toy-gpt" and info["layout"] == "dist"
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in {t["name"] for t in info["tensors"]}

    assert cli(["export", nemo, "-o", back, "--quiet"]) == 0  # family read back from the .nemo
    a, b = hf_tensors(src), hf_tensors(back)
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    with open(os.path.join(back, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["ToyForCausalLM"]
    assert cfg["num_key_value_heads"] == 2 and cfg["hidden_size"] == 64

    # detected from config.json without --family, too
    assert api.import_hf(src, str(tmp_path / "auto.nemo")).family == "toy-gpt"


def _example_module() -> types.ModuleType:
    """The example plugin's module, loaded from its file under another name (the tests above
    need it not importable by its own name unless installed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("toy_example_under_test",
                                                  os.path.join(EXAMPLE, TOY_MODULE, "__init__.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key,value,error,named", [
    ("sliding_window", 4096, "ConfigError", "sliding_window=4096"),
    ("attention_bias", True, "UnsupportedError", "attention_bias=True"),
    ("mlp_bias", True, "UnsupportedError", "mlp_bias=True"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
     "UnsupportedError", "'yarn'"),
])
def test_the_documented_example_is_strict(tiny_llama, tmp_path, key, value, error, named):
    """Issue 20, item 8: the complete example in docs/plugins.md refuses, by name, the
    config keys its model does not have — nothing is dropped silently."""
    toy = _example_module()
    reg = registry_with(("toyfamily", toy))  # with the installed plugins (the sharding strategies)
    src = tiny_llama(tokenizer=False)
    edit_config(src, architectures=["ToyForCausalLM"])
    out = str(tmp_path / "toy.nemo")
    api.import_hf(src, out, registry=reg)  # the Llama-shaped config as transformers writes it: accepted
    edit_config(src, **{key: value})
    with pytest.raises(Exception) as ei:
        api.import_hf(src, str(tmp_path / "refused.nemo"), registry=reg)
    assert type(ei.value).__name__ == error and named in str(ei.value), str(ei.value)
    assert not os.path.exists(tmp_path / "refused.nemo")


# --------------------------------------------------------------------------- conflicts
def test_two_plugins_with_one_family_name():
    a = plugin(families=[family("dup", "AForCausalLM")])
    b = plugin(families=[family("dup", "BForCausalLM")])
    with pytest.raises(PluginError) as ei:
        registry_with(("plugin-a", a), ("plugin-b", b), entry_points=False)
    msg = str(ei.value)
    assert "'dup'" in msg and "'plugin-a'" in msg and "'plugin-b'" in msg
    assert "\n" not in msg
    # different names coexist
    reg = registry_with(("plugin-a", a), ("plugin-c", plugin(families=[family("other")])), entry_points=False)
    assert set(reg.families) == {"dup", "other"}


def test_two_plugins_with_one_tokenizer_patcher_name():
    a = plugin(patchers=[patcher("spm")])
    b = plugin(patchers=[patcher("spm")])
    with pytest.raises(PluginError, match=r"spm") as ei:
        registry_with(("tok-a", a), ("tok-b", b), entry_points=False)
    assert "'tok-a'" in str(ei.value) and "'tok-b'" in str(ei.value)


def test_two_plugins_with_one_sharding_strategy_name():
    from nemo_convert.sharding.tensor import TensorParallel

    s = ShardingStrategy("tensor", "tp", TensorParallel())
    with pytest.raises(PluginError, match=r"'shard-a'.*'shard-b'"):
        registry_with(("shard-a", plugin(strategies=[s])), ("shard-b", plugin(strategies=[s])),
                      entry_points=False)


def test_conflict_with_an_installed_plugin_names_its_distribution():
    with pytest.raises(PluginError) as ei:
        registry_with(("my-llama", plugin(families=[family("llama")])))
    msg = str(ei.value)
    assert "'llama'" in msg and "'nemo-convert'" in msg and "'my-llama'" in msg
    assert DISABLE_ENV in msg  # says how to resolve it


def test_a_wrong_record_type_is_a_plugin_error():
    bad = types.SimpleNamespace()

    @hookimpl
    def nemo_convert_model_families():
        return [patcher("not-a-family")]

    bad.nemo_convert_model_families = nemo_convert_model_families
    with pytest.raises(PluginError, match=r"'bad'.*TokenizerPatcher.*ModelFamily"):
        registry_with(("bad", bad), entry_points=False)


# --------------------------------------------------------------------------- broken plugin
class _EntryPoint:
    """An entry point of a distribution named ``dist`` (what ``entry_points()`` yields)."""

    def __init__(self, name: str, value: str, dist: str) -> None:
        self.name, self.value, self.group = name, value, ENTRY_POINT_GROUP
        self.dist = types.SimpleNamespace(name=dist)

    def load(self):
        return importlib.metadata.EntryPoint(self.name, self.value, self.group).load()


@pytest.fixture
def broken_plugin_installed(tmp_path, monkeypatch):
    (tmp_path / "nemo_convert_broken_xyz.py").write_text("raise RuntimeError('kaboom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = manager.md.entry_points

    def entry_points(**kw):
        eps = list(real(**kw))
        if kw.get("group") == ENTRY_POINT_GROUP:
            eps.append(_EntryPoint("broken", "nemo_convert_broken_xyz", "nemo-convert-broken"))
        return eps

    monkeypatch.setattr(manager, "md", types.SimpleNamespace(entry_points=entry_points))
    yield
    sys.modules.pop("nemo_convert_broken_xyz", None)


def test_broken_plugin_is_skipped_with_a_warning(broken_plugin_installed, tiny_llama, tmp_path):
    with pytest.warns(PluginLoadWarning) as rec:
        reg = registry_with()
    msgs = [str(w.message) for w in rec if issubclass(w.category, PluginLoadWarning) and "broken" in str(w.message)]
    assert len(msgs) == 1
    assert "'broken'" in msgs[0] and "nemo-convert-broken" in msgs[0] and "kaboom at import" in msgs[0]
    # everything else still works
    assert "llama" in reg.families and {"tensor", "pipeline"} <= set(reg.sharding_strategies)
    rep = api.import_hf(tiny_llama(tokenizer=False), str(tmp_path / "m.nemo"), registry=reg)
    assert rep.family == "llama" and rep.tensors > 0


def test_broken_plugin_does_not_break_the_cli(broken_plugin_installed, fresh_registry, cli, capsys):
    manager._REGISTRY = None
    with pytest.warns(PluginLoadWarning, match="broken"):
        assert cli(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "llama" in {r["name"] for r in data["model_families"]}


def test_quiet_silences_the_broken_plugin_warning(broken_plugin_installed, fresh_registry, cli, recwarn):
    manager._REGISTRY = None
    assert cli(["plugins", "--json", "-q"]) == 0
    assert not [w for w in recwarn if issubclass(w.category, PluginLoadWarning)]


# --------------------------------------------------------------------------- disable list
def test_disable_list_blocks_a_plugin(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "llama")
    reg = registry_with()
    assert "llama" not in reg.families
    assert {"tensor", "pipeline"} <= set(reg.sharding_strategies)  # only llama is blocked
    with pytest.raises(PluginError, match="no installed model family"):
        reg.family_for_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    # a run-time plugin of a blocked name is refused too
    reg = registry_with(("llama", plugin(families=[family("llama")])))
    assert "llama" not in reg.families


def test_disable_list_takes_several_names(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, " sharding , llama ")
    reg = registry_with()
    assert "llama" not in reg.families and not reg.sharding_strategies
    providers = {p.plugin for table in (reg.families, reg.tokenizer_patchers) for p in table.values()}
    assert not providers & {"sharding", "llama"}


@pytest.mark.slow  # pip install / a subprocess
def test_disable_list_in_the_cli():
    data = run_plugins_json(cli_env(**{DISABLE_ENV: "llama"}))
    assert "llama" not in {r["name"] for r in data["model_families"]}
    assert {"tensor", "pipeline"} <= {r["name"] for r in data["sharding_strategies"]}


# --------------------------------------------------------------------------- hooks documented
HOOKSPECS = sorted(n for n, f in vars(hookspecs).items()
                   if callable(f) and hasattr(f, f"{hookspecs.PROJECT}_spec"))


def test_hookspecs_are_found():
    pm, _ = build_plugin_manager(entry_points=False)
    declared = sorted(n for n in dir(pm.hook) if n.startswith("nemo_convert_"))
    assert HOOKSPECS == declared
    assert len(HOOKSPECS) >= 3


def _example_block(doc: str) -> str:
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Example::")
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return textwrap.dedent("\n".join(body))


@pytest.mark.parametrize("name", HOOKSPECS)
def test_hookspec_has_a_complete_docstring(name):
    doc = getattr(hookspecs, name).__doc__ or ""
    assert doc.strip(), f"{name} has no docstring"
    assert ":return:" in doc, f"{name}: docstring lacks :return:"
    assert "Example::" in doc, f"{name}: docstring lacks an Example:: block"
    example = _example_block(doc)
    assert "@hookimpl" in example and f"def {name}(" in example, f"{name}: the example does not implement it"
    ast.parse(example)  # the example is valid Python


@pytest.mark.parametrize("name", HOOKSPECS)
def test_hookspec_is_in_the_plugin_docs(name):
    with open(PLUGINS_DOC, encoding="utf-8") as f:
        assert re.search(rf"\b{name}\b", f.read()), f"{name} is not documented in docs/plugins.md"


@pytest.mark.parametrize("name", HOOKSPECS)
def test_hook_is_implemented_by_an_installed_plugin(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginLoadWarning)
        pm, dists = build_plugin_manager()
    implementers = [pm.get_name(i.plugin) for i in getattr(pm.hook, name).get_hookimpls()]
    installed = [n for n in implementers if n in dists]  # registered through an entry point
    assert installed, f"no installed plugin implements {name}"
