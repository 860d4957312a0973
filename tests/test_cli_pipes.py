"""Output piped into a reader that leaves early (``nemo-convert inspect X | head -1``).

Like ``cat`` or ``grep``, nemo-convert then stops without a message and exits 141
(128 + SIGPIPE). The pipe's reading end is closed before the command starts, so every
write to stdout fails with EPIPE at once: no race with the reader. An EPIPE on anything
but stdout stays an error (exit 2, one line).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nemo_convert.cli.main import EXIT_STDOUT_CLOSED

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes"),
              pytest.mark.slow]  # a nemo-convert subprocess per test


def _run_into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first byte is written
    try:
        return subprocess.run([sys.executable, "-m", "nemo_convert", *argv], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    from nemo_convert.examples import make_tiny_llama

    return make_tiny_llama(str(tmp_path_factory.mktemp("pipes") / "llama"), tokenizer=False)


def test_exit_code_is_128_plus_sigpipe() -> None:
    assert EXIT_STDOUT_CLOSED == 141


@pytest.mark.parametrize("argv", [("plugins",), ("plugins", "--json")], ids=["text", "json"])
def test_plugins_into_closed_pipe_is_quiet(argv: tuple[str, ...]) -> None:
    proc = _run_into_closed_pipe(*argv)
    assert (proc.returncode, proc.stderr) == (EXIT_STDOUT_CLOSED, "")


@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["text", "json"])
def test_inspect_into_closed_pipe_is_quiet(llama: str, json_flag: tuple[str, ...]) -> None:
    proc = _run_into_closed_pipe("inspect", llama, *json_flag)
    assert (proc.returncode, proc.stderr) == (EXIT_STDOUT_CLOSED, "")


def test_verify_into_closed_pipe_is_quiet(llama: str) -> None:
    # Not exit 1 ("the checkpoints differ"), which rich's own broken-pipe exit would give.
    proc = _run_into_closed_pipe("verify", llama, llama)
    assert (proc.returncode, proc.stderr) == (EXIT_STDOUT_CLOSED, "")


def test_open_pipe_still_gets_everything(llama: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nemo_convert", "inspect", llama, "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("}") and proc.stderr == ""


def test_epipe_on_another_file_is_an_error() -> None:
    # stdout is a healthy pipe; the command itself hits EPIPE writing to another pipe.
    script = textwrap.dedent("""
        import os, sys
        from nemo_convert.cli import cmd_plugins
        from nemo_convert.cli.main import main

        def collect():
            r, w = os.pipe()
            os.close(r)
            os.write(w, b"x")  # BrokenPipeError, not on stdout

        cmd_plugins.collect = collect
        sys.exit(main(["plugins"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert proc.stderr == "nemo-convert: error: Broken pipe\n"
