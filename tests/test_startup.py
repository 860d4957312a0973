"""Start-up stays light: ``--help`` of every command and ``inspect`` of a ``.nemo`` (dist and
legacy layout), an HF folder and a Megatron-Core dist checkpoint import neither torch nor
transformers (issue 20, item 7; the times are measured by ``bench/bench_startup.py``, the
numbers are in ``docs/performance.md``).

* **Statically** (fast, no process started): every module reachable by module-level
  imports from the start-up roots — the CLI, the modules its commands load on those paths,
  and every plugin package the entry points name — imports none of :data:`HEAVY` at module
  level (an ``import`` inside a function, or under ``if TYPE_CHECKING:``, is fine). It names
  the offending module and the chain of imports that reaches it.
* **Dynamically** (one subprocess, ``slow``): each of those command lines runs in a fresh
  interpreter, which then reports the heavy modules in ``sys.modules``.

The rule the static check pins (CONTRIBUTING.md, "Start-up time"): a module on the
start-up path imports torch (and anything else heavy) inside the functions that compute
on tensors, never at module level.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest

from test_architecture import PACKAGE, ROOT, collect_imports, find_modules

#: What start-up must not load (numpy comes with torch and costs a tenth of it).
HEAVY = ("torch", "transformers", "safetensors.torch", "numpy")

#: Where start-up begins: the CLI modules, and what its functions load on the measured paths
#: (``main.run``: staging and workers; ``build_parser``: the registry; ``inspect``: the readers).
ROOTS = ("nemo_convert.cli.main", "nemo_convert.__main__", "nemo_convert.convert.checkpoint",
         "nemo_convert.plugins.manager", "nemo_convert.formats.io.staging", "nemo_convert.workers")


def entry_point_plugins() -> dict[str, str]:
    """``{plugin module: entry-point name}`` of ``pyproject.toml``'s ``nemo_convert`` group."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    group = text.split("[project.entry-points.nemo_convert]", 1)[1].split("\n[", 1)[0]
    return {m: n for n, m in re.findall(r'^(\w+)\s*=\s*"([\w.]+)"', group, re.M)}


def all_modules() -> dict[str, str]:
    """Our modules and the in-tree plugin packages' (``plugins/nemo_convert_*``)."""
    mods = find_modules()
    plugins = os.path.join(ROOT, "plugins")
    for pkg in sorted(os.listdir(plugins)):
        folder = os.path.join(plugins, pkg)
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            continue
        for f in sorted(os.listdir(folder)):
            if f.endswith(".py"):
                mods[pkg if f == "__init__.py" else f"{pkg}.{f[:-3]}"] = os.path.join(folder, f)
    return mods


