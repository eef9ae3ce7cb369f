"""The same command twice gives byte-identical output, except JSON's top-level ``timing``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["run", "--device", "cpu", "--dtype", "fp64", "--shape", "2,3,40", "--layout", "contiguous",
        "--kernel", "before",
        "--kernel", "after", "--kernel", "tests/independent/rmsnorm_ref.py:IndependentRMSNorm"]


def gradcheck_bi(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "gradcheck_bi", *args], capture_output=True,
                          env=env, cwd=ROOT, timeout=300)


def without_timing(raw: bytes) -> bytes:
    """The JSON text with the top-level ``timing`` member cut out, byte for byte otherwise."""
    doc = json.loads(raw)
    assert list(doc)[-1] == "timing", "timing must be the last top-level key"
    cut = raw.rindex(b',\n  "timing"')
    return raw[:cut] + b"\n}\n"


def first_difference(a: bytes, b: bytes) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
             min(len(a), len(b)))
    return f"first difference at byte {i}: {a[i - 60:i + 60]!r} vs {b[i - 60:i + 60]!r}"


def test_json_is_identical_but_for_timing() -> None:
    first, second = gradcheck_bi(*ARGS, "--format", "json"), gradcheck_bi(*ARGS, "--format",
                                                                           "json")
    assert first.returncode == second.returncode == 0, second.stderr
    a, b = without_timing(first.stdout), without_timing(second.stdout)
    assert a == b, first_difference(a, b)
    assert len(json.loads(a)["results"]) == 3 * 24


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_text_reports_are_identical(fmt: str) -> None:
    first, second = (gradcheck_bi(*ARGS, "--check", "dx", "--format", fmt) for _ in range(2))
    assert first.returncode == second.returncode == 0, second.stderr
    assert first.stdout == second.stdout, first_difference(first.stdout, second.stdout)


def test_output_files_are_identical(tmp_path: Path) -> None:
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f in files:
        p = gradcheck_bi(*ARGS, "--check", "batch_invariance", "--format", "json", "--output",
                         str(f))
        assert p.returncode == 0, p.stderr
    a, b = (without_timing(f.read_bytes()) for f in files)
    assert a == b, first_difference(a, b)
