"""The error types nemo-convert raises.

Every failure that is the input's or the user's fault is a :class:`NemoConvertError`
subclass. The CLI prints such errors as one line and exits non-zero; anything else is a
bug in nemo-convert and is shown with a traceback under ``--debug``.
"""

from __future__ import annotations

import re


class NemoConvertError(Exception):
    """Base class of every error nemo-convert reports to the user."""

    exit_code: int = 2


class InputError(NemoConvertError):
    """The input checkpoint is missing, unreadable, corrupted or of an unknown kind."""


class ConfigError(NemoConvertError):
    """A model config is missing a field, or contradicts the tensors."""


class MappingError(NemoConvertError):
    """A source tensor was not consumed or a target tensor not produced."""

    def __init__(self, message: str, *, unconsumed: list[str] | None = None,
                 unproduced: list[str] | None = None) -> None:
        self.unconsumed = sorted(unconsumed or [])
        self.unproduced = sorted(unproduced or [])
        parts = [message]
        if self.unconsumed:
            parts.append(f"source tensors not consumed: {_short_list(self.unconsumed)}")
        if self.unproduced:
            parts.append(f"target tensors not produced: {_short_list(self.unproduced)}")
        super().__init__("; ".join(parts))


class ShapeError(ConfigError):
    """A tensor's shape contradicts the shape the config implies."""


class OutputError(NemoConvertError):
    """The output path cannot be written: empty, a folder path (``out/``) for a file
    output, or an existing path ``--overwrite`` may not replace."""


class OutputExistsError(OutputError):
    """The output path exists and ``overwrite`` was not given, or what exists there is not
    an output of the kind being written (which ``overwrite`` never replaces)."""


class PluginError(NemoConvertError):
    """Two plugins claim one name, or no plugin handles a model."""


class UnsafePickleError(InputError):
    """A pickle asked for a global outside the allow-list."""


class UnsupportedError(NemoConvertError):
    """A valid request this version does not support (e.g. a geometry TP cannot split)."""


def name_patterns(keys: list[str]) -> list[tuple[str, int]]:
    """``keys`` grouped by their name with every number collapsed to ``*``
    (``model.layers.*.mlp.experts.*.w1.weight``), most frequent first."""
    counts: dict[str, int] = {}
    for k in keys:
        pattern = _NUMBER.sub("*", k)
        counts[pattern] = counts.get(pattern, 0) + 1
    return sorted(counts.items(), key=lambda pc: (-pc[1], pc[0]))


def _short_list(keys: list[str], limit: int = 8, patterns: int = 4) -> str:
    """All of ``keys`` when there are few; else the count, the first few and a summary
    of the name patterns (``model.layers.*.w1.weight (×256)``)."""
    if len(keys) <= limit:
        return ", ".join(keys)
    groups = name_patterns(keys)
    shown = ", ".join(f"{p} (×{n})" for p, n in groups[:patterns])
    more = f", {len(groups) - patterns} more pattern(s)" if len(groups) > patterns else ""
    return f"{len(keys)} tensors: {', '.join(keys[:2])}, …; by pattern: {shown}{more}"


_NUMBER = re.compile(r"(?<![A-Za-z])\d+(?![A-Za-z])")
