"""pyproject.toml: a licence setuptools accepts without a deprecation warning."""

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
