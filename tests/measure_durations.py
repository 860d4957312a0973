"""Measure which tests are slow and write ``tests/measured_slow.txt``.

``pytest -m "not slow"`` is the suite a developer runs after each edit; it must stay under a
minute on a 2-core machine, even with other work beside it (issue 20, item 11). Tests marked
``@pytest.mark.slow`` by hand are the end-to-end ones (subprocesses, torchrun, Megatron-Core,
transformers logits). Every other test that *measures* slow — its call, setup and teardown
together at least ``--threshold`` seconds — is listed in ``tests/measured_slow.txt``, and
``tests/conftest.py`` marks it ``slow`` too. The full suite (``pytest -q``, CI) runs both.

    python tests/measure_durations.py                 # runs the not-slow suite, rewrites the list
    python tests/measure_durations.py --from-log LOG  # from a saved `pytest --durations=0` output
    python tests/measure_durations.py --add           # a second pass over what is left

A first pass sets ``NEMO_CONVERT_MEASURE=1`` so that the listed tests run and are measured
again (a test that became fast leaves the list); ``--add`` then runs what is left and adds
what measures slow there. Measure on a machine without other work.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
LIST = os.path.join(HERE, "measured_slow.txt")
LINE = re.compile(r"^(?P<s>[\d.]+)s (?P<phase>call|setup|teardown)\s+(?P<node>\S.*?)\s*$")  # ids may hold spaces
#: A setup this long is a module's shared fixture (it moves to the next test when its first
#: user is listed): the module's tests are listed together.
MODULE_SETUP = 1.0


def durations(log: str) -> dict[str, float]:
    """Seconds per test node id: call, setup and teardown added up (a module fixture's setup
    counts for the first test that uses it). A test of a module where some setup took
    ``MODULE_SETUP`` seconds or more counts at least that long."""
    per: dict[str, float] = defaultdict(float)
    heavy: set[str] = set()
    for line in log.splitlines():
        m = LINE.match(line.strip())
        if m:
            per[m["node"]] += float(m["s"])
            if m["phase"] == "setup" and float(m["s"]) >= MODULE_SETUP:
                heavy.add(m["node"].split("::")[0])
    return {node: max(s, MODULE_SETUP) if node.split("::")[0] in heavy else s for node, s in per.items()}


def listed() -> dict[str, float]:
    """The tests ``tests/measured_slow.txt`` lists now, with their recorded seconds."""
    if not os.path.exists(LIST):
        return {}
    out = {}
    with open(LIST) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                node, _, rest = line.rstrip("\n").rpartition("  # ")
                out[node.strip()] = float(rest.split()[0])
    return out


def write_list(per: dict[str, float], threshold: float, note: str) -> list[str]:
    slow = sorted(node for node, s in per.items() if s >= threshold)
    total = sum(per.values())
    kept = sum(s for node, s in per.items() if s < threshold)
    with open(LIST, "w") as f:
        f.write(f"# tests that measured >= {threshold} s (call + setup + teardown): tests/conftest.py marks them slow.\n"
                f"# Written by tests/measure_durations.py ({note}): {len(per)} tests took {total:.0f} s;\n"
                f"# the {len(per) - len(slow)} below the threshold took {kept:.0f} s of it.\n")
        for node in slow:
            f.write(f"{node}  # {per[node]:.2f} s\n")
    return slow


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threshold", type=float, default=0.1, help="seconds (default 0.1)")
    p.add_argument("--from-log", help="a saved `pytest --durations=0`-style output instead of a run")
    p.add_argument("--add", action="store_true",
                   help="keep the tests listed now and add those of this measure (a second pass: a module fixture's "
                        "setup moves to the first test left in the not-slow suite)")
    args = p.parse_args()
    if args.from_log:
        with open(args.from_log) as f:
            log, note = f.read(), f"from {os.path.basename(args.from_log)}"
    else:
        env = dict(os.environ) if args.add else dict(os.environ, NEMO_CONVERT_MEASURE="1")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "--durations=0",
                               "--durations-min=0", "-p", "no:cacheprovider"], cwd=os.path.dirname(HERE), env=env,
                              capture_output=True, text=True, check=False)
        log, note = proc.stdout, "a run of the not-slow suite"
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            return proc.returncode
    per = durations(log)
    if not per:
        print("no durations found", file=sys.stderr)
        return 1
    if args.add:
        per = {**per, **listed()}
        note += ", added to the earlier list"
    slow = write_list(per, args.threshold, note)
    print(f"{len(slow)} of {len(per)} tests measured >= {args.threshold} s; listed in {os.path.relpath(LIST)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