def module_level_imports(path: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every import that runs when the module is imported: in its body,
    class bodies, ``if``/``try``/``with`` blocks — not in functions, not under ``if TYPE_CHECKING``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: list[tuple[int, str]] = []

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
                found.append((node.lineno, node.module))
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
                visit(node.body)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return found


def is_heavy(module: str) -> bool:
    return any(module == h or module.startswith(h + ".") for h in HEAVY)


def start_up_closure(mods: dict[str, str]) -> dict[str, str | None]:
    """Every module the roots reach by module-level imports → the module that imports it."""
    edges: dict[str, set[str]] = {}
    for imp in collect_imports({k: v for k, v in mods.items() if k.split(".")[0] == PACKAGE}):
        if not imp.local:
            edges.setdefault(imp.source, set()).add(imp.target)
    for name, path in mods.items():  # the plugins' imports (of ours and of each other)
        if name.split(".")[0] != PACKAGE:
            edges[name] = {m for _, m in module_level_imports(path) if m in mods}
    reached: dict[str, str | None] = {}
    todo = [(r, None) for r in (*ROOTS, *entry_point_plugins())]
    while todo:
        name, via = todo.pop()
        if name in reached or name not in mods:
            continue
        reached[name] = via
        parts = name.split(".")
        todo.extend((".".join(parts[:i]), name) for i in range(1, len(parts)))  # packages run first
        todo.extend((t, name) for t in sorted(edges.get(name, ())))
    return reached


def heavy_module_imports() -> list[str]:
    mods = all_modules()
    reached = start_up_closure(mods)
    out = []
    for name in sorted(reached):
        for line, imported in module_level_imports(mods[name]):
            if is_heavy(imported):
                chain, via = [name], reached[name]
                while via is not None:
                    chain.append(via)
                    via = reached[via]
                out.append(f"{mods[name]}:{line} imports {imported} at module level "
                           f"(reached by {' < '.join(chain)})")
    return sorted(set(out))


def test_the_start_up_closure_is_what_it_should_be() -> None:
    reached = start_up_closure(all_modules())
    # the readers, the family bases, every in-tree plugin …
    for m in ("nemo_convert.formats.nemo.nemo", "nemo_convert.formats.hf.hf", "nemo_convert.tensors.torch_zip",
              "nemo_convert.formats.dist_checkpoint.distckpt_read", "nemo_convert.formats.megatron.megatron_dir",
              "nemo_convert.families.gpt", "nemo_convert.mapping.ops", "nemo_convert_llama", "nemo_convert_clip"):
        assert m in reached, m
    # … and none of the conversions that compute on tensors
    for m in ("nemo_convert.engine", "nemo_convert.api", "nemo_convert.convert.hf_to_nemo",
              "nemo_convert.verify.core", "nemo_convert.qnemo.driver"):
        assert m not in reached, f"{m} is reached by {reached[m]}"


def test_start_up_modules_do_not_import_torch_at_module_level() -> None:
    assert heavy_module_imports() == []


def test_the_static_check_catches_a_module_level_import(tmp_path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("from typing import TYPE_CHECKING\nimport torch.nn\nif TYPE_CHECKING:\n    import numpy\n"
                   "try:\n    from transformers import AutoModel\nexcept ImportError:\n    pass\n"
                   "def f():\n    import torch\n", encoding="utf-8")
    heavy = [m for _, m in module_level_imports(str(bad)) if is_heavy(m)]
    assert heavy == ["torch.nn", "transformers.AutoModel", "transformers"]


# -- the dynamic check ----------------------------------------------------------------------
_CHILD = r"""
import contextlib, io, json, sys
from nemo_convert.cli.main import main
HEAVY = {heavy!r}
first = {{}}
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    if code not in (0, None):
        raise SystemExit(f"{{argv}} exited {{code}}")
    if argv[0] == "inspect" and argv[-1] != "--help" and "tensors" not in out.getvalue():
        raise SystemExit(f"{{argv}} printed no tensor table")
    for h in HEAVY:
        if h in sys.modules and h not in first:
            first[h] = argv
print(json.dumps(first))
"""


def _commands() -> list[list[str]]:
    from test_docs import cli_commands, command_groups

    return [[], *(c.split() for c in sorted(cli_commands())), *(c.split() for c in command_groups())]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """A tiny Llama as an HF folder, a dist and a legacy ``.nemo``, and a Megatron-Bridge
    directory (a Megatron-Core ``torch_dist`` checkpoint)."""
    from nemo_convert import api
    from nemo_convert.examples import make_tiny_llama

    work = tmp_path_factory.mktemp("startup")
    hf = make_tiny_llama(str(work / "hf"), tokenizer=False)
    out = {"hf": hf}
    for name, kw in (("dist.nemo", {}), ("legacy.nemo", {"layout": "legacy"}), ("mb", {"to": "megatron-bridge"})):
        api.import_hf(hf, str(work / name), **kw)
        out[name] = str(work / name)
    return out


@pytest.mark.slow
def test_help_and_inspect_load_no_torch(checkpoints) -> None:
    argvs = [[*c, "--help"] for c in _commands()] + [["inspect", p] for p in checkpoints.values()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", _CHILD.format(heavy=HEAVY), json.dumps(argvs)], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {}, "a heavy module was loaded by the command line"
