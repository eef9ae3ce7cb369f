"""kernels/calling/writes.py: a kernel that writes into what it does not own, or returns no
gradient or one of the wrong shape, fails with its own message (never passes, never reads as a
crash)."""

from __future__ import annotations

from pathlib import Path

import pytest

import gradcheck_bi
from gradcheck_bi.kernels.calling.layout import LAYOUTS

KERNELS = Path(__file__).resolve().parent / "kernels" / "side_effects.py"
SMALL = {"shapes": [(2, 4, 64)], "raise_on_failure": False}


@pytest.mark.parametrize(("attr", "needle"), [
    ("BackwardWritesGradOutput", "backward overwrote grad_output (100% of elements)"),
    ("ForwardWritesX", "forward overwrote x"),
    ("BackwardWritesWeight", "backward overwrote weight"),
    ("NoWeightGradient", "backward returned None for dw"),
    ("ColumnWeightGradient", "returned an invalid gradient at index 1"),
])
def test_each_side_effect_fails_with_its_own_message(attr: str, needle: str) -> None:
    report = gradcheck_bi.check(f"{KERNELS}:{attr}", **SMALL)  # type: ignore[arg-type]
    assert report.exit_code == 1
    caught = [r for r in report.results if needle in r.message]
    assert caught and all(r.status == "fail" for r in caught), [r.message for r in
                                                                report.results]
    assert not [r for r in report.results if r.status == "error"]
    # The checks that run the kernel's backward see it.
    assert {"dw", "batch_invariance"} <= {r.check for r in caught}


def test_the_correct_twin_passes() -> None:
    assert gradcheck_bi.check(f"{KERNELS}:Correct", **SMALL).ok  # type: ignore[arg-type]


def test_a_declared_write_passes_with_a_note() -> None:
    ref = f"{KERNELS}:InPlaceDeclared"
    assert gradcheck_bi.check(ref, **SMALL).exit_code == 1  # type: ignore[arg-type]
    report = gradcheck_bi.check(ref, allow_mutation="grad_output",
                                **SMALL)  # type: ignore[arg-type]
    assert report.ok
    noted = [r for r in report.results if r.details.get("declared_mutation")]
    assert noted and all("declared mutation: backward overwrote grad_output" in r.message
                         for r in noted)


@pytest.mark.parametrize(("attr", "layout"), [
    ("ReadsGradAsContiguous", "grad-strided"),
    ("ReadsXAsContiguous", "x-strided"),
    ("AssumesTwoDims", "contiguous"),
])
def test_layout_defects_are_caught_by_the_default_run(attr: str, layout: str) -> None:
    """The default sweep (shape 2×8×256, a strided input and a strided cotangent at
    γ = randn) catches a kernel that reads a strided tensor as if it were contiguous, and
    one that treats a 3-D input as 2-D."""
    report = gradcheck_bi.check(f"{KERNELS}:{attr}", raise_on_failure=False)
    failed = {r.layout for r in report.failed}
    assert report.exit_code == 1 and layout in failed, failed
    if layout != "contiguous":
        assert failed == {layout}, "a layout defect shows only where the layout is used"


def test_a_layout_correct_kernel_passes_every_layout() -> None:
    report = gradcheck_bi.check(f"{KERNELS}:Correct", shapes=[(2, 3, 40)], layouts=LAYOUTS,
                                raise_on_failure=False)
    assert report.ok, str(report)
    assert {r.layout for r in report.results} == set(LAYOUTS)


def test_a_one_element_row_passes_every_layout() -> None:
    """A strided (1,) x counts as contiguous yet keeps its stride of 2: the bitwise
    comparison of what the kernel held still reads its bits (it raised inside the check)."""
    report = gradcheck_bi.check("after", shapes=[(1,)], layouts=LAYOUTS, raise_on_failure=False)
    assert report.ok, str(report)
    assert {r.layout for r in report.results} == set(LAYOUTS)


def test_a_declared_write_into_x_keeps_the_finite_differences_right() -> None:
    """The finite differences perturb one batch in place and put it back after each call;
    a kernel declared to write into x (its numbers right) gets the batch afresh per call,
    so its dx is still measured, not corrupted by its own earlier writes."""
    ref = f"{KERNELS}:ForwardWritesX"
    report = gradcheck_bi.check(ref, allow_mutation="x", checks=["dx"], weights="randn",
                                zcg=False, **SMALL)  # type: ignore[arg-type]
    assert report.ok, [r.message for r in report.results]
    assert report.results and all(r.status == "pass" for r in report.results)


def test_a_backward_run_apart_from_its_write_check_still_tells_the_write_first() -> None:
    # An input check runs the backward while its finite differences' calls do and checks
    # its writes after them; a backward that both writes and fails reads as when called.
    from gradcheck_bi.kernels.calling.opcall import Backward
    from gradcheck_bi.vocab import ContractViolation

    def call(check: bool) -> dict:
        if check:
            writes()
        raise ContractViolation("backward returned None for dw")

    def writes() -> None:
        raise ContractViolation("backward overwrote x")

    for run in (Backward(call, writes), Backward(call, writes).run):
        with pytest.raises(ContractViolation, match="overwrote x"):
            run()
