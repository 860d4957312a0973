"""A torchrun process ends with ``os._exit`` once its command is done (``cli/startup.py``).

Under load, about 1 run in 40 of ``torchrun … -m nemo_convert quantize`` lost process 0 to
``terminate called without an active exception`` (SIGABRT) *after* the output was installed;
``PYTHONFAULTHANDLER`` showed no Python frame, i.e. the abort came from the interpreter's
finalization (torch.distributed's C++ static destructors). The entry point now skips that
finalization when ``WORLD_SIZE`` > 1, after flushing stdout and stderr; a one-process run, and a
program calling :func:`nemo_convert.cli.main.main` itself, finish normally. The torchrun
end-to-end runs are ``tests/test_multiprocess*.py``.
"""

from __future__ import annotations

import signal

import pytest

from nemo_convert.cli import main as cli_main
from nemo_convert.cli import startup


class Exited(Exception):
    pass


@pytest.fixture
def entry_point(monkeypatch, capsys):
    """``startup.main`` with a command that prints and returns 3, and ``os._exit`` recorded."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    exits: list[int] = []

    def command() -> int:
        print("done", end="")  # unterminated: only a flush puts it out
        return 3

    def fake_exit(code: int) -> None:
        exits.append(code)
        assert capsys.readouterr().out == "done"  # flushed before leaving
        raise Exited

    monkeypatch.setattr(cli_main, "main", command)
    monkeypatch.setattr(startup.os, "_exit", fake_exit)
    yield exits
    for s, h in handlers.items():
        signal.signal(s, h)


@pytest.mark.parametrize("world", ["2", "4"])
def test_a_torchrun_process_leaves_with_its_code_after_flushing(entry_point, monkeypatch, world):
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(Exited):
        startup.main()
    assert entry_point == [3]


@pytest.mark.parametrize("world", [None, "1", ""])
def test_one_process_returns_normally(entry_point, monkeypatch, world):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    assert startup.main() == 3
    assert entry_point == []
