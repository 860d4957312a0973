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

**Process trees** (``tree=True``, for commands that start workers, e.g. ``torchrun``): every
sample reads ``status`` of the root *and of every descendant* and records the *sum* of
their ``private`` (and ``rss``) as the sample; the peak is the peak of that sum, i.e. what
the whole command held at one moment. Descendants are found by scanning ``/proc/*/stat``
for parent PIDs (this kernel has no ``/proc/PID/task/TID/children``), every
``scan_every``-th sample (100 ms by default; ~1.5 ms per scan with ~100 processes), so a
worker that lives less than that may be missed. Each process's own peak is kept in
``per_process`` (``pid → {cmd, peak_private, peak_rss, first_seen, last_seen}``, the
times in seconds from the start of sampling). ``ru_maxrss`` from ``wait4``
is then the largest of the root and its reaped descendants (``RUSAGE_BOTH``: a maximum,
not a sum), and the CPU time includes every reaped descendant. The ``smaps_rollup``
cross-check reads the root only.
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


def _ppid_map() -> dict[int, list[int]]:
    """``{parent pid: [child pids]}`` from ``/proc/*/stat`` (field 4 after the ``comm``)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw.rpartition(b")")[2].split()
        if len(rest) > 1:
            kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, grandchildren, …), parents first."""
    kids = _ppid_map()
    out, todo = [], list(kids.get(pid, ()))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return ""
    return " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(parts))[:160]


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
    max_processes: int = 1  # tree mode: the most processes seen at once (root included)
    per_process: dict[int, dict[str, Any]] = field(default_factory=dict)  # tree mode: pid -> own peaks
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
                 rollup_every: int = 50, tree: bool = False, scan_every: int = 5) -> None:
        self.pid = pid
        self.tree = tree
        self._scan_every = max(1, scan_every)
        self._kids: list[int] = []
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
        if self.tree:
            self._tree_sample(s)
        p.peak_private = max(p.peak_private, s.get("private", 0))
        p.peak_rss = max(p.peak_rss, s.get("rss", 0))
        if p.samples % self._every == 0:
            p.timeline.append((round(time.perf_counter() - self._t0, 3), s.get("private", 0), s.get("rss", 0)))
        p.samples += 1
        return True

    def _tree_sample(self, root: dict[str, int]) -> None:
        """Add every descendant's ``status`` to ``root`` (in place) and keep each process's peak."""
        p = self.peaks
        if p.samples % self._scan_every == 0:
            self._kids = descendants(self.pid)
        own = {self.pid: dict(root)}
        for k in self._kids:
            st = read_status(k)
            if st is not None:
                own[k] = st
        p.max_processes = max(p.max_processes, len(own))
        rescan = p.samples % self._scan_every == 0
        now = round(time.perf_counter() - self._t0, 3)
        for pid, st in own.items():
            rec = p.per_process.get(pid)
            if rec is None:
                rec = p.per_process[pid] = {"cmd": _cmdline(pid) or "?", "peak_private": 0, "peak_rss": 0,
                                            "first_seen": now, "last_seen": now}
            elif rescan:  # a child seen between fork and exec still shows its parent's command line
                rec["cmd"] = _cmdline(pid) or rec["cmd"]
            rec["last_seen"] = now
            rec["peak_private"] = max(rec["peak_private"], st.get("private", 0))
            rec["peak_rss"] = max(rec["peak_rss"], st.get("rss", 0))
        root["private"] = sum(st.get("private", 0) for st in own.values())
        root["rss"] = sum(st.get("rss", 0) for st in own.values())

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
                 rollup_every: int = 50, tree: bool = False, cwd: str | None = None) -> ChildRun:
    """Run ``cmd`` in a fresh process, sampling its memory every ``interval`` seconds.

    The child may write a JSON object to ``result_path``; it is returned as ``result``.
    ``ru_maxrss`` is taken from ``wait4`` on this very child (not ``RUSAGE_CHILDREN``,
    which is a maximum over every child ever reaped). ``tree=True``: the peaks are of the
    sum over the child and all its descendants (see the module docstring).
    """
    if result_path and os.path.exists(result_path):
        os.unlink(result_path)
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = MemorySampler(proc.pid, interval, rollup_every=rollup_every, tree=tree).start()
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
