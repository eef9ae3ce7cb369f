"""FD that fits the function (:mod:`gradcheck_bi.checks.fd_judge`, :mod:`gradcheck_bi.fd.refine`,
:mod:`gradcheck_bi.fd.weight`): kinks reported as not differentiable, never as a wrong
gradient and never dropped; a defect away from them still caught; a weight the output is
not linear or not elementwise in differenced at a step that fits; healthy kernels untouched.
The kernels: tests/kernels/kinked.py (hand-written backwards) and torch's own functions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradcheck_bi.checks import run_check
from gradcheck_bi.checks.rows.gradients import check_op_gradient
from gradcheck_bi.fd.refine import REFINE, refine_elements
from gradcheck_bi.fd.weight import weight_shape
from gradcheck_bi.kernels.adapting.loader import load
from gradcheck_bi.kernels.bundled.rmsnorm import After
from gradcheck_bi.vocab import Config, Measurement, Unsupported

KINKED = Path(__file__).resolve().parent / "kernels" / "kinked.py"
NEW_KEYS = {"not_differentiable", "not_differentiable_unjudged", "finer_step_ratio",
            "finer_forward_calls", "noise_scale_pooled", "weight_step", "weight_fd"}


def _fn(attr: str) -> object:
    # No op of the tool computes these (their output is not affine in the weight): held to
    # the op their name says, as --op does (without it, recognition refuses them).
    op = "layer_norm" if "layer_norm" in attr else "rms_norm"
    return load(f"{KINKED}:{attr}", {"op": op}).fn


def _explain(m: Measurement) -> str:
    return (f"passed={m.passed} err={m.max_abs_err:.3e} tol={m.tolerance:.3e} at {m.worst}: "
            f"{m.message}")


def test_refine_takes_the_one_sided_slope_past_a_kink() -> None:
    # relu at 0.01 with h = 2^-6: the stencil (±4h) straddles 0; at h/16 it does not.
    t = torch.tensor([[-1.0, 0.01, 2.0]], dtype=torch.float64)
    h = torch.tensor([2.0**-6], dtype=torch.float64)
    fine = refine_elements(lambda v: [torch.relu(v)], t, [torch.ones_like(t)], h,
                           torch.tensor([[True, True, False]]))
    assert fine.grad.tolist() == [[0.0, 1.0, 0.0]], fine.grad
    assert fine.forward_calls == 2 and fine.step.item() == 2.0**-6 / REFINE


def test_weight_shape_reads_linear_elementwise_and_inside_the_norm() -> None:
    x = torch.randn(6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    u = 2.0**-53
    assert weight_shape(lambda v: After.apply(x, v, 1e-6, False), w, 2.0, u) == (True, True)
    inside = _fn("InputScaledRMSNorm")
    assert weight_shape(lambda v: inside.apply(x, v, 1e-6, False), w, 2.0, u) == (False,
                                                                                     False)
    # at γ = 0 the scale-invariant norm is odd in w: no second difference, still not linear
    zero = torch.zeros(32, dtype=torch.float64)
    assert weight_shape(lambda v: inside.apply(x, v, 1e-6, False), zero, 2.0, u) == (False,
                                                                                        False)


@pytest.mark.parametrize("control", ["randn", "ones"])
def test_relu_after_rmsnorm_passes_with_its_kinks_counted(control: str) -> None:
    m = run_check(_fn("ReluRMSNorm"), Config(check="dx", control=control))
    assert m.passed, _explain(m)
    assert m.details["not_differentiable"] > 0, m.details
    assert "not differentiable within ±4h" in m.message, m.message
    assert m.details["not_differentiable_unjudged"] < m.details["not_differentiable"]


@pytest.mark.parametrize("control", ["randn", "ones"])
def test_a_defect_away_from_the_kinks_still_fails(control: str) -> None:
    m = run_check(_fn("ReluRMSNormDefect"), Config(check="dx", control=control))
    assert not m.passed, _explain(m)
    assert m.max_abs_err > 1e6 * m.tolerance, _explain(m)  # 1e-3 relative, tol ~1e-12
    assert m.details["not_differentiable"] > 0  # the kinks are still counted, not blamed


def test_weight_in_front_of_a_relu_is_differenced_at_a_small_step() -> None:
    m = run_check(_fn("ReluRMSNorm"), Config(check="dw", control="randn"))
    assert m.passed, _explain(m)
    assert m.details["weight_step"] < 2.0**-8, m.details
    assert "not linear in the weight" in m.details["weight_fd"]
    assert m.tolerance < 1e-10, _explain(m)  # tight: the big step's truncation is gone


def test_every_weight_on_the_kink_is_unsupported_not_a_pass() -> None:
    # γ = zeros puts every pre-activation on relu's kink: nothing can be judged
    with pytest.raises(Unsupported, match="every element not differentiable"):
        run_check(_fn("ReluRMSNorm"), Config(check="dw", control="zeros"))


@pytest.mark.parametrize("control", ["randn", "ones"])
def test_a_weight_inside_the_norm(control: str) -> None:
    ok = run_check(_fn("InputScaledRMSNorm"), Config(check="dw", control=control))
    assert ok.passed, _explain(ok)
    assert "not elementwise" in ok.details["weight_fd"], ok.details
    bad = run_check(_fn("InputScaledRMSNormDefect"), Config(check="dw", control=control))
    assert not bad.passed and bad.max_abs_err > 1e4 * bad.tolerance, _explain(bad)


@pytest.mark.parametrize("check", ["dx", "dw", "dbias"])
@pytest.mark.parametrize("attr", ["relu_layer_norm", "torch_relu_layer_norm"])
def test_relu_layer_norm_passes(attr: str, check: str) -> None:
    cfg = Config(check=check, op="layer_norm", bias="randn", control="randn")
    m = check_op_gradient(_fn(attr), cfg)
    assert m.passed, _explain(m)
    assert m.details.get("not_differentiable", 0) > 0 or "weight_fd" in m.details, m.details


@pytest.mark.parametrize("check", ["dx", "dw", "dbias"])
def test_a_layer_norm_defect_away_from_the_kinks_fails(check: str) -> None:
    cfg = Config(check=check, op="layer_norm", bias="randn", control="randn")
    m = check_op_gradient(_fn("relu_layer_norm_defect"), cfg)
    assert not m.passed and m.max_abs_err > 1e6 * m.tolerance, _explain(m)


@pytest.mark.parametrize("check", ["dx", "dw"])
def test_a_healthy_kernel_gets_no_new_keys(check: str) -> None:
    m = run_check(After, Config(check=check))
    assert m.passed and not m.message
    assert not NEW_KEYS & set(m.details), m.details
