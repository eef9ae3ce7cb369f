"""gradcheck_bi.check(): the γ=randn gradient check inside a project's own pytest suite."""

from __future__ import annotations

from pathlib import Path

import pytest

import gradcheck_bi
from gradcheck_bi.kernels.loader import load

KERNELS = Path(__file__).resolve().parent / "kernels"
# A project's own kernels would be imported normally; these test files are loaded by path.
Correct = load(f"{KERNELS}/user_rmsnorm.py:Correct").fn
DxDoubleWeight = load(f"{KERNELS}/user_rmsnorm.py:DxDoubleWeight").fn
MegatronLike = load(f"{KERNELS}/megatron_like.py:BatchInvariantRMSNormFn").fn


def test_rmsnorm_backward_moves_with_gamma() -> None:
    """The README's example: dx and dw at a trained-looking γ, both zcg modes."""
    report = gradcheck_bi.check(Correct, checks=["dx", "dw"], weights=["randn", "ones"],
                                shapes=[(4, 1000)], weight_scales=[30.0])
    assert report.ok and len(report.results) == 8
    assert all(r.max_abs_err is not None and r.max_abs_err <= r.tolerance  # type: ignore[operator]
               for r in report.results)


def test_a_wrong_backward_raises_an_assertion_that_names_it() -> None:
    with pytest.raises(gradcheck_bi.GradcheckFailure) as info:
        gradcheck_bi.check(DxDoubleWeight, checks=["dx"], shapes=[(3, 2, 40)], zcg=[False])
    msg = str(info.value)
    assert isinstance(info.value, AssertionError)
    assert "1 of 3 results not as expected" in msg
    assert "DxDoubleWeight dx cpu/fp64 shape (3, 2, 40) γ=randn" in msg
    assert [r.weight for r in info.value.report.failed] == ["randn"]  # ones is blind


def test_report_without_raising() -> None:
    report = gradcheck_bi.check(DxDoubleWeight, checks=["dx"], shapes=[(2, 33)],
                                raise_on_failure=False)
    assert report.exit_code == 1 and not report.ok
    assert {(r.weight, r.zero_centered_gamma) for r in report.failed} == {
        ("randn", False), ("randn", True)}


def test_expect_fail_turns_a_known_defect_into_a_pass() -> None:
    report = gradcheck_bi.check(DxDoubleWeight, checks=["dx"], weights=["randn"],
                                shapes=[(2, 33)], expect="fail")
    assert report.ok and {r.status for r in report.results} == {"fail"}


def test_unsupported_never_raises() -> None:
    report = gradcheck_bi.check(MegatronLike, checks=["forward"], dtype="fp32")
    assert report.exit_code == 3 and len(report.unsupported) == len(report.results) == 6
    assert "requires CUDA tensors" in str(report)


def test_bundled_names_keep_their_declared_defects() -> None:
    report = gradcheck_bi.check("before", checks=["forward"], zcg=[True], shapes=[(2, 16)])
    assert report.ok and {r.status for r in report.results} == {"fail"}


def test_not_a_function() -> None:
    with pytest.raises(TypeError, match="autograd Function"):
        gradcheck_bi.check(lambda x: x)
