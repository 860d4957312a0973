"""A rich progress bar (tensors and bytes, with throughput) on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported when a bar starts (--help and inspect do not need it)
    from rich.console import Console
    from rich.progress import Progress, TaskID


class RichProgress:
    """Implements :class:`nemo_convert.engine.Progress`: one bar of bytes, with the
    tensor count, throughput, elapsed and remaining time."""

    def __init__(self, console: Console | None = None, *, world: int = 1) -> None:
        from rich.console import Console

        self._console = console or Console(stderr=True)
        self._world = world
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._done = 0
        self._total = 0
        self._said_share = False

    def start(self, description: str, total_bytes: int, total_tensors: int) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self._done, self._total = 0, total_tensors
        if description == "calibrate":  # counts calibration rows and tokens (run once, in process 0)
            self._start_calibration(total_bytes, total_tensors)
            return
        if self._world > 1 and not self._said_share:  # under torchrun the bar sees this process's parts; the
            self._said_share = True                     # summary counts all. A line of its own: in the bar's
            self._console.print(f"note: the bar shows process 0's share of the work of {self._world} processes; "
                                "the summary counts all", highlight=False, soft_wrap=True)  # label it squashed it
        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                             TextColumn("{task.fields[tensors]} tensors"), DownloadColumn(),
                             TransferSpeedColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                             console=self._console)
        self._bar.start()
        self._task = self._bar.add_task(description, total=max(total_bytes, 1),
                                        tensors=f"0/{total_tensors}" if total_tensors else "0")

    def _start_calibration(self, tokens: int, rows: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("[bold]calibrate"), BarColumn(), TextColumn("{task.fields[tensors]} rows"),
                             TextColumn("{task.completed:.0f}/{task.total:.0f} tokens"), TimeElapsedColumn(),
                             TimeRemainingColumn(), console=self._console)
        self._bar.start()
        self._task = self._bar.add_task("calibrate", total=max(tokens, 1), tensors=f"0/{rows}")

    def advance(self, nbytes: int, ntensors: int) -> None:
        if self._bar is not None and self._task is not None:
            self._done += ntensors
            count = f"{self._done}/{self._total}" if self._total else str(self._done)
            self._bar.update(self._task, advance=nbytes, tensors=count)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def make_progress(args: Any) -> RichProgress | None:
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        return None
    workers = getattr(args, "workers", None)
    return RichProgress(world=getattr(workers, "world", 1))
