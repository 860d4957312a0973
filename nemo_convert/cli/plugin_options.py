"""Command-line options that plugins declare (:class:`~nemo_convert.plugins.records.CommandOption`):
added to their command's parser, and handed back by key once parsed.

The core CLI knows no family's options: LLaVA's ``import --embed-vision-tower`` and the
CLIP verifier's ``verify --clip-image/--texts`` come from the installed plugins; so do the
choices of ``--to`` (the installed output targets, :func:`set_target_choices`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from nemo_convert.plugins.records import CommandOption

_KEYS = "plugin_option_keys"


def add_plugin_options(subparsers: dict[str, argparse.ArgumentParser], options: Sequence[CommandOption]) -> None:
    """Add each option to the parser of its command (an unknown command is skipped)."""
    keys: dict[str, list[str]] = {}
    for opt in options:
        p = subparsers.get(opt.command)
        if p is None:
            continue
        if opt.kind == "switch":
            p.add_argument(opt.flag, dest=opt.key, action="store_true", help=opt.help)
        else:
            p.add_argument(opt.flag, dest=opt.key, metavar=opt.metavar, help=opt.help,
                           nargs="+" if opt.kind == "values" else None)
        keys.setdefault(opt.command, []).append(opt.key)
    for command, names in keys.items():
        subparsers[command].set_defaults(**{_KEYS: tuple(names)})


def plugin_option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The plugin options given on the command line, by key (switches only when set)."""
    out: dict[str, Any] = {}
    for key in getattr(args, _KEYS, ()):
        value = getattr(args, key, None)
        if value is not None and value is not False:
            out[key] = value
    return out


def set_target_choices(subparsers: dict[str, argparse.ArgumentParser], names: Sequence[str]) -> None:
    """Make ``names`` (the installed output targets, ``Registry.targets()``) the choices of
    every command's ``--to``."""
    for parser in subparsers.values():
        for action in parser._actions:
            if action.dest == "to" and "--to" in action.option_strings:
                action.choices = list(names)
