"""Entry point: parses the command line and turns errors into one line and an exit code.

Exit codes: 0 success; 2 bad input or a refused operation (one-line message);
130 interrupted; 1 an unexpected internal error (traceback with ``--debug``); 141
(128 + SIGPIPE, what a shell reports for ``cat``/``grep`` in the same place), silently,
when the reader of stdout went away (``nemo-convert inspect X | head -1``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import warnings
import sys
from contextlib import contextmanager
from typing import Iterator, NoReturn, Sequence, cast

from nemo_convert import __version__
from nemo_convert.cli import (cmd_clean, cmd_convert, cmd_demo, cmd_from_ckpt, cmd_inspect,  # noqa: I001
                              cmd_plugins, cmd_quantize, cmd_reshard, cmd_tokenizer, cmd_verify)
from nemo_convert.cli.plugin_options import add_plugin_options, set_target_choices
from nemo_convert.cli.startup import INTERRUPTED, start_up_done
from nemo_convert.errors import NemoConvertError

#: Commands that split their work across torchrun processes; the others run in process 0.
PARALLEL_COMMANDS = ("import", "export", "reshard", "quantize")

#: The exit code when stdout's reader went away: 128 + SIGPIPE, as a shell reports a tool
#: killed by SIGPIPE (``set -o pipefail`` sees it; ``cmd | head`` does not).
EXIT_STDOUT_CLOSED = 128 + 13

COMMANDS = (cmd_convert, cmd_reshard, cmd_from_ckpt, cmd_quantize, cmd_inspect, cmd_plugins, cmd_tokenizer, cmd_verify,
            cmd_demo, cmd_clean)


class _Parser(argparse.ArgumentParser):
    """Remembers the last usage error (for ``--json``); sub-command parsers share the class."""

    last_error: str | None = None

    def error(self, message: str) -> NoReturn:
        _Parser.last_error = message
        super().error(message)


def build_parser(*, plugin_options: bool = True, offer: bool = False) -> argparse.ArgumentParser:
    """The parser of every command; with ``plugin_options``, the options installed plugins
    declare are added to their commands (loading the plugins: ``nemo-convert --help``
    alone does not). With ``offer`` the registry built for that is offered to the command
    (:func:`~nemo_convert.plugins.manager.offer_registry`): loading every plugin twice
    would be a fifth of ``inspect``'s time."""
    parser = _Parser(
        prog="nemo-convert",
        description="Convert model checkpoints into and out of NVIDIA NeMo formats — streaming, "
                    "bounded memory, bit-exact, no NeMo or GPU needed.")
    parser.add_argument("--version", action="version", version=f"nemo-convert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    if plugin_options:
        from nemo_convert.plugins.manager import (PluginLoadWarning, offer_registry,
                                                  registry_with)  # lazy: CLI start-up time (loads the plugins)

        # Built silently: the command's registry warns about a broken plugin (or not, under
        # --quiet) and reports a conflict when it runs — this one, adopted with its warnings
        # recorded, or (after a conflict) one built again.
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                registry = registry_with()
                declared = registry.command_options()
                targets = [t.name for t in registry.targets()]
            if offer:  # with the warnings a build of its own would give (a plugin that fails to load)
                offer_registry(registry, [w for w in caught if issubclass(w.category, PluginLoadWarning)])
        except NemoConvertError:
            declared, targets = [], []
        add_plugin_options(cast(dict[str, argparse.ArgumentParser], sub.choices), declared)
        if targets:
            set_target_choices(cast(dict[str, argparse.ArgumentParser], sub.choices), targets)
    return parser


def _names_a_command(argv: Sequence[str]) -> bool:
    """Does the command line name a command (a positional argument), so that its parser
    needs the plugins' options? ``nemo-convert --help`` and ``--version`` do not."""
    return any(not a.startswith("-") for a in argv)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
    return f"nemo-convert: warning: {message}\n"


def _stdout_reader_gone() -> bool:
    """Is stdout a pipe or socket whose reading end is closed? (An EPIPE from writing any
    other file is an error like any other.)"""
    try:
        import select

        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):  # no stdout, no fd (captured), no poll()
        return False
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of what is still
    buffered cannot fail again ("Exception ignored … BrokenPipeError", exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


#: Libraries whose own output (progress bars, log lines, warnings) --quiet and --json silence.
THIRD_PARTY = ("transformers", "huggingface_hub", "torch", "tokenizers", "sentencepiece", "accelerate")
_QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
              "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TQDM_DISABLE": "1"}


