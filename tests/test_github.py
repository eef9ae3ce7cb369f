"""``--format github``: workflow commands GitHub turns into annotations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradcheck_bi import cli

KERNEL = "tests/kernels/user_rmsnorm.py:DxDoubleWeight"


def test_annotations_for_a_defective_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "--kernel", KERNEL, "--check", "dx,forward", "--shape", "2,8,64",
                     "--device", "cpu", "--dtype", "fp64", "--layout", "contiguous",
                     "--format", "github"])
    out, err = capsys.readouterr()
    assert code == 1
    lines = out.splitlines()
    command = re.compile(r"^::(error|warning|notice) ([a-z]+=[^:,]*)(,[a-z]+=[^:,]*)*::.+$")
    assert all(command.match(line) for line in lines), lines
    errors = [line for line in lines if line.startswith("::error file=tests/kernels/")]
    assert len(errors) == 1, lines  # one per kernel and check: dx (forward passes)
    assert "title=gradcheck-bi%3A user_rmsnorm.py%3ADxDoubleWeight dx" in errors[0]
    assert "max |err|" in errors[0] and "worst of 2" in errors[0]
    assert lines[-1].startswith("::error title=gradcheck-bi verdict::VERDICT: NOT AS EXPECTED")
    assert err.rstrip().splitlines()[-1].startswith("VERDICT")  # the log still ends with it


def test_a_passing_run_is_one_notice(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--kernel", "after", "--check", "forward", "--shape", "2,16",
                     "--format", "github"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("::notice title=gradcheck-bi verdict::VERDICT: all") and \
        out.count("\n") == 1


def test_a_kernel_error_is_annotated_at_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An error's annotation carries the file and line of the kernel's innermost frame, the
    place its message names; a wrong gradient has no line to point at, only the file."""
    source = "tests/kernels/user_rmsnorm.py"
    code = cli.main(["run", "--kernel", f"{source}:RaisesInBackward", "--kernel",
                     f"{source}:DxDoubleWeight", "--check", "dx", "--shape", "2,16",
                     "--zcg", "off", "--layout", "contiguous", "--format", "github"])
    out = capsys.readouterr().out
    assert code == 1
    lines = Path(source).read_text().splitlines()
    raised = next(n for n, text in enumerate(lines, 1) if "raise ValueError" in text)
    errors = [line for line in out.splitlines() if line.startswith("::error file=")]
    assert len(errors) == 2, out
    at = f"::error file={source},line={raised},title=gradcheck-bi%3A "
    assert any(e.startswith(at) and f"(at {source}:{raised} in backward)" in e
               for e in errors), out
    assert any(e.startswith(f"::error file={source},title=") and "DxDoubleWeight" in e
               for e in errors), out
