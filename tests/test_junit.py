"""JUnit output: valid XML, one testcase per result, the right failure/error/skip counts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.gate.baseline import Drift, key_of
from gradcheck_bi.report.junit import case_name, to_junit
from gradcheck_bi.vocab import Result

ROOT = Path(__file__).resolve().parents[1]
USER = ROOT / "tests" / "kernels" / "user_rmsnorm.py"
MEGATRON = ROOT / "tests" / "kernels" / "megatron_like.py"


def _run(capsys: pytest.CaptureFixture[str], fmt: str, out: Path) -> int:
    code = cli.main(["run", "--kernel", f"{USER}:DxDoubleWeight", "--kernel",
                     f"{USER}:RaisesInBackward", "--kernel", f"{MEGATRON}:BatchInvariantRMSNormFn",
                     "--kernel", "before", "--shape", "3,2,24", "--layout", "contiguous",
                     "--check", "forward",
                     "--check", "dx", "--no-progress", "--format", fmt, "--output", str(out)])
    capsys.readouterr()
    return code


def test_cli_junit_counts_match_the_results(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    code = _run(capsys, "junit", tmp_path / "r.xml")
    assert code == 1
    assert _run(capsys, "json", tmp_path / "r.json") == 1
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    root = ET.parse(tmp_path / "r.xml").getroot()  # raises if not well-formed XML
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(results) == int(root.get("tests", -1))
    unexpected = [r for r in results if not r["as_expected"] and r["status"] in ("pass", "fail")]
    errors = [r for r in results if r["status"] == "error"]
    skipped = [r for r in results if r["status"] == "unsupported"]
    # DxDoubleWeight: dx γ=randn × 2 zcg; before's declared defects are expected, not failures
    assert len(unexpected) == 2 and errors and skipped
    assert int(root.get("failures", -1)) == len(unexpected) == len(root.findall(".//failure"))
    assert int(root.get("errors", -1)) == len(errors) == len(root.findall(".//error"))
    assert int(root.get("skipped", -1)) == len(skipped) == len(root.findall(".//skipped"))
    for suite in root.findall("testsuite"):
        n = len(suite.findall("testcase"))
        assert int(suite.get("tests", -1)) == n
        assert int(suite.get("failures", -1)) == len(suite.findall(".//failure"))
    names = [(c.get("classname"), c.get("name")) for c in cases]
    assert len(set(names)) == len(names), "reporters drop testcases with duplicate names"
    failure = root.find(".//failure")
    assert failure is not None and "DxDoubleWeight dx" in (failure.text or "")
    assert "γ=randn" in (failure.get("message") or "")
    err = root.find(".//error")
    assert err is not None and "backward not implemented" in (err.text or "")


def _result(**kw: object) -> Result:
    base: dict = dict(kernel="k.py:Fn", check="dx", device="cpu", dtype="fp64", shape=[2, 8],
                      eps=1e-6, seed=0, weight="randn", zero_centered_gamma=False,
                      max_abs_err=1e-15, tolerance=1e-13, status="pass", expected="pass",
                      as_expected=True)
    base.update(kw)
    return Result(**base)


def test_drift_fails_a_passing_testcase_and_missing_results_get_their_own() -> None:
    a, b = _result(), _result(weight="ones")
    gone = key_of(_result(weight="zeros"))
    drifts = [Drift(key_of(a), "error grew", "drift: grew 100×"),
              Drift(gone, "missing", "drift: recorded but not run")]
    root = ET.fromstring(to_junit([a, b], drifts))
    assert root.get("tests") == "3" and root.get("failures") == "2"
    fails = root.findall(".//failure")
    assert {f.get("type") for f in fails} == {"baseline-drift"}
    assert any("grew 100×" in (f.text or "") for f in fails)


def test_control_characters_in_kernel_messages_stay_valid_xml() -> None:
    r = _result(status="error", as_expected=False, max_abs_err=None, tolerance=None,
                message="bad\x00byte\x1b[31m & <tag>")
    root = ET.fromstring(to_junit([r]))
    text = root.find(".//error").text  # type: ignore[union-attr]
    assert text is not None and "& <tag>" in text and "\x00" not in text


def test_row_op_results_that_differ_only_in_an_op_axis_get_their_own_names() -> None:
    # GitLab keeps the first of two testcases sharing (classname, name): a layer norm's
    # β = randn and β = zeros results, or a gated norm's two group sizes, must differ.
    rows = [_result(op="layer_norm", bias="randn"), _result(op="layer_norm", bias="zeros"),
            _result(op="rms_norm_gated", group_size=4, norm_before_gate=True),
            _result(op="rms_norm_gated", group_size=8, norm_before_gate=True),
            _result(op="rms_norm_gated", group_size=8, norm_before_gate=False)]
    names = [c.get("name") for c in ET.fromstring(to_junit(rows)).iter("testcase")]
    assert len(set(names)) == len(rows), names
    assert names[1].endswith("β=zeros") and names[4].endswith(  # type: ignore[union-attr]
        "group_size=8 norm_before_gate=off"), names


def test_a_testcase_name_spells_each_control_once() -> None:
    r = Result("after", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "ones", True, 0.5, 1e-13,
               "fail", "pass", False, layout="x-strided")
    name = case_name(r)
    assert name == "cpu/fp64 shape=2x8 γ=ones zcg=on eps=1e-06 seed=0 layout=x-strided", name
