#!/usr/bin/env python
"""Start-up benchmark: how long ``nemo-convert`` takes before it does any work.

Times, as whole processes, ``nemo-convert --help``, every ``COMMAND --help`` (sub-commands
too: ``tokenizer add-tokens --help``) and ``inspect`` of four tiny checkpoints — an HF
folder, a ``.nemo`` in the dist and in the legacy layout, and a Megatron-Bridge directory
(a Megatron-Core ``torch_dist`` checkpoint) — side by side with the interpreter's own
floor (``python -c pass``) and ``python -c "import torch"``. Each case runs once to warm
the page cache and the bytecode caches (discarded), then ``--repeat`` times (hyperfine's
method, in Python): the median and the best wall time, and the median CPU time (user +
system of the child: what a busy machine does not inflate as much as wall time). One more
run under ``python -X importtime`` says whether the case imported torch, transformers or
``safetensors.torch`` (the ``loads`` column).

    python bench/bench_startup.py                       # every case, 10 runs each
    python bench/bench_startup.py --repeat 20 --cases help,inspect-nemo-dist
    python bench/bench_startup.py --snapshot main       # the code of another revision

Results: a Markdown table on stdout, ``bench/out/startup.md`` and ``bench/out/startup.json``.
Targets (issue 20): every ``--help`` ≤ 0.3 s, every ``inspect`` ≤ 0.5 s, and none of them
loads torch. See ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HEAVY = ("torch", "transformers", "safetensors.torch")
FIXTURES = {  # case → the fixture inspect reads
    "inspect-hf": "hf",
    "inspect-nemo-dist": "dist.nemo",
    "inspect-nemo-legacy": "legacy.nemo",
    "inspect-megatron-dist": "megatron-bridge",
}

#: ``--snapshot``: a copy of the code (``git archive``) that every child imports instead of
#: the working tree (plugins included: they decide what every command imports).
CODE: str | None = None
PYCACHE = os.path.join(HERE, "out", "startup", "pycache")


def child_env() -> dict[str, str]:
    """Bytecode cached (as after ``pip install``, which compiles it) in a folder of the
    workdir, whatever ``PYTHONDONTWRITEBYTECODE`` says: compiling every module on every run
    would be measured otherwise. ``PYTHONPATH`` points at the snapshot, if any."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    if CODE:
        path = os.pathsep.join((CODE, os.path.join(CODE, "plugins")))
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def program() -> list[str]:
    """How a user runs the tool: the console script beside this interpreter (a Python
    file, so ``-X importtime`` can be put in front of it), else ``-m nemo_convert``."""
    script = os.path.join(os.path.dirname(sys.executable), "nemo-convert")
    return [sys.executable, script] if os.path.isfile(script) else [sys.executable, "-m", "nemo_convert"]


def commands() -> list[list[str]]:
    """Every command and sub-command of the parser (without loading the plugins)."""
    sys.path.insert(0, CODE or REPO)
    from nemo_convert.cli.main import build_parser  # the parser only: no torch

    out: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append(prefix + [name])
                    walk(sub, prefix + [name])

    walk(build_parser(plugin_options=False), [])
    return out


def cases(work: str) -> dict[str, list[str]]:
    prog = program()
    out = {"python -c pass": [sys.executable, "-c", "pass"],
           "import torch": [sys.executable, "-c", "import torch"],
           "help": prog + ["--help"]}
    for cmd in commands():
        out[f"{' '.join(cmd)} --help"] = prog + cmd + ["--help"]
    for case, fixture in FIXTURES.items():
        out[case] = prog + ["inspect", os.path.join(work, fixture)]
    return out


def make_fixtures(work: str) -> None:
    """The tiny checkpoints inspect reads (made once, with the working tree's code)."""
    hf = os.path.join(work, "hf")
    if all(os.path.exists(os.path.join(work, f)) for f in FIXTURES.values()):
        return
    subprocess.run([sys.executable, "-c", "import sys; from nemo_convert.examples import make_tiny_llama; "
                    "make_tiny_llama(sys.argv[1])", hf], check=True, cwd=REPO)
    prog = [sys.executable, "-m", "nemo_convert"]
    for out, extra in (("dist.nemo", []), ("legacy.nemo", ["--layout", "legacy"]),
                       ("megatron-bridge", ["--to", "megatron-bridge"])):
        subprocess.run(prog + ["import", hf, "-o", os.path.join(work, out), "--quiet", "--overwrite", *extra],
                       check=True, cwd=REPO)


