"""``pytest -q`` prints dots and the summary, nothing else (issue 20: a quantization table
appeared among the dots). A test's output is captured, shown when it fails or with ``-rP``;
no test writes past the capture."""

from __future__ import annotations

import ast
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
#: What writes around pytest's capture: its ``capsys``/``capfd`` switched off, the
#: interpreter's original streams, or the terminal itself.
ESCAPES = ("disabled", "__stdout__", "__stderr__", "/dev/tty")


def test_no_test_writes_around_the_capture():
    found = []
    for name in sorted(os.listdir(TESTS)):
        if not name.endswith(".py") or name == os.path.basename(__file__):
            continue
        with open(os.path.join(TESTS, name), encoding="utf-8") as f:
            tree = ast.parse(f.read(), name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ESCAPES[:3]:
                found.append(f"{name}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value == ESCAPES[3]:
                found.append(f"{name}:{node.lineno}: {node.value}")
    assert found == [], found
