"""Option parsing: list options take repeats and comma lists; one wording for bad values;
help grouped into panels with one default style."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.cli.options import UsageError, many_of, one_of

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--kernel", "after", "--shape", "2,16", "--layout", "contiguous", "--device", "cpu",
         "--dtype", "fp64", "--zcg", "off", "--weight", "randn", "--format", "json",
         "--no-progress"]


def test_repeats_and_comma_lists_are_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    seen = []
    for args in (["--check", "dx,dw"], ["--check", "dx", "--check", "dw"],
                 ["--check", "dx", "--check", "dw,dx"]):
        assert cli.main(["run", *SMALL, *args]) == 0
        seen.append([r["check"] for r in json.loads(capsys.readouterr().out)["results"]])
    assert seen[0] == seen[1] == seen[2] == ["dx", "dw"], seen


def test_several_shapes_by_repeating_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *SMALL, "--check", "forward", "--shape", "3,8"]) == 0
    shapes = [r["shape"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert shapes == [[2, 16], [3, 8]], shapes  # SMALL's 2,16 and this 3,8, in order


@pytest.mark.parametrize(("args", "needle"), [
    (["--dtype", "fp8"], "--dtype 'fp8': expected one of fp64, fp32, bf16, fp16"),
    (["--check", "dx,grad"], "--check 'grad': expected one of forward, dx, dresidual"),
    (["--weight", "randn,"], "empty item"),
    (["--format", "html"], "--format 'html': expected one of table, text"),
])
def test_bad_choice_is_one_plain_line(args: list[str], needle: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Value error" not in err and len(err.splitlines()) == 1, err


def test_parsers() -> None:
    assert many_of("--weight", ["ones", "randn,ones"], ("randn", "ones")) == ["ones", "randn"]
    assert many_of("--kernel", None) is None
    assert one_of("--zcg", None, ("on",)) is None
    with pytest.raises(UsageError, match="expected one of on, off"):
        one_of("--zcg", "yes", ("on", "off"))


def test_help_is_grouped_and_shows_defaults_one_way() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-m", "gradcheck_bi", "run", "--help"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    text = p.stdout
    for panel in ("What to check", "Where it runs", "How to judge", "Output"):
        assert panel in text, f"no panel {panel!r}"
    assert text.index("What to check") < text.index("Where it runs") < text.index(
        "How to judge") < text.index("Output")
    assert "Default:" not in text  # one style: Typer's own [default: …]
    assert re.search(r"--seed .*\[default: \(?0\)?\]", text), "--seed shows no default"
    assert "<list[" not in text and "Exit codes" in text and "125" in text
