"""The terminal and CI-log layout: nothing cut or split at any width ≥ 80, TTY or not."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.report.text import LEGEND, display_names, glyph, plain, table_lines
from gradcheck_bi.vocab import Result

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SWEEP = ["--check", "forward,dx", "--shape", "2,8,64", "--device", "cpu", "--dtype", "fp64",
         "--no-progress"]


@pytest.fixture(scope="module")
def long_kernel(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The user kernels file, deep in a folder with a long name (as in a real repository)."""
    folder = tmp_path_factory.mktemp("kernels").joinpath(
        "a_rather_long_repository_name", "src", "model_components", "normalization_layers")
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "kernels" / "user_rmsnorm.py", folder / "user_rmsnorm.py")
    path = folder / "user_rmsnorm.py"
    return f"{path}:DxDoubleWeight,{path}:Correct"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def numbers(long_kernel: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("json") / "r.json"
    assert cli.main(["run", "--kernel", long_kernel, *SWEEP, "--format", "json",
                     "--output", str(out)]) == 1
    return json.loads(out.read_text())["results"]


def whole(number: str, text: str) -> bool:
    return re.search(rf"(?<![\w.+-]){re.escape(number)}(?![\w.])", text) is not None


@pytest.mark.parametrize("tty", [False, True], ids=["piped", "tty"])
@pytest.mark.parametrize("width", [80, 100, 160])
def test_every_error_and_tolerance_appears_whole(
        width: int, tty: bool, long_kernel: str, numbers: list[dict],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.delenv("NO_COLOR", raising=False)
    if tty:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    code, out, _ = run(capsys, "run", "--kernel", long_kernel, *SWEEP)
    assert code == 1
    assert ("\x1b[" in out) == tty, "colour exactly when the terminal is forced"
    text = ANSI.sub("", out)
    tables, _, closing = text.partition("\nnot as expected:")
    assert closing, "the run ends with the ranked failure summary"
    assert text.rstrip().splitlines()[-1].startswith("VERDICT: NOT AS EXPECTED")
    # only a single token longer than the width (the footnote's path) may overhang
    too_wide = [line for line in tables.splitlines()
                if len(line) > width and len(line.split()) > 1]
    assert not too_wide, f"lines wider than {width}: {too_wide}"
    for r in numbers:
        for key in ("max_abs_err", "tolerance"):
            value = r[key]
            shown = "0" if value == 0 else f"{value:.3e}"
            assert whole(shown, tables), (
                f"{key} {shown} of {r['kernel']} {r['check']} γ={r['weight']} "
                f"zcg={r['zero_centered_gamma']} missing or cut at width {width}")
    assert "user_rmsnorm.py:DxDoubleWeight" in tables  # the full ref, in the footnote
    for word in ("γ=randn", "γ=ones (control)", "γ=zeros", "tol", "worst at"):
        assert word in tables


def test_long_names_get_an_alias_and_a_footnote() -> None:
    refs = ["after", "/very/long/path/to/some/project/kernels/norms.py:FusedRMSNormWithZcg",
            "/x/short.py:Fn", "/y/short.py:Fn"]
    names = display_names(refs)
    assert names["after"] == "after" and names["/x/short.py:Fn"] == "short.py:Fn"
    assert len(names[refs[1]]) <= 16 and names[refs[3]] not in (names[refs[2]], "short.py:Fn")
    assert len(set(names.values())) == len(refs)


def _result(status: str, expected: str, err: float | None = 1.0) -> Result:
    return Result("k", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, err, 1e-11,
                  status, expected, status == expected, worst=[0, 1])


def test_glyphs_tell_expected_from_unexpected_without_colour() -> None:
    assert glyph(_result("pass", "pass"))[0] == "✓"
    # An expected failure (a declared defect shown) shares no mark with an unexpected one,
    # and the legend says what each means.
    assert glyph(_result("fail", "fail"))[0] == "x"
    assert glyph(_result("fail", "pass"))[0] == "✗!"
    assert "x expected failure" in LEGEND and "✗! unexpected failure" in LEGEND, LEGEND
    assert glyph(_result("pass", "fail"))[0] == "✓!"
    assert glyph(_result("error", "pass", None))[0] == "ERROR!"
    assert glyph(_result("fail", "fail"))[1] != glyph(_result("pass", "pass"))[1]


def test_too_narrow_for_the_grid_falls_back_to_one_result_per_line() -> None:
    from gradcheck_bi.report.tables import build_tables

    results = [_result("fail", "pass"), _result("pass", "pass", 3e-12)]
    results[1].weight = "ones"
    text = plain(table_lines(build_tables(results), width=40))
    assert "k cpu fp64 γ=randn: 1.000e+00 ✗! tol 1.000e-11 at [0,1]" in text, text
    assert "k cpu fp64 γ=ones: 3.000e-12 ✓" in text, text


