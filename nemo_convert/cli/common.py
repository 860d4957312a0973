"""Flags and output helpers shared by the commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


#: What ``--quiet`` means for the commands whose output is their result (``inspect``,
#: ``plugins``, ``verify``): the exit code alone answers; ``--json`` still prints.
QUIET_RESULT_HELP = "print nothing but errors; the exit code is the result (--json still prints its document)"


def common_flags(p: argparse.ArgumentParser, *, json_flag: bool = True,
                 quiet_help: str = "no progress bar and no summary") -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    p.add_argument("--quiet", "-q", action="store_true", help=quiet_help)
    if json_flag:
        p.add_argument("--json", action="store_true", help="print a machine-readable JSON result on stdout")


def output_flags(p: argparse.ArgumentParser) -> None:
    """``--overwrite`` and ``--trust-pickle``, shared by the converting commands."""
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUTPUT if it is an output of the kind written (or an empty folder); anything else "
                        "is refused")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow arbitrary code in pickled weights (DANGEROUS; only for files you trust)")


def device_flag(p: argparse.ArgumentParser, *, what: str = "the transforms that build new tensors (fuses, "
                "TP splits, dtype casts; renames and slices stay on the CPU)") -> None:
    """``--device``: where ``what`` run. Checked by :func:`nemo_convert.compute.resolve_device`
    when the command starts (importing it here would load torch for ``--help``)."""
    p.add_argument("--device", default="cpu", metavar="{cpu,cuda,cuda:N,auto}",
                   help=f"where {what} run: cpu (default), cuda (under torchrun: cuda:LOCAL_RANK), cuda:N, "
                        "or auto (cuda when available, else cpu)")


def finite_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check-finite", action="store_true",
                   help="count NaN/Inf values in every written tensor and report the tensors that have any")


#: Below this width, results are printed as indented lines instead of wide tables.
TABLE_MIN_WIDTH = 120


def output_width() -> int:
    """The width results are laid out for: the terminal's (or ``COLUMNS``) on a terminal,
    else ``COLUMNS`` or 80 — piped output fits a standard 80-column view."""
    import os

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return 80


def wrapped(text: str, width: int, indent: str) -> list[str]:
    """``text`` wrapped to ``width`` at spaces, every line indented by ``indent``; words
    (tensor names) are never cut."""
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [indent]


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def warn(args: argparse.Namespace, message: str) -> None:
    from rich.console import Console

    if not getattr(args, "quiet", False):
        Console(stderr=True, soft_wrap=True).print(f"[yellow]warning:[/] {message}", highlight=False)


def revision_flag(p: argparse.ArgumentParser) -> None:
    """``--revision``: which cached revision of a Hugging Face hub id source to read."""
    p.add_argument("--revision", metavar="REV",
                   help="for a Hugging Face hub id (org/name) read from the local hub cache: the branch, tag "
                        "or commit (default main); nothing is downloaded")


def hf_source(args: argparse.Namespace, src: str, *, one_of_several: bool = False) -> str:
    """``src``, or the local hub-cache snapshot of the hub id ``src`` names. With
    ``one_of_several`` (``verify A B``) ``--revision`` applies to the hub ids only."""
    import os

    from nemo_convert.formats.hf.hub import resolve_hf_source  # lazy: CLI start-up time

    revision = getattr(args, "revision", None)
    if one_of_several and os.path.exists(src):
        revision = None
    return resolve_hf_source(src, revision)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def report(args: argparse.Namespace, rep: Any, verb: str) -> None:
    """Print a conversion report: JSON with ``--json``, a summary line otherwise."""
    from rich.console import Console

    for w in rep.warnings:
        warn(args, w)
    if not getattr(args, "json", False) and not getattr(args, "quiet", False):
        for note in getattr(rep, "notes", []) or []:
            Console(stderr=True, soft_wrap=True).print(f"note: {note}", highlight=False)
    workers = getattr(args, "workers", None)
    if workers is not None and not workers.is_main:
        return
    if getattr(args, "json", False):
        print_json(rep.as_dict())
    elif not getattr(args, "quiet", False):
        rate = rep.bytes / rep.seconds / 1024**2 if rep.seconds > 0 else 0.0
        layout = f", layout {rep.layout}" if rep.layout else ""
        Console(stderr=True, soft_wrap=True).print(
            f"{verb} {rep.output}: {rep.tensors} tensors, {human_bytes(rep.bytes)} in {rep.seconds:.2f} s "
            f"({rate:.0f} MiB/s), family {rep.family}{layout}"
            + (f"; dropped {len(rep.dropped)} tensor(s) the family leaves out" if rep.dropped else "")
            + (f"; all {workers.world} processes together (the bar showed process 0's share)"
               if workers is not None and workers.world > 1 else ""), highlight=False)