@contextmanager
def _third_party_quiet(args: argparse.Namespace) -> Iterator[None]:
    """Under ``--quiet`` or ``--json``: no progress bars, log lines or warnings from
    transformers and huggingface_hub (``Loading weights …``) — through their environment
    variables (read when they are first imported) and, when transformers is already
    imported, its logging verbosity; everything is restored afterwards."""
    if not (getattr(args, "quiet", False) or getattr(args, "json", False)):
        yield
        return
    saved_env = {k: os.environ.get(k) for k in _QUIET_ENV}
    os.environ.update(_QUIET_ENV)
    hf_logging = getattr(sys.modules.get("transformers"), "utils", None)
    hf_logging = getattr(hf_logging, "logging", None)
    verbosity = hf_logging.get_verbosity() if hf_logging is not None else None
    if hf_logging is not None:
        hf_logging.set_verbosity_error()
    try:
        for module in THIRD_PARTY:
            warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
        yield
    finally:
        if hf_logging is not None and verbosity is not None:
            hf_logging.set_verbosity(verbosity)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _json_error(args: argparse.Namespace, message: str, kind: str) -> None:
    """Under ``--json``, the error as a JSON object on stdout too (in process 0), so that a
    reader of stdout always gets one document: ``{"error": …, "kind": …}``."""
    if not getattr(args, "json", False):
        return
    workers = getattr(args, "workers", None)
    if workers is not None and not workers.is_main:
        return
    try:
        print(json.dumps({"error": message, "kind": kind}), flush=True)
    except (OSError, ValueError):  # stdout is gone: the stderr line is all there is
        pass


def _torchrun_error_file(line: str) -> None:
    """Under torchrun, the error line in the file the launcher reads when a process fails
    (``TORCHELASTIC_ERROR_FILE``, in the format of torch's ``ErrorHandler.record_exception``,
    torch/distributed/elastic/multiprocessing/errors/error_handler.py): its failure report
    then shows the line as the process's ``traceback``, instead of a link to its docs."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import time  # lazy: only on this path

    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass


def _report_error(args: argparse.Namespace, line: str, message: str, kind: str) -> None:
    """An error: ``line`` on stderr and, under ``--json``, ``{"error": message, "kind": kind}``
    on stdout. Under torchrun only process 0 speaks: a failure in any process is shared
    (:meth:`~nemo_convert.workers.Workers.agree`), so the others would repeat it. Every
    process leaves its own line in torchrun's error file (:func:`_torchrun_error_file`)."""
    _torchrun_error_file(line)
    workers = getattr(args, "workers", None)
    if workers is not None and not workers.is_main:
        return
    print(line, file=sys.stderr)
    _json_error(args, message, kind)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``nemo-convert`` program. Called without ``argv`` (the console script,
    ``python -m nemo_convert``) the process is exiting once this returns: a Ctrl-C that
    lands then — while the interpreter and torch shut down — is ignored, so it cannot
    print a traceback or change the exit code already decided.

    Under torchrun, a process other than 0 that failed waits up to
    :data:`OTHERS_WAIT_S` before it exits (silently, when torchrun stops it meanwhile), so
    that process 0, which reports the shared error, ends first: torchrun names the first
    process to end as the root cause, and stops the others as soon as one has ended."""
    code = 1
    try:
        code = run(argv, exiting=argv is None)
        return code
    finally:
        if argv is None:
            _ignore_interrupts_while_exiting()
            if code != 0 and _another_torchrun_process():
                import time  # lazy: only on this path

                time.sleep(OTHERS_WAIT_S)


#: How long a failed process other than 0 waits for process 0 to end first (see :func:`main`).
OTHERS_WAIT_S = 3.0


def _another_torchrun_process() -> bool:
    """Is this one of several processes torchrun started, and not process 0?"""
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and int(os.environ.get("RANK", "0") or 0) != 0
    except ValueError:
        return False


def _ignore_interrupts_while_exiting() -> None:
    """Ctrl-C (``SIGINT``) is ignored from here on; ``SIGTERM``/``SIGHUP`` get their default
    action back (the process ends at once, silently — torchrun and job managers still stop
    it) instead of raising :class:`Terminated` into the teardown. One ignored before (nohup)
    stays ignored."""
    for s, action in ((signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_DFL),
                      (signal.SIGHUP, signal.SIG_DFL)):
        try:
            if signal.getsignal(s) is not signal.SIG_IGN:
                signal.signal(s, action)
        except (OSError, ValueError):  # not the main thread
            pass


def run(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Parse ``argv`` and run the command; with ``exiting`` (the program, not a caller in
    the same process) interrupts are ignored from the moment the command has its result,
    so that one landing during the teardown (process group, flush) cannot turn a written
    output into "interrupted"."""
    given = list(argv) if argv is not None else sys.argv[1:]
    try:
        return _run(given, argv, exiting)
    finally:  # the command is over: no registry stays on offer (none was, if the plugins never loaded)
        manager = sys.modules.get("nemo_convert.plugins.manager")
        if manager is not None:
            manager.offer_registry(None)


