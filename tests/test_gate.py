"""The verdict stage: judging, expectations and their precedence, exit codes."""

from __future__ import annotations

import math

from gradcheck_bi.gate import (
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_UNSUPPORTED,
    discrimination_ratio,
    exit_code,
    expected,
    judge,
)
from gradcheck_bi.kernels import resolve
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, Expectation, KernelSpec, Measurement


def _result(status: str, expect: str = "pass"):  # type: ignore[no-untyped-def]
    cfg = Config(check="dx", control="ones", zero_centered_gamma=True, input_scale=2.0)
    if status in ("pass", "fail"):
        return judge("k", expect, cfg, Measurement(1.0, 2.0, status == "pass", [0, 1]))
    return judge("k", expect, cfg, status=status, message="why")


def test_judge_copies_the_point_into_the_contract_names() -> None:
    r = _result("pass")
    assert (r.weight, r.zero_centered_gamma, r.input_scale, r.worst) == ("ones", True, 2.0,
                                                                         [0, 1])
    assert r.as_expected and r.max_abs_err == 1.0 and r.tolerance == 2.0
    assert not _result("fail").as_expected and _result("fail", "fail").as_expected
    e = _result("error")
    assert e.max_abs_err is None and e.message == "why" and not e.as_expected


def test_exit_codes() -> None:
    assert exit_code([_result("pass")]) == EXIT_OK
    assert exit_code([_result("pass"), _result("unsupported")]) == EXIT_UNSUPPORTED
    assert exit_code([_result("fail"), _result("unsupported")]) == EXIT_UNEXPECTED
    assert exit_code([_result("error")]) == EXIT_UNEXPECTED
    assert exit_code([_result("pass")], drifted=True) == EXIT_UNEXPECTED


def test_strict_makes_any_unsupported_unexpected() -> None:
    assert exit_code([_result("pass"), _result("unsupported")], strict=True) == EXIT_UNEXPECTED
    assert exit_code([_result("unsupported")], strict=True) == EXIT_UNEXPECTED
    assert exit_code([_result("pass")], strict=True) == EXIT_OK
    assert exit_code([_result("fail", "fail")], strict=True) == EXIT_OK


def test_expectations_rules_then_expect_then_declared_defects() -> None:
    before, user = resolve("before"), KernelSpec("mine", object(), source="mine.py:F")
    dx = Config(check="dx", control="randn")
    assert expected(before, dx, Sweep()) == "fail"
    assert expected(before, Config(check="dx", control="ones"), Sweep()) == "pass"
    assert expected(user, dx, Sweep()) == "pass"
    assert expected(user, dx, Sweep(expect="fail")) == "fail"
    assert expected(before, dx, Sweep(expect="pass")) == "fail", "bundled kernels keep theirs"
    rules = [Expectation("pass", kernel="before", check="dx"),
             Expectation("fail", kernel="before", weight="zeros")]
    assert expected(before, dx, Sweep(expectations=rules)) == "pass"
    zeros = Config(check="dx", control="zeros")
    assert expected(before, zeros, Sweep(expectations=rules)) == "fail", "the last match wins"


def test_discrimination_ratio() -> None:
    assert discrimination_ratio(1.0, 1e-12) == 1e12
    assert discrimination_ratio(1.0, 0.0) == math.inf
    assert discrimination_ratio(0.0, 0.0) is None and discrimination_ratio(None, 1.0) is None
