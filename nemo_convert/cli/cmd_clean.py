"""``nemo-convert clean``: remove the partial outputs killed runs left in a folder.

Outputs are staged under a hidden name beside the target
(``.<name>.nemo-convert-partial-<pid>-<hex>``) and renamed into place when complete. A run
killed with ``SIGKILL`` (or a power cut) cannot remove its staging entry; the next run
writing into that folder warns about it, and this command removes it — only entries whose
name is ours and whose process is gone, never anything else.
"""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from nemo_convert.cli.common import common_flags, print_json
from nemo_convert.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("clean", help="remove the partial outputs that killed runs left in a folder",
                       description="Remove the hidden partial outputs (.<name>.nemo-convert-partial-<pid>-<hex>) "
                                   "that runs killed with SIGKILL left in FOLDER: only entries named so whose "
                                   "process is no longer running on this machine. Nothing else is touched.")
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="the folder the output was written into")
    p.add_argument("--dry-run", "-n", action="store_true", help="list what would be removed; remove nothing")
    p.add_argument("--older-than", type=float, default=0.0, metavar="SECONDS",
                   help="only entries last modified at least SECONDS ago (default 0); for a folder that other "
                        "machines write into, where their running processes cannot be seen from here")
    common_flags(p, quiet_help="print nothing but errors")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nemo_convert.formats.io.staging import find_partials, human_size, remove_partials  # lazy: CLI start-up time

    if args.older_than < 0:
        raise InputError(f"--older-than {args.older_than:g}: expected a number of seconds ≥ 0")
    say = Console(stderr=True, quiet=args.quiet or args.json, soft_wrap=True, highlight=False).print
    removed: list[dict[str, object]] = []
    kept: list[dict[str, object]] = []
    for folder in args.folders:
        if not os.path.isdir(folder):
            raise InputError(f"{folder}: {'not a folder' if os.path.exists(folder) else 'no such folder'}; "
                             "pass the folder the output was written into")
    for folder in args.folders:
        found = find_partials(folder)
        dead = [p for p in found if not p.alive and p.age_s >= args.older_than]
        gone = dead if args.dry_run else remove_partials(dead, max_age_s=args.older_than)
        for p in found:
            entry: dict[str, object] = {"path": p.path, "pid": p.pid, "bytes": p.nbytes}
            if p in gone:
                removed.append(entry)
                say(f"{'would remove' if args.dry_run else 'removed'} {p.path} ({human_size(p.nbytes)}; "
                    f"process {p.pid} is gone)")
                continue
            if p.age_s < args.older_than and not p.alive:
                why = f"modified {p.age_s:.0f} s ago, less than --older-than {args.older_than:g}"
            else:
                why = f"process {p.pid} is running"
            kept.append(dict(entry, reason=why))
            say(f"kept {p.path} ({human_size(p.nbytes)}): {why}")
    total = sum(int(str(e["bytes"])) for e in removed)
    if args.json:
        print_json({"folders": list(args.folders), "dry_run": args.dry_run, "removed": removed, "kept": kept,
                    "bytes": total})
    elif not removed and not kept:
        say(f"no partial outputs in {', '.join(args.folders)}")
    else:
        say(f"{'would remove' if args.dry_run else 'removed'} {len(removed)} partial output(s), {human_size(total)}")
    return 0