def _run(given: list[str], argv: Sequence[str] | None, exiting: bool) -> int:
    parser = build_parser(plugin_options=_names_a_command(given), offer=True)
    _Parser.last_error = None
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error: under --json, also a JSON error object
        if exc.code not in (0, None) and "--json" in given:
            print(json.dumps({"error": _Parser.last_error or "invalid command line", "kind": "usage"}), flush=True)
        raise
    debug = getattr(args, "debug", False)
    from nemo_convert.formats.io.staging import install_signal_handlers  # lazy: CLI start-up time
    from nemo_convert.workers import from_env, shutdown  # lazy: CLI start-up time

    warnings.formatwarning = _one_line_warning  # type: ignore[assignment]
    if hasattr(signal, "SIGXFSZ"):  # a file-size limit makes writes fail with EFBIG, cleaned up like any error
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    install_signal_handlers()  # from here an interrupt is handled below (the start-up guard until now)
    start_up_done()
    try:
        args.workers = from_env()  # several processes under torchrun
        if not args.workers.is_main:
            args.quiet = True
            if args.command not in PARALLEL_COMMANDS:
                return 0  # a command that does not split its work runs in process 0 alone
        try:
            with warnings.catch_warnings(), _third_party_quiet(args):
                if getattr(args, "quiet", False):
                    warnings.simplefilter("ignore")  # --quiet: errors only
                code = int(args.func(args) or 0)
            if args.command in PARALLEL_COMMANDS:
                # every process has finished before any tears the group down: a gloo peer whose
                # partner destroyed the group first can abort ("terminate called without an
                # active exception"); only on success, where all of them reach this line
                args.workers.barrier()
            if exiting:
                _ignore_interrupts_while_exiting()
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            return code
        finally:
            shutdown(args.workers)
    except SystemExit as exc:
        if isinstance(exc.__context__, BrokenPipeError):  # rich's Console.on_broken_pipe: it already
            return EXIT_STDOUT_CLOSED                      # pointed stdout at /dev/null
        raise
    except NemoConvertError as exc:
        if debug:
            raise
        _report_error(args, f"nemo-convert: error: {exc}", str(exc), type(exc).__name__)
        return exc.exit_code
    except KeyboardInterrupt:
        if debug:
            raise
        _report_error(args, f"nemo-convert: {INTERRUPTED}", INTERRUPTED, "interrupted")
        return 130
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():
            _discard_stdout()  # like cat or grep: no message when the reader of our output left
            return EXIT_STDOUT_CLOSED
        if debug:
            raise
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        _report_error(args, f"nemo-convert: error: {where}{exc.strerror or exc}", f"{where}{exc.strerror or exc}",
                      type(exc).__name__)
        return 2
    except Exception as exc:  # an internal error: say so, briefly
        if debug:
            raise
        _report_error(args, f"nemo-convert: internal error: {type(exc).__name__}: {exc} (rerun with --debug for a "
                            "traceback)", f"internal error: {type(exc).__name__}: {exc}", "internal")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
