"""gate/verdict.py and what rides on it: nothing checked is never a pass, the API checks its
arguments before any kernel runs, crashes are located, gradcheck-bi's own bugs exit 4."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import gradcheck_bi
from gradcheck_bi import cli
from gradcheck_bi.gate import summarize, verdict_line
from gradcheck_bi.vocab import Result

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "kernels" / "hf_style.py"
NO_ZCG = ["run", "--kernel", f"{HF}:DoubleWeightNorm", "--zcg", "on", "--check", "dx",
          "--weight", "randn", "--shape", "3,32"]
TYPO = '''import torch

class Typo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered_gamma):
        return x * wieght

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None
'''


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _ok(kernel: str = "after") -> Result:
    return Result(kernel, "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, 1e-15, 1e-13,
                  "pass", "pass", True)


def test_zero_results_and_idle_kernels_never_pass() -> None:
    assert summarize([]).code == 3 and summarize([], strict=True).code == 1
    idle = [("mine.py:Norm", "zcg=on results not run")]
    assert summarize([_ok()], unchecked=idle).code == 3
    assert summarize([_ok()], unchecked=idle, strict=True).code == 1
    line = verdict_line(summarize([_ok()], unchecked=idle))
    assert line.startswith("VERDICT: NOTHING CHECKED") and "mine.py:Norm (zcg=on" in line, line
    assert summarize([_ok()]).code == 0


@pytest.mark.parametrize(("extra", "code"), [((), 3), (("--strict",), 1), (("--bisect",), 125)])
def test_a_kernel_without_zcg_run_at_zcg_on_checks_nothing(
        capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], code: int) -> None:
    got, out, err = run(capsys, *NO_ZCG, *extra, "--format", "text")
    assert got == code, (out, err)
    verdict = out.rstrip().splitlines()[-1]
    assert "NOTHING CHECKED" in verdict and "DoubleWeightNorm" in verdict, verdict
    assert "absent" in verdict  # why: zero_centered_gamma is absent


@pytest.mark.parametrize(("kernel", "extra", "code"), [
    ("after", (), 3), ("after", ("--strict",), 1), ("after", ("--bisect",), 125),
    ("torch", (), 3)])  # torch: without zcg, which is not why dz ran nothing
def test_a_check_of_another_op_checks_nothing_and_says_so(
        capsys: pytest.CaptureFixture[str], kernel: str, extra: tuple[str, ...], code: int
) -> None:
    got, out, err = run(capsys, "run", "--kernel", kernel, "--check", "dz", *extra)
    assert got == code, (out, err)
    verdict = out.rstrip().splitlines()[-1]
    assert "NOTHING CHECKED" in verdict, verdict
    assert "check dz does not apply to rms_norm, whose gradients are dx, dw" in verdict, verdict
    assert "zero_centered_gamma" not in verdict, verdict


def test_junit_and_json_of_a_run_that_checked_nothing(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code, out, _ = run(capsys, *NO_ZCG, "--format", "junit")
    root = ET.fromstring(out)
    assert code == 3 and root.get("tests") == "1" and root.get("skipped") == "1"
    skipped = root.find(".//skipped")
    assert skipped is not None and "nothing checked" in (skipped.get("message") or "")
    code, out, _ = run(capsys, *NO_ZCG, "--format", "json")
    doc = json.loads(out)
    assert code == 3 and doc["ok"] is False and doc["results"] == []
    assert doc["nothing_checked"][0]["kernel"].endswith("DoubleWeightNorm")


def _double_weight() -> type:
    sys.path.insert(0, str(HF.parent))
    try:
        from hf_style import DoubleWeightNorm
    finally:
        sys.path.remove(str(HF.parent))
    return DoubleWeightNorm


def test_api_nothing_checked_raises_and_zcg_strings_are_read() -> None:
    norm = _double_weight()
    with pytest.raises(gradcheck_bi.GradcheckSkipped) as skipped:
        gradcheck_bi.check(norm, zcg=[True], shapes=[(3, 16)])
    assert skipped.value.report.unchecked and not skipped.value.report.results
    with pytest.raises(gradcheck_bi.GradcheckFailure):
        gradcheck_bi.check(norm, zcg=[True], shapes=[(3, 16)], strict=True)
    # "off" is zcg=off (not the characters 'o', 'f', 'f'): the weight-twice dx fails there.
    with pytest.raises(gradcheck_bi.GradcheckFailure) as failed:
        gradcheck_bi.check(norm, zcg="off", checks="dx", weights="randn", shapes=(3, 16),
                           layouts="contiguous")
    assert [r.status for r in failed.value.report.results] == ["fail"]


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    ({"dtype": "float33"}, ValueError, "'float33' (did you mean 'float32'?)"),
    ({"weights": ["random"]}, ValueError, "argument 'weights'"),
    ({"checks": ["dxx"]}, ValueError, "(did you mean 'dx'?)"),
    ({"eps": [0.0]}, ValueError, "argument 'eps'"),
    ({"device": "gpu"}, ValueError, "(did you mean 'cuda'?)"),
    ({"shapes": [(4, 0)]}, ValueError, "argument 'shapes'"),
    ({"zcg": "sometimes"}, ValueError, "argument 'zcg'"),
    ({"weight": ["randn"]}, TypeError, "(did you mean 'weights'?)"),
])
def test_api_refuses_bad_arguments_before_any_kernel_runs(
        kwargs: dict[str, object], error: type[Exception], needle: str) -> None:
    calls = []

    def spy(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        calls.append(1)
        return x * weight

    with pytest.raises(error) as info:
        gradcheck_bi.check(spy, **kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value), str(info.value)
    assert not calls, "a kernel ran before the arguments were checked"


def test_api_takes_torch_dtypes_and_names() -> None:
    for dtype in (torch.float32, "float32", "fp32"):
        report = gradcheck_bi.check("after", dtype=dtype, checks="dx", weights="randn",
                                    zcg=False, shapes=(3, 16), layouts="contiguous")
        assert [r.dtype for r in report.results] == ["fp32"]


def test_a_crashing_kernel_is_located_in_text_json_and_debug(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "typo.py").write_text(TYPO)
    args = ["run", "--kernel", f"{tmp_path}/typo.py:Typo", "--check", "forward,dx",
            "--weight", "randn", "--shape", "3,16", "--layout", "contiguous"]
    code, out, _ = run(capsys, *args, "--format", "text")
    out = " ".join(out.split())  # the closing block wraps at 80 columns
    assert code == 1 and "typo.py:6 in forward" in out, out
    assert "the same error in 4 results" in out and out.count("wieght") == 1, out
    code, out, _ = run(capsys, *args, "--format", "json")
    errors = [r for r in json.loads(out)["results"] if r["status"] == "error"]
    assert len(errors) == 4 and all("typo.py:6 in forward" in r["message"] for r in errors)
    assert errors[0]["details"]["traceback"][-1].endswith("typo.py:6 in forward")
    code, out, err = run(capsys, *args, "--format", "text", "--debug")
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "(4 results)" in err and "return x * wieght" in err


def _machinery_slip() -> object:
    """A function whose code claims a file inside gradcheck_bi's machinery and raises a
    NameError there: what a slip of our own looks like in a traceback."""
    source = "def slip(*a, **k):\n    return undefined_in_gradcheck_bi\n"
    namespace: dict[str, object] = {}
    exec(compile(source, str(ROOT / "gradcheck_bi" / "checks" / "slip.py"), "exec"), namespace)
    return namespace["slip"]


def test_gradcheck_bis_own_bug_exits_4_and_stops_a_bisection(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    slip = _machinery_slip()
    monkeypatch.setattr("gradcheck_bi.checks.twins.run_check", slip)  # where points run it
    args = ["run", "--kernel", "after", "--check", "dx", "--weight", "randn", "--zcg", "off"]
    code, _, err = run(capsys, *args)
    assert code == 4 and "internal error" in err and "--debug" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert run(capsys, *args, "--bisect")[0] == 255


def test_a_loosened_run_against_a_baseline_says_so_once_per_result(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = str(tmp_path / "b.json")
    args = ["run", "--kernel", "after", "--check", "dx,dw", "--shape", "3,32", "--format",
            "text", "--layout", "contiguous", "--baseline", base]
    assert run(capsys, *args, "--update-baseline")[0] == 0
    code, out, _ = run(capsys, *args, "--rtol", "1e-3")
    text = " ".join(out.split())  # the log layout wraps long lines
    assert code == 1 and text.count("✗ drift:") == 12, out  # 2 checks × 3 γ × 2 zcg
    assert text.count("rtol none → 0.001") == 12, out
    # γ = zeros: dx's reference is 0, so rtol × |reference| moves nothing there.
    assert text.count("tolerance loosened") == 10, out
    assert text.count("tolerance settings changed (the tolerance did not move)") == 2, out
    assert "not in the baseline" not in out and "not run" not in out
    assert out.rstrip().splitlines()[-1].startswith("VERDICT: BASELINE DRIFT — 12 of 12")


def test_plot_names_a_crashing_kernel_and_exits_1(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    """plot judges nothing, but a kernel that raises is the kernel's failure, located in its
    own file: exit 1, never 4 (gradcheck-bi's own bug)."""
    (tmp_path / "typo.py").write_text(TYPO)
    code = cli.main(["plot", "--kernel", f"{tmp_path}/typo.py:Typo", "--format", "json"])
    err = capsys.readouterr().err
    assert code == 1 and "typo.py:6 in forward" in err and "internal" not in err, err
