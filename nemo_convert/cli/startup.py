"""The program's entry point: an interrupt while it is still loading is one line and exit 130.

Loading the command line, torch and the plugins takes seconds. Python's own handlers would
print a ``KeyboardInterrupt`` traceback for a Ctrl-C in that window, and end silently with
143 for a ``SIGTERM``. So the console script and ``python -m nemo_convert`` install, before
importing anything heavy, handlers that print ``nemo-convert: interrupted; no output was
written`` (and, under ``--json``, the JSON error object on stdout) and exit 130 at once:
nothing has been written yet, so there is nothing to clean up.
:func:`~nemo_convert.cli.main.run` replaces them with its own (:func:`start_up_done`) just
before the command runs. What remains uncovered is the interpreter's own start and the
import of the ``nemo_convert`` package itself (a tenth of a second or so).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

INTERRUPTED = "interrupted; no output was written"
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    try:
        if "--json" in sys.argv[1:]:
            os.write(1, b'{"error": "' + INTERRUPTED.encode() + b'", "kind": "interrupted"}\n')
        os.write(2, f"nemo-convert: {INTERRUPTED}\n".encode())
    except OSError:  # a closed stdout or stderr: the exit code still says it
        pass
    finally:
        os._exit(130)


def guard_start_up() -> None:
    """Until :func:`start_up_done`: ``SIGINT``, ``SIGTERM`` and ``SIGHUP`` print one line and
    exit 130. A signal that is ignored (``nohup``, a background job) stays ignored."""
    for s in _SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _interrupted_while_starting)


def start_up_done() -> None:
    """The command's own handling takes over: ``SIGINT`` raises ``KeyboardInterrupt`` again
    (``SIGTERM``/``SIGHUP`` were given theirs by the caller). Nothing changes where
    :func:`guard_start_up` was not called (``main(argv)`` from Python)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is _interrupted_while_starting:
            signal.signal(s, signal.SIG_DFL)


def main() -> int:
    """The ``nemo-convert`` console script (and ``python -m nemo_convert``)."""
    guard_start_up()
    from nemo_convert.cli.main import main as program  # lazy: the guard is in place before the heavy imports

    code = program()
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        leave_without_finalizing(code)
    return code


def leave_without_finalizing(code: int) -> None:
    """End a torchrun process once its command is done, skipping the interpreter's finalization.

    The command has flushed and installed its output, met its peers and destroyed the process
    group. What finalization would still run is the C++ static destructors of torch's
    distributed stack, and there a process occasionally died with ``terminate called without
    an active exception`` (SIGABRT, no Python frame on the stack: about 1 run in 40 under load),
    turning a finished conversion into a failed one. Only the process entry point does this: a
    program that calls :func:`nemo_convert.cli.main.main` itself keeps its interpreter."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: the exit code still says it
            pass
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()  # what its atexit hook would have done
    os._exit(code)
