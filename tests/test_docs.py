"""The documentation matches the code (fast, but for the examples that run: ``slow``).

* every command and subcommand of ``build_parser()`` has a section in ``docs/cli.md``, and
  the option tables there are exactly what the parsers say (they are generated; rewrite
  them with ``python tests/test_docs.py --write-cli-tables``);
* every name in ``nemo_convert.api.__all__`` appears in ``docs/api.md``;
* every hook specification appears in ``docs/plugins.md``;
* every relative link in ``README.md``, ``CONTRIBUTING.md`` and ``docs/**/*.md`` points to
  an existing file;
* every Python code block marked `` ```python runnable`` in ``docs/plugins.md`` and
  ``docs/api.md`` compiles;
* a code block placed after ``<!-- file: PATH -->`` is a verbatim copy of that file (the
  plugin example in ``docs/plugins.md``);
* docs/plugins.md says where every public name a plugin uses is imported from, and it is;
* every signature ``api_function(…) -> …`` the docs show names the function's parameters;
  README's and the index's import lists name every in-tree family; no page cites a file
  outside the repository;
* every fenced block parses, and (``slow``) every example of every page runs and prints
  what the page shows (the conventions: the comment above ``DOC_PAGES``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
CLI_DOC = os.path.join(DOCS, "cli.md")
API_DOC = os.path.join(DOCS, "api.md")
PLUGINS_DOC = os.path.join(DOCS, "plugins.md")

TABLE_START = re.compile(r"^<!-- options: (?P<cmd>[a-z][a-z -]*) -->$")
TABLE_END = "<!-- end options -->"


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# -- the parsers ---------------------------------------------------------------------------
def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def cli_commands() -> dict[str, argparse.ArgumentParser]:
    """``{"import": parser, …, "tokenizer add-tokens": parser}``: every command that runs."""
    from nemo_convert.cli.main import build_parser

    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        sub = _subparsers(parser)
        if sub is None:
            out[path] = parser
            return
        for name, child in sub.choices.items():
            walk(child, f"{path} {name}".strip())

    walk(build_parser(), "")
    return out


def command_groups() -> list[str]:
    """Commands that only hold subcommands (``tokenizer``)."""
    from nemo_convert.cli.main import build_parser

    groups = []
    sub = _subparsers(build_parser())
    assert sub is not None
    for name, child in sub.choices.items():
        if _subparsers(child) is not None:
            groups.append(name)
    return groups


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def option_table(parser: argparse.ArgumentParser) -> str:
    """The Markdown table of one command's arguments, straight from its parser."""
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        if a.option_strings:
            flags = ", ".join(f"`{s}`" for s in a.option_strings)
            if a.nargs != 0:
                meta = a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else a.dest.upper())
                meta = f"{meta} …" if a.nargs in ("+", "*") else meta
                flags += f" `{meta}`"
        else:
            flags = f"`{a.metavar or a.dest}`"
        if a.nargs != 0 and a.choices and a.metavar:
            flags += " (" + ", ".join(f"`{c}`" for c in a.choices) + ")"
        default = ""
        if a.required and a.option_strings:
            default = "required"
        elif not a.option_strings:
            default = "required" if a.nargs not in ("?", "*") else ""
        elif a.nargs != 0 and not (a.default is None or a.default is False or a.default == []
                                   or a.default == argparse.SUPPRESS):
            default = f"`{a.default}`"
        if isinstance(a, argparse._AppendAction):
            default = (default + ", " if default and default != "`[]`" else "") + "repeatable"
        help_text = (a.help or "") % {"default": a.default} if a.help and "%(" in a.help else (a.help or "")
        rows.append(f"| {flags} | {default} | {_cell(help_text)} |")
    return "\n".join(rows)


def generated_tables() -> dict[str, str]:
    return {cmd: option_table(p) for cmd, p in cli_commands().items()}


def documented_tables(text: str) -> dict[str, str]:
    """The option tables between ``<!-- options: CMD -->`` and ``<!-- end options -->``."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = TABLE_START.match(lines[i].strip())
        if m:
            j = i + 1
            while j < len(lines) and lines[j].strip() != TABLE_END:
                j += 1
            out[m["cmd"]] = "\n".join(lines[i + 1:j]).strip()
            i = j
        i += 1
    return out


def write_cli_tables(path: str = CLI_DOC) -> None:
    """Replace every generated table in ``docs/cli.md`` with the parsers' current one."""
    tables = generated_tables()
    lines = _read(path).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = TABLE_START.match(lines[i].strip())
        if not m:
            out.append(lines[i])
            i += 1
            continue
        out += [lines[i], tables[m["cmd"]]]
        while i < len(lines) and lines[i].strip() != TABLE_END:
            i += 1
        out.append(TABLE_END)
        i += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