def run_once(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and exit status of one run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                            cwd=CODE or REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def heavy_imports(argv: list[str]) -> list[str]:
    """Which of :data:`HEAVY` the command imports (``-X importtime`` lists every module)."""
    cmd = [argv[0], "-X", "importtime", *argv[1:]]
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(),
                         cwd=CODE or REPO)
    names = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    return [h for h in HEAVY if h in names]


def measure(argv: list[str], repeat: int) -> dict[str, Any]:
    run_once(argv)  # warm-up: page cache, __pycache__
    runs = [run_once(argv) for _ in range(repeat)]
    walls, cpus = [w for w, _, _ in runs], [c for _, c, _ in runs]
    return {"argv": argv[1:], "wall_median": statistics.median(walls), "wall_best": min(walls),
            "cpu_median": statistics.median(cpus), "exit": sorted({rc for _, _, rc in runs}),
            "loads": heavy_imports(argv), "walls": walls, "cpus": cpus}


def snapshot(rev: str, work: str) -> str:
    """``git archive`` of ``rev`` into ``work/code-SHA`` (reused when there)."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    dest = os.path.join(work, f"code-{sha[:12]}")
    if not os.path.isdir(dest):
        os.makedirs(dest + ".tmp", exist_ok=True)
        archive = subprocess.Popen(["git", "-C", REPO, "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", dest + ".tmp"], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {rev} failed")
        os.rename(dest + ".tmp", dest)
    return dest


def markdown(res: dict[str, Any]) -> str:
    lines = [f"Start-up times ({res['code']}; {res['repeat']} runs per case after a warm-up; "
             f"{res['machine']}; load average {res['load_start'][0]:.1f} at start, {res['load_end'][0]:.1f} at end)",
             "", "| case | wall median (s) | wall best (s) | CPU median (s) | loads | exit |",
             "|---|---:|---:|---:|---|---|"]
    for name, r in res["cases"].items():
        lines.append(f"| `{name}` | {r['wall_median']:.3f} | {r['wall_best']:.3f} | {r['cpu_median']:.3f} | "
                     f"{', '.join(r['loads']) or '—'} | {','.join(map(str, r['exit']))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    global CODE, PYCACHE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10, help="measured runs per case (default 10)")
    ap.add_argument("--cases", help="comma-separated case names (default: all; see --list)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--snapshot", metavar="REV", help="measure the code of git revision REV (a git archive copy)")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out", "startup"), help="fixtures and snapshots")
    ap.add_argument("--results", default=os.path.join(HERE, "out"), help="where startup.md/.json go")
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    PYCACHE = os.path.join(args.workdir, "pycache")
    if args.snapshot:
        CODE = snapshot(args.snapshot, args.workdir)
    all_cases = cases(args.workdir)
    if args.list:
        print("\n".join(all_cases))
        return 0
    chosen = args.cases.split(",") if args.cases else list(all_cases)
    unknown = [c for c in chosen if c not in all_cases]
    if unknown:
        raise SystemExit(f"unknown case(s): {', '.join(unknown)} (see --list)")
    make_fixtures(args.workdir)
    load_start = os.getloadavg()
    measured = {}
    for name in chosen:
        measured[name] = measure(all_cases[name], args.repeat)
        r = measured[name]
        print(f"{name:32s} wall {r['wall_median']:.3f} s (best {r['wall_best']:.3f}), cpu {r['cpu_median']:.3f} s"
              f"{'  loads ' + ', '.join(r['loads']) if r['loads'] else ''}", file=sys.stderr, flush=True)
    res = {"code": f"snapshot of {args.snapshot}" if args.snapshot else "working tree", "repeat": args.repeat,
           "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}", "load_start": load_start,
           "load_end": os.getloadavg(), "cases": measured}
    table = markdown(res)
    print(table)
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "startup.md"), "w", encoding="utf-8") as f:
        f.write(table)
    with open(os.path.join(args.results, "startup.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
