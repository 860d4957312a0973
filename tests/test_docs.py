"""The documentation matches the code (fast: no conversion runs).

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
  plugin example in ``docs/plugins.md``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
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


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--write-cli-tables"]:
        write_cli_tables()
        print(f"rewrote the option tables in {os.path.relpath(CLI_DOC)}")
    elif sys.argv[1:] == ["--print-cli-tables"]:
        for cmd, table in generated_tables().items():
            print(f"<!-- options: {cmd} -->\n{table}\n{TABLE_END}\n")
    else:
        sys.exit("usage: python tests/test_docs.py --write-cli-tables | --print-cli-tables")