# -- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("command", sorted(cli_commands()) + command_groups())
def test_every_command_is_documented(command):
    text = _read(CLI_DOC)
    assert re.search(rf"^#+ .*`nemo-convert {re.escape(command)}`", text, re.M), \
        f"docs/cli.md has no section for `nemo-convert {command}`"


@pytest.mark.parametrize("command", sorted(cli_commands()))
def test_option_tables_match_the_parsers(command):
    documented = documented_tables(_read(CLI_DOC))
    assert command in documented, f"docs/cli.md has no generated option table for {command!r}"
    assert documented[command] == generated_tables()[command], (
        f"the option table of {command!r} in docs/cli.md is stale; run "
        "`python tests/test_docs.py --write-cli-tables`")


def test_no_table_for_a_command_that_does_not_exist():
    assert set(documented_tables(_read(CLI_DOC))) <= set(cli_commands())


def _api_names() -> list[str]:
    from nemo_convert import api

    return sorted(api.__all__)


@pytest.mark.parametrize("name", _api_names())
def test_every_api_name_is_documented(name):
    assert re.search(rf"\b{re.escape(name)}\b", _read(API_DOC)), f"docs/api.md does not mention {name}"


def _hookspecs() -> list[str]:
    from nemo_convert.plugins import hookspecs

    return sorted(n for n in dir(hookspecs) if n.startswith("nemo_convert_")
                  and callable(getattr(hookspecs, n)))


def test_there_are_hookspecs():
    assert len(_hookspecs()) >= 3


@pytest.mark.parametrize("name", _hookspecs())
def test_every_hookspec_is_documented(name):
    text = _read(PLUGINS_DOC)
    assert re.search(rf"\b{name}\b", text), f"docs/plugins.md does not mention {name}"
    assert re.search(rf"def {name}\(", text), f"docs/plugins.md does not show the signature of {name}"


def _markdown_files() -> list[str]:
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md")]
    files += sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    return [f for f in files if os.path.isfile(f)]


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _links(path: str) -> list[str]:
    """Every link target of a Markdown file, outside code."""
    text = FENCE.sub("", _read(path))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [m.group(1) or m.group(2) for m in LINK.finditer(text)]


def _relative_links(path: str) -> list[str]:
    return [t.split("#", 1)[0] for t in _links(path)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def _anchors(path: str) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", _read(path)).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_markdown_files_exist():
    names = {os.path.relpath(f, ROOT) for f in _markdown_files()}
    for want in ("README.md", "CONTRIBUTING.md", "docs/index.md", "docs/quickstart.md", "docs/cli.md",
                 "docs/api.md", "docs/formats.md", "docs/plugins.md", "docs/architecture.md"):
        assert want in names, f"{want} is missing"


@pytest.mark.parametrize("doc", [os.path.relpath(f, ROOT) for f in _markdown_files()])
def test_relative_links_resolve(doc):
    path = os.path.join(ROOT, doc)
    broken = [t for t in _relative_links(path)
              if t and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), t)))]
    assert not broken, f"{doc} links to missing files: {', '.join(broken)}"


@pytest.mark.parametrize("doc", [os.path.relpath(f, ROOT) for f in _markdown_files()])
def test_anchors_resolve(doc):
    path = os.path.join(ROOT, doc)
    broken = []
    for t in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) or "#" not in t:
            continue
        file, anchor = t.split("#", 1)
        target = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if target.endswith(".md") and os.path.isfile(target) and anchor not in _anchors(target):
            broken.append(t)
    assert not broken, f"{doc} links to missing headings: {', '.join(broken)}"


RUNNABLE = re.compile(r"^```python runnable[^\n]*\n(.*?)^```", re.M | re.S)


def _runnable_blocks() -> list[tuple[str, int, str]]:
    out = []
    for doc in (API_DOC, PLUGINS_DOC):
        if not os.path.isfile(doc):
            continue  # test_markdown_files_exist reports it
        text = _read(doc)
        for m in RUNNABLE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((os.path.relpath(doc, ROOT), line, m.group(1)))
    return out


