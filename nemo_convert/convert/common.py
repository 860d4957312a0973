"""Pieces shared by the conversions: the report, the registry default, our config section."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from nemo_convert.formats.sink import DirectorySink
from nemo_convert.plugins.manager import Registry, get_registry

#: The section of ``model_config.yaml`` where we keep what NeMo has no field for.
SECTION = "nemo_convert"


@dataclass
class ConversionReport:
    """What a conversion did; ``--json`` prints this."""

    output: str
    family: str
    tensors: int
    bytes: int
    seconds: float
    layout: str | None = None
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def registry_or_default(registry: Registry | None) -> Registry:
    return registry if registry is not None else get_registry()


@contextmanager
def dir_sink(path: str) -> Iterator[DirectorySink]:
    yield DirectorySink(path)
