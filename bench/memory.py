"""Peak-memory measurement of a child process, sampled from the parent (Linux only).

Definitions (all in bytes):

* **private** — the ``Anonymous:`` line of ``/proc/<pid>/smaps_rollup``: pages that no
  file backs (the Python heap, malloc arenas, torch tensors, and copy-on-write copies
  of ``MAP_PRIVATE`` file pages that were *written*). It excludes the page cache and
  every clean file-backed page, including pages of a ``MAP_PRIVATE`` mapping that were
  only read (our safetensors reader maps sources that way). This is the memory a
  conversion truly costs: file-backed pages can be dropped by the kernel at any time.
  (``Private_Dirty`` is not used: it would also count dirty pages of a shared writable
  file mapping, which are page cache.)
* **rss** — the ``Rss:`` line of the same file (anonymous + file-backed + shmem pages
  resident in the process), i.e. what ``top`` shows; it grows with every page of a
  memory-mapped source that was touched, even though those pages are reclaimable.
* **ru_maxrss** — the kernel's high-water mark of ``rss`` (``wait4`` rusage of the child),
  which catches spikes between samples but mixes in file-backed pages.

Samples are taken every ``interval`` seconds (20 ms by default) by a thread of the
parent, so a spike shorter than the interval can be missed; ``ru_maxrss`` bounds the
true peak from above.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

_FIELDS = {"Rss": "rss", "Anonymous": "private", "Private_Dirty": "private_dirty", "Pss_File": "pss_file"}


def read_smaps_rollup(pid: int) -> dict[str, int] | None:
    """The fields of ``/proc/<pid>/smaps_rollup`` we use, in bytes (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out: dict[str, int] = {}
    for line in raw.split(b"\n"):
        key, _, rest = line.partition(b":")
        name = _FIELDS.get(key.decode("ascii", "replace"))
        if name is not None:
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * 1024  # the kernel reports kB
    return out or None


@dataclass
class MemoryPeaks:
    """Peaks of one process over its life, as sampled."""

    samples: int = 0
    peak_private: int = 0
    peak_rss: int = 0
    peak_private_dirty: int = 0
    ru_maxrss: int = 0  # from wait4, bytes
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, private, rss) every Nth sample

    def as_dict(self, timeline: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d


class MemorySampler:
    """Samples a process's ``smaps_rollup`` on a background thread until :meth:`stop`."""

    def __init__(self, pid: int, interval: float = 0.02, timeline_every: int = 10) -> None:
        self.pid = pid
        self.interval = interval
        self.peaks = MemoryPeaks()
        self._every = max(1, timeline_every)
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name=f"mem-sampler-{pid}", daemon=True)

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def sample(self) -> bool:
        s = read_smaps_rollup(self.pid)
        if s is None:
            return False
        p = self.peaks
        p.peak_private = max(p.peak_private, s.get("private", 0))
        p.peak_rss = max(p.peak_rss, s.get("rss", 0))
        p.peak_private_dirty = max(p.peak_private_dirty, s.get("private_dirty", 0))
        if p.samples % self._every == 0:
            p.timeline.append((round(time.perf_counter() - self._t0, 3), s.get("private", 0), s.get("rss", 0)))
        p.samples += 1
        return True

    def _run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            self.sample()
            next_t += self.interval
            delay = next_t - time.perf_counter()
            if delay < 0:  # fell behind (slow read or a busy machine): do not burst
                next_t = time.perf_counter()
                delay = 0.0
            self._stop.wait(delay)

    def stop(self) -> MemoryPeaks:
        self._stop.set()
        self._thread.join()
        return self.peaks


@dataclass
class ChildRun:
    """A child process run under the sampler."""

    returncode: int
    wall_seconds: float  # process start to exit, as seen by the parent
    cpu_seconds: float  # user + system CPU time of the child (wait4 rusage)
    memory: MemoryPeaks
    result: dict[str, Any]  # what the child wrote to its result file (empty if none)
    stderr_tail: str


def run_measured(cmd: Sequence[str], *, result_path: str | None = None, interval: float = 0.02,
                 env: dict[str, str] | None = None, timeout: float | None = None) -> ChildRun:
    """Run ``cmd`` in a fresh process, sampling its memory every ``interval`` seconds.

    The child may write a JSON object to ``result_path``; it is returned as ``result``.
    ``ru_maxrss`` is taken from ``wait4`` on this very child (not ``RUSAGE_CHILDREN``,
    which is a maximum over every child ever reaped).
    """
    if result_path and os.path.exists(result_path):
        os.unlink(result_path)
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = MemorySampler(proc.pid, interval).start()
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = None if timeout is None else t0 + timeout
    status = rusage = None
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if deadline is not None and time.perf_counter() > deadline:
            proc.kill()
            pid, status, rusage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    mem = sampler.stop()
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    mem.ru_maxrss = rusage.ru_maxrss * 1024  # Linux reports kB
    result: dict[str, Any] = {}
    if result_path and os.path.exists(result_path):
        with open(result_path, encoding="utf-8") as f:
            result = json.load(f)
    err = b"".join(err_chunks).decode("utf-8", "replace")
    cpu = rusage.ru_utime + rusage.ru_stime
    return ChildRun(proc.returncode, wall, cpu, mem, result, err[-4000:])