def test_there_are_runnable_blocks():
    docs = {d for d, _, _ in _runnable_blocks()}
    assert docs == {"docs/api.md", "docs/plugins.md"}


@pytest.mark.parametrize("doc,line,code", _runnable_blocks(), ids=lambda v: str(v)[:40])
def test_runnable_blocks_compile(doc, line, code):
    compile(code, f"{doc}:{line}", "exec")


VERBATIM = re.compile(r"^<!-- file: (?P<path>\S+) -->\n```[^\n]*\n(?P<body>.*?)^```", re.M | re.S)


def _verbatim_files() -> list[tuple[str, str, str]]:
    out = []
    for doc in _markdown_files():
        for m in VERBATIM.finditer(_read(doc)):
            out.append((os.path.relpath(doc, ROOT), m["path"], m["body"]))
    return out


def test_plugin_example_is_shown_verbatim():
    shown = {path for _, path, _ in _verbatim_files()}
    assert {"tests/plugin_example/pyproject.toml",
            "tests/plugin_example/nemo_convert_toyfamily/__init__.py"} <= shown


@pytest.mark.parametrize("doc,path,body", _verbatim_files(), ids=lambda v: str(v)[:60])
def test_verbatim_files_match(doc, path, body):
    """A block after ``<!-- file: PATH -->`` is the file PATH, exactly."""
    assert os.path.isfile(os.path.join(ROOT, path)), f"{doc} shows {path}, which does not exist"
    assert body == _read(os.path.join(ROOT, path)), \
        f"{doc}: the copy of {path} differs from the file; paste the file again"


