"""``--quiet`` for the commands whose printed output is their result (``inspect``,
``plugins``, ``verify``): nothing is printed but errors; the exit code answers; ``--json``
still prints its document."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nemo_convert.cli.common import QUIET_RESULT_HELP
from nemo_convert.cli.main import build_parser, main


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    from nemo_convert.examples import make_tiny_llama

    return make_tiny_llama(str(tmp_path_factory.mktemp("quiet") / "llama"), tokenizer=False)


def _run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("flag", ["--quiet", "-q"])
def test_plugins_quiet_prints_nothing(capsys: Any, flag: str) -> None:
    assert _run(capsys, "plugins", flag) == (0, "", "")


def test_inspect_quiet_prints_nothing(capsys: Any, llama: str) -> None:
    assert _run(capsys, "inspect", llama, "-q") == (0, "", "")


def test_inspect_quiet_still_reports_errors(capsys: Any, tmp_path: Any) -> None:
    code, out, err = _run(capsys, "inspect", str(tmp_path / "nope"), "-q")
    assert code == 2 and out == "" and err.startswith("nemo-convert: error: ")


@pytest.mark.parametrize("argv", [("plugins",), ("inspect", None)], ids=["plugins", "inspect"])
def test_quiet_json_still_prints_the_document(capsys: Any, llama: str, argv: tuple[Any, ...]) -> None:
    argv = tuple(llama if a is None else a for a in argv)
    quiet = _run(capsys, *argv, "--json", "-q")
    loud = _run(capsys, *argv, "--json")
    assert quiet[0] == 0 and json.loads(quiet[1]) == json.loads(loud[1]) and quiet[2] == ""


@pytest.mark.parametrize("command", ["inspect", "plugins", "verify"])
def test_quiet_help_says_what_it_does(command: str) -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    quiet = next(a for a in sub.choices[command]._actions if a.dest == "quiet")  # type: ignore[attr-defined]
    assert quiet.help == QUIET_RESULT_HELP
