"""The type checker's gate: mypy over what ``[tool.mypy]`` in ``pyproject.toml`` lists (all
of ``nemo_convert`` and every plugin we ship) reports nothing. A plugin's hook implementations are
annotated (``-> list[ModelFamily]``), with no ``type: ignore``."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_gated_modules_type_check() -> None:
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout


def test_no_hook_implementation_silences_the_type_checker() -> None:
    offenders = []
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "*", "*.py"))):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "@hookimpl" and i + 1 < len(lines) and "type: ignore" in lines[i + 1]:
                offenders.append(f"{os.path.relpath(path, ROOT)}:{i + 2}")
    assert not offenders, offenders