def _public_names() -> list[tuple[str, str]]:
    """``(module, name)`` of every name in docs/plugins.md's "Where the names live" table."""
    text = _read(PLUGINS_DOC)
    section = text.split("## Where the names live", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in re.findall(r"^\| `([\w.]+)` \| (.*) \|$", section, re.M):
        out += [(row[0], name) for name in re.findall(r"`(\w+)`", row[1])]
    return out


def test_plugins_md_says_where_every_name_is_imported_from():
    """Issue 20, item 8: docs/plugins.md names the module of every public name a plugin uses,
    and each is importable from there."""
    import importlib

    names = _public_names()
    for needed in ("ConfigTable", "Field", "table_translation", "refuse_unknown_keys", "hookimpl", "ModelFamily",
                   "Rename", "FuseQKV", "gpt_family", "GPT_CONFIG"):
        assert needed in {n for _, n in names}, f"docs/plugins.md does not say where {needed} comes from"
    missing = [f"{m}.{n}" for m, n in names if not hasattr(importlib.import_module(m), n)]
    assert not missing, f"not importable as docs/plugins.md says: {', '.join(missing)}"


# -- stale facts (issue 20, item 10) ---------------------------------------------------------
SIGNATURE = re.compile(r"\b(?P<name>[a-z_]+)\((?P<params>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*->")


def _documented_signatures() -> list[tuple[str, str, list[str]]]:
    """``(doc, function, parameter names)`` of every ``name(…) -> …`` the docs show for a
    function of ``nemo_convert.api``."""
    from nemo_convert import api

    out = []
    for doc in _markdown_files():
        if doc == PLUGINS_DOC:  # its signatures are the records' callables (add_tokens(src, dst, …))
            continue
        text = re.sub(r"`\s*\n\s*", " ", _read(doc)).replace("\n", " ")
        for m in SIGNATURE.finditer(text):
            if m["name"] not in api.__all__ or not callable(getattr(api, m["name"])):
                continue
            depth, part, parts = 0, "", []
            for ch in m["params"]:
                depth += ch in "([{"
                depth -= ch in ")]}"
                if ch == "," and depth == 0:
                    parts.append(part)
                    part = ""
                else:
                    part += ch
            parts.append(part)
            names = [re.split(r"[=:]", p.strip())[0].strip().lstrip("*") for p in parts]
            out.append((os.path.relpath(doc, ROOT), m["name"], [n for n in names if n and n not in ("*", "/")]))
    return out


def test_documented_signatures_are_the_real_ones():
    """A signature shown in the docs names every parameter of the function, in order
    (from-ckpt.md's once lacked ``to=``)."""
    import inspect

    from nemo_convert import api

    shown = _documented_signatures()
    assert {"import_hf", "export_hf", "reshard", "from_ckpt"} <= {f for _, f, _ in shown}
    wrong = []
    for doc, name, params in shown:
        real = [p for p in inspect.signature(getattr(api, name)).parameters]
        if params != real:
            wrong.append(f"{doc}: {name}({', '.join(params)}) but the function takes ({', '.join(real)})")
    assert not wrong, "\n".join(wrong)


def _import_list(doc: str) -> str:
    m = re.search(r"^[-*] \*\*Import\*\* (.*?)(?=^\S|^[-*] )", _read(os.path.join(ROOT, doc)), re.M | re.S)
    assert m, f"{doc} has no **Import** bullet"
    return m.group(1)


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_the_import_list_names_every_family(doc):
    """README's and the index's list of what imports names every in-tree family (by the first
    word of its description: "Qwen2-MoE / Qwen1.5-MoE (…)" is Qwen2-MoE)."""
    from nemo_convert.plugins.manager import get_registry

    listed = _import_list(doc)
    ours = [p.record for p in get_registry().families.values() if p.distribution == "nemo-convert"]
    assert len(ours) >= 13
    missing = [f.name for f in ours if not re.search(rf"(?<![\w-]){re.escape(f.description.split()[0].rstrip(',;:'))}(?![\w-])", listed)]
    assert not missing, f"{doc}'s Import list does not name: {', '.join(missing)}"


@pytest.mark.parametrize("doc", [os.path.relpath(f, ROOT) for f in _markdown_files()])
def test_cited_files_are_in_the_repository(doc):
    """A source the docs cite by an absolute path must be part of the checkout (CONTRIBUTING
    once cited a fact sheet outside it, ``/work/shared/reference/families.md``)."""
    text = _read(os.path.join(ROOT, doc))
    cited = re.findall(r"`(/(?:work|home|root|Users|mnt)/[^`\s]*)`", text)
    assert not cited, f"{doc} cites files outside the repository: {', '.join(cited)}"


# -- every fenced example runs (issue 20, item 10) ---------------------------------------------
#
# Every fenced block of README.md, CONTRIBUTING.md and docs/**/*.md is parsed here (fast), and
# every page's examples run in order in a folder of their own (``slow``):
#
# * ```` ```console ````: each ``$ `` line is a command (continued while its quotes are open or
#   its line ends with ``\``), run in one bash per block; the lines after it, up to the next
#   ``$ ``, are what it prints (stdout and stderr together). Where the page shows output, it
#   must match, whitespace aside (alignment, wrapping), with ``…`` standing for any text (any
#   lines, on a line of its own). Where it shows none, the command must exit 0.
# * ```` ```bash ```` / ```` ```sh ````: the block runs as one bash script and must exit 0.
# * ```` ```python ````: the block runs as a script (``python -``); the comments attached to a
#   ``print`` — on its line, or the comment lines right after it — are its expected output,
#   compared with what the block prints as above. A block whose first line is ``# NAME.py``
#   is that file: it is written into the folder (for a later ``$ python NAME.py``), not run.
# * json, yaml and toml blocks must parse; text blocks are text.
#
# HTML comments, invisible on the rendered page, steer it: ``<!-- not run: REASON -->`` right
# before a block keeps it from running (it is still parsed); ``<!-- setup: SHELL -->`` runs
# SHELL at that point of the page (``$DOCS_REPO`` is the checkout) to make what the examples
# take for granted (a tiny model under the name they use); ``<!-- env: NAME=VALUE -->`` sets
# a variable for the rest of the page. A block after ``<!-- file: PATH -->`` is a copy of a
# file of the checkout (above) and is not run either.

DOC_PAGES = [os.path.relpath(f, ROOT) for f in _markdown_files()]
DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<kind>not run|setup|env|file):\s*(?P<arg>.*?)\s*-->\s*$")
OPEN_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)[^`]*$")
RUN_LANGS = ("console", "bash", "sh", "shell", "python")
ELLIPSIS = "…"


class Block:
    def __init__(self, doc: str, line: int, lang: str, body: str, not_run: str | None, file: str | None) -> None:
        self.doc, self.line, self.lang, self.body, self.not_run, self.file = doc, line, lang, body, not_run, file

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def __repr__(self) -> str:
        return f"<{self.lang} block at {self.where}>"


def page_events(doc: str) -> list[Block | str | tuple[str, str]]:
    """The page's fenced blocks, ``setup`` commands and ``env`` settings (``(name, value)``),
    in order."""
    lines = _read(os.path.join(ROOT, doc)).splitlines()
    events: list[Block | str | tuple[str, str]] = []
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        d = DIRECTIVE.match(lines[i])
        m = OPEN_FENCE.match(lines[i])
        if d:
            if d["kind"] == "setup":
                events.append(d["arg"])
            elif d["kind"] == "env":
                name, _, value = d["arg"].partition("=")
                events.append((name.strip(), value.strip()))
            else:
                pending[d["kind"]] = d["arg"]
        elif m:
            indent, fence = m["indent"], m["fence"]
            body, j = [], i + 1
            while j < len(lines) and lines[j].strip() != fence:
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            events.append(Block(doc, i + 1, m["info"].lower(), "\n".join(body) + "\n", pending.get("not run"),
                                pending.get("file")))
            pending = {}
            i = j
        elif lines[i].strip():
            pending = {}  # a directive is for the block right after it
        i += 1
    return events


def page_blocks(doc: str) -> list[Block]:
    return [e for e in page_events(doc) if isinstance(e, Block)]


def console_commands(body: str) -> list[tuple[str, list[str]]]:
    """``(command, shown output lines)`` of a console block."""
    import shlex

    out: list[tuple[str, list[str]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if out:
                out[-1][1].append(lines[i])
            elif lines[i].strip():
                raise ValueError(f"output before the first command: {lines[i]!r}")
            i += 1
            continue
        cmd = lines[i][2:]
        while True:
            try:
                complete = not cmd.endswith("\\")
                shlex.split(cmd, comments=True)
            except ValueError:  # an open quote: the command goes on
                complete = False
            if complete or i + 1 >= len(lines):
                break
            i += 1
            cmd += "\n" + lines[i]
        out.append((cmd, []))
        i += 1
    return out


def shown_output(code: str) -> list[str]:
    """The expected output a python block shows: the comments attached to its ``print`` calls."""
    out: list[str] = []
    attached = False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if attached:
                out.append(stripped[1:])
            continue
        attached = False
        m = re.match(r"^\s*print\(.*\)\s+#(?P<c>.*)$", line)
        if m:
            out.append(m["c"])
            attached = True
        elif re.match(r"^\s*print\(", line):
            attached = True
    return out


def matches(shown: list[str], actual: str) -> bool:
    """Does ``actual`` read as ``shown``? Whitespace is not compared (line breaks, alignment,
    indentation: a table as wide as the terminal, a wrapped list), ``…`` stands for any text."""
    want = "".join("".join(shown).split())
    got = "".join(actual.split())
    pattern = ".*?".join(re.escape(part) for part in want.split(ELLIPSIS))
    return re.fullmatch(pattern, got, re.S) is not None


def _parse_block(block: Block) -> None:
    import json as _json

    body = block.body
    if block.lang == "python":
        compile(body, block.where, "exec")
    elif block.lang in ("bash", "sh", "shell"):
        res = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True)
        assert res.returncode == 0, f"{block.where}: {res.stderr}"
    elif block.lang == "console":
        cmds = console_commands(body)
        assert cmds, f"{block.where}: a console block without a $ command"
        for cmd, _ in cmds:
            res = subprocess.run(["bash", "-n", "-c", cmd], text=True, capture_output=True)
            assert res.returncode == 0, f"{block.where}: {cmd!r}: {res.stderr}"
    elif block.lang == "json" and ELLIPSIS not in body and "..." not in body:
        _json.loads(body)
    elif block.lang == "yaml" and ELLIPSIS not in body:
        import yaml

        yaml.safe_load(body)
    elif block.lang == "toml":
        import tomllib

        tomllib.loads(body)


@pytest.mark.parametrize("doc", DOC_PAGES)
def test_every_block_parses(doc):
    """The fast part: every block compiles or parses, every directive is understood."""
    for block in page_blocks(doc):
        _parse_block(block)
        if block.not_run is not None:
            assert block.not_run, f"{block.where}: 'not run' needs its reason"


def test_the_doc_conventions_work():
    cmds = console_commands("$ a 'x\ny'\nout 1\n$ b \\\n  c\n…\n")
    assert cmds == [("a 'x\ny'", ["out 1"]), ("b \\\n  c", ["…"])]
    assert shown_output("x = 1  # not output\nprint(x)  # 1\nfor i in r:\n    print(i)\n# 2\n#  3\ny = 2\n") \
        == [" 1", " 2", "  3"]
    assert matches(["wrote x.nemo: 15 tensors in … s", "…", "done"], "wrote x.nemo:  15 tensors in 0.1 s\na\nb\ndone\n")
    assert not matches(["15 tensors"], "16 tensors")
    assert matches(['{"a": 1,', ' "b": [2]}'], '{\n  "a": 1,\n  "b": [\n    2\n  ]\n}')
    assert matches([], "")
    events = page_events("docs/plugins.md")
    assert any(isinstance(e, Block) and e.file for e in events)


_MARK = "@@doc-test: exit@@"


def _page_env(work: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update({"PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""), "COLUMNS": "200",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1", "DOCS_REPO": ROOT,
                "HF_HOME": os.path.join(work, ".hf-home"), "TQDM_DISABLE": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    return env


def _run(cmd: list[str], work: str, env: dict[str, str], stdin: str | None = None) -> tuple[int, str]:
    res = subprocess.run(cmd, cwd=work, env=env, input=stdin, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=900)
    return res.returncode, res.stdout


def run_block(block: Block, work: str, env: dict[str, str]) -> None:
    """Run one block in ``work``; an AssertionError names the block and what differed."""
    if block.lang == "console":
        cmds = console_commands(block.body)
        # one shell for the block, as in a terminal (``$?``, ``cd``); a marker after each command
        script = "".join(f"{cmd}\n__rc=$?; printf '\\n{_MARK} %d\\n' $__rc; (exit $__rc)\n" for cmd, _ in cmds)
        _, whole = _run(["bash", "-c", script], work, env)
        parts = re.split(rf"\n?{_MARK} (-?\d+)\n", whole)
        results = [(int(parts[i + 1]), parts[i]) for i in range(0, len(parts) - 1, 2)]
        assert len(results) == len(cmds), f"{block.where}: the shell stopped early:\n{whole}"
        for (cmd, shown), (code, out) in zip(cmds, results):
            if any(s.strip() for s in shown):
                assert matches(shown, out), (f"{block.where}: `{cmd}` printed\n{out}\nwhere the page shows\n"
                                             + "\n".join(shown))
            else:
                assert code == 0, f"{block.where}: `{cmd}` exited {code}:\n{out}"
    elif block.lang in ("bash", "sh", "shell"):
        code, out = _run(["bash", "-e", "-c", block.body], work, env)
        assert code == 0, f"{block.where}: exited {code}:\n{out}"
    elif block.lang == "python":
        first = block.body.splitlines()[0] if block.body.strip() else ""
        name = re.match(r"^#\s*(\S+\.py)\b", first)
        if name:
            with open(os.path.join(work, name[1]), "w", encoding="utf-8") as f:
                f.write(block.body)
            return
        res = subprocess.run([sys.executable, "-"], cwd=work, env=env, input=block.body, text=True,
                             capture_output=True, timeout=900)
        assert res.returncode == 0, f"{block.where}: exited {res.returncode}:\n{res.stdout}{res.stderr}"
        shown = shown_output(block.body)  # what it prints: stdout (warnings and progress go to stderr)
        if shown:
            assert matches(shown, res.stdout), \
                f"{block.where}: printed\n{res.stdout}\nwhere the page shows\n" + "\n".join(shown)


def _runnable_pages() -> list[str]:
    return [d for d in DOC_PAGES
            if any(b.lang in RUN_LANGS and b.not_run is None and b.file is None for b in page_blocks(d))]


@pytest.mark.slow
@pytest.mark.parametrize("doc", _runnable_pages())
def test_page_examples_run(doc, tmp_path):
    """Every example of the page, in order, in a folder of its own."""
    work = str(tmp_path)
    env = _page_env(work)
    for event in page_events(doc):
        if isinstance(event, tuple):
            env[event[0]] = event[1]
        elif isinstance(event, str):
            code, out = _run(["bash", "-e", "-c", event], work, env)
            assert code == 0, f"{doc}: setup `{event}` exited {code}:\n{out}"
        elif event.lang in RUN_LANGS and event.not_run is None and event.file is None:
            run_block(event, work, env)



if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--write-cli-tables"]:
        write_cli_tables()
        print(f"rewrote the option tables in {os.path.relpath(CLI_DOC)}")
    elif sys.argv[1:] == ["--print-cli-tables"]:
        for cmd, table in generated_tables().items():
            print(f"<!-- options: {cmd} -->\n{table}\n{TABLE_END}\n")
    else:
        sys.exit("usage: python tests/test_docs.py --write-cli-tables | --print-cli-tables")
