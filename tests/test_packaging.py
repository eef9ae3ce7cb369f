"""pyproject.toml: a licence setuptools accepts without a deprecation warning, and the
non-Python files the package needs at run time declared as package data."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_with_a_setuptools_that_reads_it() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert doc["project"]["license"] == "Apache-2.0"  # a table form warns on setuptools ≥ 77
    (req,) = [r for r in doc["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.search(r">=(\d+)", req)
    assert floor and int(floor.group(1)) >= 77, req  # SPDX strings need setuptools 77


def test_the_c_source_of_the_cpu_sums_ships_with_the_package() -> None:
    """fd/_c_fd.py builds fd/_level_sums.c on the user's machine: a wheel without it would
    silently fall back to the slower sums."""
    from gradcheck_bi.fd import _c_fd

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = doc["tool"]["setuptools"]["package-data"]["gradcheck_bi.fd"]
    assert _c_fd.SOURCE.is_file() and any(_c_fd.SOURCE.match(p) for p in patterns), patterns
