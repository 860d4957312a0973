"""pyproject.toml uses the metadata setuptools keeps accepting: an SPDX ``license`` string
(PEP 639; a ``{text = …}`` table is deprecated) and a setuptools that understands it."""

from __future__ import annotations

import os
import re

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PYPROJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")


def _pyproject() -> dict:  # type: ignore[type-arg]
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)


def test_license_is_an_spdx_expression() -> None:
    license_ = _pyproject()["project"]["license"]
    assert isinstance(license_, str) and re.fullmatch(r"[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*", license_)


def test_build_requires_a_setuptools_with_pep639() -> None:
    requires = _pyproject()["build-system"]["requires"]
    setuptools = [r for r in requires if re.match(r"setuptools\b", r)]
    assert len(setuptools) == 1
    m = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools[0].replace(" ", ""))
    assert m and int(m.group(1)) >= 77, setuptools
