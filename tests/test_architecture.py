"""The import graph of ``nemo_convert`` keeps the shape docs/architecture.md describes.

Every module under ``nemo_convert/`` is parsed (never imported) and its imports of our own
modules collected:

* **no cycles** among the module-level imports (those in a module's body, including
  ``if TYPE_CHECKING:`` blocks: a type that runs both ways is a design knot too);
* **layers**: a module imports only modules of its own layer or a lower one (``LAYERS``);
* **no PEP 562** ``def __getattr__`` at module level (lazy re-exports hide a cycle);
* **no function-local imports** of our modules, except in ``cli/``, where each defers
  loading torch and the converters until a command runs (``nemo-convert --help`` stays
  fast) and says so with a ``# lazy:`` comment on its line; ``ALLOWED_LOCAL`` lists any
  other, with its reason.

Run ``python tests/test_architecture.py [REPO]`` to print every violation in a checkout.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "nemo_convert"

#: Lowest first. A module's layer is that of the longest prefix listed (a package, or a
#: module named on its own). Packages in one layer may import each other (without cycles).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the typed model spec (what a model computes, read once) sits with the base: every layer reads it
    ("base", ("nemo_convert.errors", "nemo_convert.dtypes", "nemo_convert.crc", "nemo_convert.hf_config",
              "nemo_convert.spec")),
    ("tensors", ("nemo_convert.tensors",)),
    # what to compute (rules, planner, math), tokenizer files, quantization math: no file formats
    ("mapping", ("nemo_convert.mapping", "nemo_convert.tokenizers", "nemo_convert.quant")),
    # how a tensor is split, and where it lives in a TP × PP layout
    ("sharding", ("nemo_convert.sharding",)),
    # how it is stored: readers of sharded layouts merge slices with sharding/
    ("formats", ("nemo_convert.formats",)),
    # the records, hooks and registry, the family bases, the built-in sharding plugin
    ("plugins", ("nemo_convert", "nemo_convert.plugins", "nemo_convert.families", "nemo_convert.sharding.builtin")),
    # running a plan: the engine, devices, several processes
    ("engine", ("nemo_convert.engine", "nemo_convert.compute", "nemo_convert.workers")),
    ("convert", ("nemo_convert.convert",)),
    # beside the conversions, built on them
    # (trtllm_target: the registration of qnemo's output target, light: loaded by every command)
    ("beside convert", ("nemo_convert.verify", "nemo_convert.qnemo", "nemo_convert.examples",
                        "nemo_convert.trtllm_target")),
    ("api", ("nemo_convert.api",)),
    ("cli", ("nemo_convert.cli", "nemo_convert.__main__")),
)

#: (importing module, imported module) → why a function-local import outside cli/ is needed.
ALLOWED_LOCAL: dict[tuple[str, str], str] = {
    ("nemo_convert.convert.targets", "nemo_convert.convert.target_writers"):
        "the built-in targets' entry-point module is loaded by every command (--help included, "
        "tests/test_startup.py); its writers load torch only when a conversion writes",
    ("nemo_convert.trtllm_target", "nemo_convert.qnemo.target_writer"):
        "the trtllm target's entry-point module is loaded by every command (--help included); its "
        "writer (calibration, quantization) loads torch only when quantize writes",
}

LAZY_MARK = "# lazy:"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module of ours
    line: int
    local: bool  # inside a function
    text: str  # the statement's last source line


def find_modules(root: str = ROOT) -> dict[str, str]:
    """Dotted module name → file, for every ``.py`` under ``root/nemo_convert``."""
    out: dict[str, str] = {}
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _resolve(node: ast.ImportFrom | ast.Import, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ours a statement imports: ``from P import n`` names ``P.n`` where that
    is a module, else ``P``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    targets = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        if sub in known:
            targets.append(sub)
        elif base in known:
            targets.append(base)
    return sorted(set(targets))


def collect_imports(modules: dict[str, str]) -> list[Import]:
    known = set(modules)
    found: list[Import] = []
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            src = f.read()
        lines = src.splitlines()
        is_package = path.endswith("__init__.py")

        def visit(node: ast.AST, local: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for t in _resolve(child, name, is_package, known):
                        if t != name:
                            end = child.end_lineno or child.lineno
                            found.append(Import(name, t, child.lineno, local, lines[end - 1]))
                visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(src, path), False)
    return found


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    return rank


def cycles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected components (more than one module) of the module-level graph."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.local:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


def layer_violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        a, b = layer_of(imp.source), layer_of(imp.target)
        if b > a:
            out.append(f"{imp.source}:{imp.line} imports {imp.target} ({LAYERS[a][0]} → {LAYERS[b][0]})")
    return out


def unlisted(modules: dict[str, str]) -> list[str]:
    return [m for m in modules if layer_of(m) < 0]


def module_getattrs(modules: dict[str, str]) -> list[str]:
    out = []
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("__getattr__", "__dir__"):
                out.append(f"{name}:{node.lineno} defines a module-level {node.name}")
    return out


def local_import_violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        if not imp.local:
            continue
        if layer_of(imp.source) == len(LAYERS) - 1:  # cli/
            if LAZY_MARK not in imp.text:
                out.append(f"{imp.source}:{imp.line} imports {imp.target} in a function without a "
                           f"'{LAZY_MARK} …' comment saying why")
        elif (imp.source, imp.target) not in ALLOWED_LOCAL:
            out.append(f"{imp.source}:{imp.line} imports {imp.target} in a function")
    return out


def report(root: str = ROOT) -> list[str]:
    modules = find_modules(root)
    imports = collect_imports(modules)
    problems = [f"cycle: {' ↔ '.join(c)}" for c in cycles(imports)]
    problems += [f"{m}: in no layer of LAYERS" for m in unlisted(modules)]
    problems += layer_violations(imports)
    problems += module_getattrs(modules)
    problems += local_import_violations(imports)
    return problems


# --- the tests ---------------------------------------------------------------------------

MODULES = find_modules()
IMPORTS = collect_imports(MODULES)


def test_the_graph_is_read() -> None:
    assert len(MODULES) > 100
    assert any(i.source == "nemo_convert.engine" and i.target == "nemo_convert.mapping.planner" for i in IMPORTS)
    assert any(i.local for i in IMPORTS)  # cli/'s deferred imports


def test_no_import_cycles() -> None:
    assert cycles(IMPORTS) == []


def test_every_module_has_a_layer() -> None:
    assert unlisted(MODULES) == []


def test_imports_point_down_the_layers() -> None:
    assert layer_violations(IMPORTS) == []


def test_no_module_level_getattr() -> None:
    assert module_getattrs(MODULES) == []


def test_function_local_imports_only_in_cli_and_marked() -> None:
    assert local_import_violations(IMPORTS) == []


def test_allowed_local_imports_are_still_there() -> None:
    local = {(i.source, i.target) for i in IMPORTS if i.local}
    assert [k for k in ALLOWED_LOCAL if k not in local] == []


def test_the_checks_catch_what_they_should() -> None:
    fake = [Import("nemo_convert.formats.x", "nemo_convert.engine", 1, False, ""),
            Import("nemo_convert.engine", "nemo_convert.formats.x", 2, False, ""),
            Import("nemo_convert.mapping.y", "nemo_convert.errors", 3, True, ""),
            Import("nemo_convert.cli.z", "nemo_convert.api", 4, True, "    from nemo_convert import api")]
    assert cycles(fake) == [["nemo_convert.engine", "nemo_convert.formats.x"]]
    assert len(layer_violations(fake)) == 1 and "formats → engine" in layer_violations(fake)[0]
    assert len(local_import_violations(fake)) == 2


if __name__ == "__main__":
    found = report(os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(found) or "no problems")
    sys.exit(1 if found else 0)
