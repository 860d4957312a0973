"""Peak-memory measurement of a child process, sampled from the parent (Linux only).

Definitions (all in bytes):

* **private** — resident *anonymous* pages: pages that no file backs (the Python heap,
  malloc arenas, torch tensors, and copy-on-write copies of ``MAP_PRIVATE`` file pages
  that were *written*). It excludes the page cache and every clean file-backed page,
  including pages of a ``MAP_PRIVATE`` mapping that were only read (our safetensors
  reader maps sources that way). This is the memory a conversion truly costs:
  file-backed pages can be dropped by the kernel at any time. (``Private_Dirty`` is not
  used: it would also count dirty pages of a shared writable file mapping, which are
  page cache.) There is no swap on the benchmark machine; with swap, add ``Swap:``.
* **rss** — all resident pages (anonymous + file-backed + shmem), what ``top`` shows; it
  grows with every page of a memory-mapped source that was touched, although those
  pages are reclaimable page cache.
* **ru_maxrss** — the kernel's high-water mark of ``rss`` (``wait4`` rusage of the child),
  which catches spikes between samples but mixes in file-backed pages. Linux carries a
  process's ru_maxrss across ``exec`` from the forked copy of its parent, so the parent
  must stay small (the benchmark's parent never imports torch).

Where the numbers come from: ``private`` is the ``Anonymous:`` line of
``/proc/<pid>/smaps_rollup`` — the same kernel counter (``MM_ANONPAGES``) that
``/proc/<pid>/status`` shows as ``RssAnon`` (and ``rss`` = ``VmRSS`` = smaps ``Rss:``).
Reading ``smaps_rollup`` walks every page table of the process: ~9 ms per read at 1 GB
RSS on the benchmark VM, which at 20 ms intervals would steal ~40 % of a core from the
measured process. So the fast samples (every ``interval``, 20 ms by default) read
``status``, and every ``rollup_every``-th sample also reads ``smaps_rollup`` as a
cross-check (``max_rollup_delta``: the largest |Anonymous − RssAnon| seen, compared with
the closer of two ``status`` reads around it; it includes whatever the process allocated
or freed during the ~10 ms read, e.g. one 12 MiB tensor, plus the per-CPU batching lag of
the status counters).

A spike shorter than the interval can be missed; ``ru_maxrss`` bounds the true peak of
``rss`` from above.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

_ROLLUP_FIELDS = {"Rss": "rss", "Anonymous": "private", "Private_Dirty": "private_dirty"}
_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "private"}


def _read_kb_fields(path: str, fields: dict[str, str]) -> dict[str, int] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out: dict[str, int] = {}
    for line in raw.split(b"\n"):
        key, _, rest = line.partition(b":")
        name = fields.get(key.decode("ascii", "replace"))
        if name is not None:
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * 1024  # the kernel reports kB
    return out or None


def read_smaps_rollup(pid: int) -> dict[str, int] | None:
    """``rss``, ``private`` (``Anonymous:``) and ``private_dirty`` of ``/proc/<pid>/smaps_rollup``
    in bytes; None once the process is gone (a zombie has no mappings left)."""
    return _read_kb_fields(f"/proc/{pid}/smaps_rollup", _ROLLUP_FIELDS)


def read_status(pid: int) -> dict[str, int] | None:
    """``rss`` (``VmRSS``) and ``private`` (``RssAnon``) of ``/proc/<pid>/status``, in bytes: a
    cheap read of the counters ``smaps_rollup`` sums (None once the process is gone)."""
    s = _read_kb_fields(f"/proc/{pid}/status", _STATUS_FIELDS)
    return s if s and "private" in s else None


def self_private() -> int:
    """This process's own private (anonymous) memory, in bytes."""
    s = read_status(os.getpid())
    return s["private"] if s else 0


@dataclass
class MemoryPeaks:
    """Peaks of one process over its life, as sampled."""

    samples: int = 0
    rollup_samples: int = 0
    peak_private: int = 0
    peak_rss: int = 0
    peak_private_dirty: int = 0  # smaps_rollup samples only
    max_rollup_delta: int = 0  # largest |smaps Anonymous - status RssAnon| of a cross-check
    ru_maxrss: int = 0  # from wait4, bytes
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, private, rss) every Nth sample

    def as_dict(self, timeline: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d


class MemorySampler:
    """Samples a process's memory on a background thread until :meth:`stop`: ``status``
    every ``interval`` seconds, plus ``smaps_rollup`` every ``rollup_every``-th sample
    (0: never)."""

    def __init__(self, pid: int, interval: float = 0.02, timeline_every: int = 10,
                 rollup_every: int = 50) -> None:
        self.pid = pid
        self.interval = interval
        self.peaks = MemoryPeaks()
        self._every = max(1, timeline_every)
        self._rollup_every = rollup_every
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name=f"mem-sampler-{pid}", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def sample(self) -> bool:
        p = self.peaks
        s = read_status(self.pid)
        if s is None:
            return False
        if self._rollup_every and p.samples % self._rollup_every == 0:
            r = read_smaps_rollup(self.pid)
            s2 = read_status(self.pid)
            if r is not None and s2 is not None:
                p.rollup_samples += 1
                p.peak_private_dirty = max(p.peak_private_dirty, r.get("private_dirty", 0))
                # the process runs on meanwhile: compare with the closer of the two status reads
                delta = min(abs(r.get("private", 0) - s["private"]), abs(r.get("private", 0) - s2["private"]))
                p.max_rollup_delta = max(p.max_rollup_delta, delta)
                for k in ("private", "rss"):
                    s[k] = max(s.get(k, 0), r.get(k, 0), s2.get(k, 0))
        p.peak_private = max(p.peak_private, s.get("private", 0))
        p.peak_rss = max(p.peak_rss, s.get("rss", 0))
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
                 env: dict[str, str] | None = None, timeout: float | None = None,
                 rollup_every: int = 50) -> ChildRun:
    """Run ``cmd`` in a fresh process, sampling its memory every ``interval`` seconds.

    The child may write a JSON object to ``result_path``; it is returned as ``result``.
    ``ru_maxrss`` is taken from ``wait4`` on this very child (not ``RUSAGE_CHILDREN``,
    which is a maximum over every child ever reaped).
    """
    if result_path and os.path.exists(result_path):
        os.unlink(result_path)
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = MemorySampler(proc.pid, interval, rollup_every=rollup_every).start()
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    killer = threading.Timer(timeout, proc.kill) if timeout is not None else None
    if killer is not None:
        killer.daemon = True
        killer.start()
    try:
        _, status, rusage = os.wait4(proc.pid, 0)  # blocks: the parent costs no CPU meanwhile
    finally:
        if killer is not None:
            killer.cancel()
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
