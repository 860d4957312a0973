"""Plugin-declared command-line options (``CommandOption``) and verifiers (``Verifier``)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from nemo_convert import CommandOption, ResultTable, Verifier, hookimpl
from nemo_convert.api import registry_with, verify
from nemo_convert.cli.main import _names_a_command, build_parser
from nemo_convert.cli.plugin_options import add_plugin_options, plugin_option_values
from nemo_convert.errors import InputError, PluginError
from nemo_convert.examples import make_tiny_llama

SHOUT = CommandOption("verify", "--shout-at", "a test verifier's option", kind="value", metavar="WORD")


class _Plugin:
    def __init__(self, *verifiers: Verifier) -> None:
        self._verifiers = list(verifiers)

    @hookimpl
    def nemo_convert_verifiers(self) -> list[Verifier]:
        return self._verifiers


def _echo(a: str, b: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"same_folder": a == b, **options}


def _refuse_empty(options: dict[str, Any]) -> None:
    if not options.get("shout_at"):
        raise InputError("--shout-at needs a word")


def test_a_plugin_verifier_runs_on_both_sides(tmp_path) -> None:
    src = make_tiny_llama(str(tmp_path / "hf"))
    reg = registry_with(("echo", _Plugin(Verifier("echo", (SHOUT,), _echo, _refuse_empty))))
    rep = verify(src, src, registry=reg, options={"shout_at": "hi"})
    assert rep.ok and rep.extra["echo"] == {"same_folder": True, "shout_at": "hi"}
    assert rep.as_dict()["extra"]["echo"]["shout_at"] == "hi" and "clip" not in rep.extra
    assert "echo" not in verify(src, src, registry=reg).extra  # not asked for: not run
    with pytest.raises(InputError, match="needs a word"):
        verify(src, src, registry=reg, options={"shout_at": ""})
    with pytest.raises(InputError, match="no installed verifier reads the option.* whisper"):
        verify(src, src, registry=reg, options={"whisper": "x"})


def test_one_flag_declared_differently_twice_is_an_error() -> None:
    other = CommandOption("verify", "--shout-at", "another meaning")
    reg = registry_with(("a", _Plugin(Verifier("a", (SHOUT,), _echo))),
                        ("b", _Plugin(Verifier("b", (other,), _echo))), entry_points=False)
    with pytest.raises(PluginError, match="--shout-at"):
        reg.command_options()
    same = registry_with(("a", _Plugin(Verifier("a", (SHOUT,), _echo))),
                         ("b", _Plugin(Verifier("b", (SHOUT,), _echo))), entry_points=False)
    assert same.command_options() == [SHOUT]


def test_declared_options_join_their_command() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("verify")
    add_plugin_options(sub.choices, [SHOUT, CommandOption("verify", "--loud", "a switch"),
                                     CommandOption("nosuch", "--x", "skipped")])
    args = parser.parse_args(["verify", "--shout-at", "hey"])
    assert plugin_option_values(args) == {"shout_at": "hey"}  # an unset switch is left out
    assert plugin_option_values(parser.parse_args(["verify", "--loud"])) == {"loud": True}


def test_the_installed_plugins_options_are_in_the_parser() -> None:
    def flags(parser: Any, command: str) -> set[str]:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        return {s for a in sub.choices[command]._actions for s in a.option_strings}

    full, bare = build_parser(), build_parser(plugin_options=False)
    if os.environ.get("NEMO_CONVERT_DISABLE_PLUGINS"):
        pytest.skip("plugins disabled")
    assert "--embed-vision-tower" in flags(full, "import") and "--embed-vision-tower" not in flags(bare, "import")
    assert {"--clip-image", "--texts"} <= flags(full, "verify") and "--clip-image" not in flags(bare, "verify")
    assert not _names_a_command(["--help"]) and not _names_a_command(["--version"])
    assert _names_a_command(["verify", "--help"])


class _Tally:
    """A verifier result with its own text report and JSON (``VerifierResult``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def render(self) -> list[Any]:
        return [ResultTable("tally [of both sides]", ("side", "count"), (("A", str(self.n)), ("B", "[b]"))),
                f"total {2 * self.n} [not markup]"]

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.n}


def test_results_are_shown_without_the_core_naming_the_verifier() -> None:
    """``verify``'s text and JSON report show any plugin's result generically: ``render()``
    items (tables drawn like ours, lines indented, no markup) or a dict's ``key: value``
    lines; ``as_dict()`` or the dict itself in the JSON."""
    import io

    from rich.console import Console

    from nemo_convert.cli.cmd_verify import print_extra
    from nemo_convert.verify.report import result_json

    buf = io.StringIO()
    print_extra(Console(file=buf, width=80, highlight=False),
                {"tally": _Tally(3), "echo": {"same_folder": True, "shout_at": "hi"}, "flag": 7})
    out = buf.getvalue()
    assert "tally [of both" in out and "│ B    │ [b]   │" in out and "  total 6 [not markup]\n" in out
    assert "  echo.same_folder: True\n  echo.shout_at: 'hi'\n  flag: 7\n" in out
    assert result_json(_Tally(3)) == {"count": 3} and result_json({"a": 1}) == {"a": 1} and result_json(7) == 7
