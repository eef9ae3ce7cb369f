"""The pytest plugin (gradcheck_bi/pytest_plugin.py): points as items, the fixture, xdist.

Each test runs pytest inside pytest (``pytester``) on a tiny sweep (shape 3×16, a few
checks). The plugin is named with ``-p`` so that these run from a source checkout too; an
installed package registers it by its entry point under the same name.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# Imported here, so that pytester's in-process runs find them loaded (it unloads what a
# run imported, and torch cannot be imported twice).
import gradcheck_bi.api
import gradcheck_bi.cases
import gradcheck_bi.cli.options
import gradcheck_bi.measure
import gradcheck_bi.pytest_plugin
import gradcheck_bi.report.summary
import gradcheck_bi.runner
import gradcheck_bi.upfront  # noqa: F401

pytest_plugins = ["pytester"]

# (imported above, so pytest cannot rewrite its asserts: it has none to rewrite)
PLUGIN = ("-p", "gradcheck_bi.pytest_plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning")
SMALL = ("--gradcheck-bi-arg", "shape=3,16")
WRONG = "gradcheck_bi.kernels.bundled.rmsnorm:Before"  # the defective kernel as a user's: must pass


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", *args)


def ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("gradcheck-bi::")]


def test_entry_point_registers_the_plugin() -> None:
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"gradcheck_bi.pytest_plugin" = "gradcheck_bi.pytest_plugin"' in text
    found = [ep for ep in importlib.metadata.entry_points(group="pytest11")
             if ep.value == "gradcheck_bi.pytest_plugin"]
    if not found:
        pytest.skip("this environment installed gradcheck-bi before the entry point existed")
    assert found[0].name == "gradcheck_bi.pytest_plugin"  # -p with its name is then a no-op


def test_one_item_per_point_with_readable_stable_ids(pytester: pytest.Pytester) -> None:
    args = ("--gradcheck-bi", "before", *SMALL, "--gradcheck-bi-arg", "check=forward,dx",
            "--collect-only", "-q")
    first, second = run(pytester, *args), run(pytester, *args)
    assert ids(first) == ids(second)  # stable: xdist's workers must agree
    assert len(ids(first)) == 18, first.outlines  # (3 γ + 2 layouts at randn) × 2 zcg + …
    assert "gradcheck-bi::before[rms_norm-dx-cpu-fp64-3x16-γrandn-zcg_off]" in ids(first)
    assert "gradcheck-bi::before[rms_norm-dx-cpu-fp64-3x16-γrandn-zcg_on-x-strided]" in ids(first)


def test_declared_defects_xfail_and_the_rest_pass(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--gradcheck-bi", "before", *SMALL,
                 "--gradcheck-bi-arg", "check=dx", "--gradcheck-bi-arg", "layout=contiguous")
    result.assert_outcomes(passed=2, xfailed=4)
    assert result.ret == pytest.ExitCode.OK


def test_a_point_not_as_expected_fails_with_the_tools_one_line(
        pytester: pytest.Pytester) -> None:
    junit = pytester.path / "out.xml"
    result = run(pytester, "--gradcheck-bi", WRONG, *SMALL, "-k", "dx and zcg_off and γrandn",
                 "--gradcheck-bi-arg", "layout=contiguous", f"--junitxml={junit}")
    result.assert_outcomes(failed=1, deselected=23)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    line = next(x for x in result.outlines if x.startswith(f"{WRONG} dx cpu/fp64"))
    assert "fail (expected pass)" in line and "> tol" in line
    assert "Traceback" not in result.stdout.str() and "pytest_plugin.py" not in result.stdout.str()
    case = ET.parse(junit).getroot().find(".//testcase")
    assert case is not None
    assert case.get("name") == f"{WRONG}[rms_norm-dx-cpu-fp64-3x16-γrandn-zcg_off]"
    failure = case.find("failure")
    assert failure is not None and line in (failure.get("message") or "")


def test_k_selects_a_check_and_x_stops_at_the_first_failure(pytester: pytest.Pytester) -> None:
    chosen = run(pytester, "--gradcheck-bi", "after", *SMALL, "-k", "dw", "--co", "-q")
    assert ids(chosen) and all("-dw-" in i for i in ids(chosen))
    stopped = run(pytester, "--gradcheck-bi", WRONG, *SMALL, "--gradcheck-bi-arg", "check=dx",
                  "-x")
    stopped.assert_outcomes(failed=1, passed=0)


def test_last_failed_reruns_only_the_failed_points(pytester: pytest.Pytester) -> None:
    args = ("--gradcheck-bi", WRONG, *SMALL, "--gradcheck-bi-arg", "check=dx",
            "--gradcheck-bi-arg", "layout=contiguous", "--gradcheck-bi-arg", "weight=randn,ones")
    pytester.runpytest(*PLUGIN, *args).assert_outcomes(passed=1, failed=3)
    again = pytester.runpytest(*PLUGIN, *args, "--lf")
    again.assert_outcomes(failed=3, deselected=1)


def test_unsupported_is_a_skip_with_its_reason(pytester: pytest.Pytester) -> None:
    if importlib.util.find_spec("torch") and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is present: cuda points run")
    result = run(pytester, "--gradcheck-bi", "after", *SMALL, "--gradcheck-bi-arg", "device=cuda",
                 "--gradcheck-bi-arg", "check=dx", "-rs")
    result.assert_outcomes(skipped=10)
    result.stdout.fnmatch_lines(["*unsupported here: *"])
    assert result.ret == pytest.ExitCode.OK


def test_case_file_and_strict_markers(pytester: pytest.Pytester) -> None:
    case = pytester.makefile(".toml", tiny='kernels = ["after"]\nshapes = [[2, 8]]\n'
                             'checks = ["forward"]\nweights = ["ones"]\nzcg = [false]\n')
    result = run(pytester, "--gradcheck-bi", "after", f"--gradcheck-bi-case={case}",
                 "--strict-markers", "-m", "gradcheck_bi", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*after?rms_norm-forward-cpu-fp64-2x8-γones-zcg_off? PASSED*"])


def test_bad_input_is_one_usage_line(pytester: pytest.Pytester) -> None:
    bad_arg = run(pytester, "--gradcheck-bi", "after", "--gradcheck-bi-arg", "shap=3,16")
    assert bad_arg.ret == pytest.ExitCode.USAGE_ERROR
    bad_arg.stderr.fnmatch_lines(["*--gradcheck-bi-arg 'shap=3,16'*(did you mean 'shape'?)"])
    no_kernel = run(pytester, "--gradcheck-bi", "nowhere.py:Fn")
    assert no_kernel.ret == pytest.ExitCode.USAGE_ERROR
    assert "Traceback" not in no_kernel.stderr.str()


def test_fixture_fails_the_test_with_the_tools_lines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_norm=f"""
        def test_correct(gradcheck_bi):
            assert gradcheck_bi.check("after", checks=["dx"], shapes=[(3, 16)]).ok

        def test_wrong(gradcheck_bi):
            gradcheck_bi.check("{WRONG}", checks=["dx"], weights=["randn"], zcg=False,
                               shapes=[(3, 16)])

        def test_bad_option(gradcheck_bi):
            gradcheck_bi.check("after", check=["dx"])
    """)
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "gradcheck-bi: VERDICT: NOT AS EXPECTED" in out
    assert "unexpected keyword argument 'check' (did you mean 'checks'?)" in out
    assert "api.py" not in out and "pytest_plugin.py" not in out  # no frames of ours


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist absent")
def test_xdist_gives_the_same_results(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(str(Path(__file__).resolve().parent.parent))
    args = (*PLUGIN, "-p", "no:cacheprovider", "--gradcheck-bi", WRONG, *SMALL,
            "--gradcheck-bi-arg", "check=forward,dx", "-q")
    alone = pytester.runpytest_subprocess(*args)
    spread = pytester.runpytest_subprocess(*args, "-n", "2")
    alone.assert_outcomes(passed=6, failed=12)
    spread.assert_outcomes(passed=6, failed=12)
    failed = sorted(line for line in alone.outlines if line.startswith("FAILED"))
    assert failed == sorted(line for line in spread.outlines if line.startswith("FAILED"))
