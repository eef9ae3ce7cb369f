"""bf16/fp16 gradients checked by lifting (gradcheck_bi/checks/rows/lift.py, lifted.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradcheck_bi.checks import run_check
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.bundled.rmsnorm import After
from gradcheck_bi.kernels.registry import BUNDLED
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config

SHAPE = (2, 4, 96)


class _Refusing(torch.autograd.Function):
    """``After``, refusing the dtypes in ``REFUSED`` the way Megatron refuses fp64."""

    REFUSED: tuple[torch.dtype, ...] = ()
    RAISES: type[Exception] = RuntimeError

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float,
                zcg: bool) -> torch.Tensor:
        if x.dtype in _Refusing.REFUSED:
            raise _Refusing.RAISES(f"Unsupported dtype: {x.dtype}")
        with torch.enable_grad():
            xr, wr = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            y = After.apply(xr, wr, eps, zcg)
        ctx.save_for_backward(xr, wr, y)
        return y.detach()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        xr, wr, y = ctx.saved_tensors
        dx, dw = torch.autograd.grad(y, (xr, wr), g)
        return dx, dw, None, None


class _OneUlpOff(torch.autograd.Function):
    """``After`` whose dx and dw are moved one representable step away from zero: what a
    rounding placed wrong does, at its smallest."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float,
                zcg: bool) -> torch.Tensor:
        return _Refusing.forward(ctx, x, w, eps, zcg)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        dx, dw, _, _ = _Refusing.backward(ctx, g)

        def away(t: torch.Tensor) -> torch.Tensor:
            return torch.nextafter(t, torch.where(t < 0, -torch.inf, torch.inf).to(t.dtype))

        return away(dx), away(dw), None, None


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bundled_kernels_meet_their_declared_defects_in_half_precision(dtype: str) -> None:
    results = run(Sweep(kernels=list(BUNDLED), targets=[("cpu", dtype)], shapes=[SHAPE],
                        checks=["forward", "dx", "dw"]))
    wrong = [(r.kernel, r.check, r.weight, r.zero_centered_gamma, r.status, r.message)
             for r in results if not r.as_expected]
    assert not wrong, wrong
    status = {(r.kernel, r.check, r.weight, r.zero_centered_gamma): r.status for r in results}
    # The controls mean what they mean in fp64: γ=randn shows the double weight, γ=ones
    # is blind to it, and the zcg forward defect shows for every γ.
    assert status["before", "dx", "randn", False] == "fail"
    assert status["before", "dx", "ones", False] == "pass"
    assert status["before", "forward", "ones", True] == "fail"
    assert status["after", "dx", "randn", True] == "pass"


def test_every_check_runs_in_half_precision_by_default() -> None:
    results = run(Sweep(kernels=["after"], targets=[("cpu", "bf16")], shapes=[(2, 16)],
                        weights=["randn"], zcg=[False], layouts=["contiguous"]))
    assert [(r.check, r.status) for r in results] == [
        ("forward", "pass"), ("dx", "pass"), ("dw", "pass"), ("batch_invariance", "pass")]


def test_lifted_method_is_named_in_the_details() -> None:
    m = run_check(After, Config(check="dx", dtype="bf16", shape=SHAPE))
    assert m.passed and m.details["method"] == "lifted to fp64", m.details
    assert m.max_abs_err <= m.tolerance and m.details["ratio"] <= 1.0, m
    assert m.details["max_abs_err_any"] >= m.max_abs_err


def test_lift_falls_back_to_fp32_then_to_the_independent_formula() -> None:
    cfg = Config(check="dw", dtype="bf16", shape=SHAPE)
    try:
        _Refusing.REFUSED = (torch.float64,)
        m = run_check(_Refusing, cfg)
        assert m.passed and m.details["method"] == "lifted to fp32", m
        assert m.details["not_lifted_to"].startswith("fp64: "), m.details
        _Refusing.REFUSED = (torch.float64, torch.float32)
        for check in ("dx", "dw"):
            m = run_check(_Refusing, Config(check=check, dtype="bf16", shape=SHAPE))
            assert m.passed and m.details["method"] == "independent fp64 formula", m
            assert "refuses fp64 and fp32" in m.details["reference"], m.details
            assert "fp32: " in m.details["not_lifted_to"], m.details
        # A crash in the higher dtype is a bug, not a refusal: it propagates (an error).
        _Refusing.REFUSED, _Refusing.RAISES = (torch.float64,), NameError
        with pytest.raises(NameError):
            run_check(_Refusing, cfg)
    finally:
        _Refusing.REFUSED, _Refusing.RAISES = (), RuntimeError


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("check", ["dx", "dw"])
def test_one_ulp_off_gradient_fails_where_the_correct_one_passes(dtype: str,
                                                                 check: str) -> None:
    for seed in range(3):
        cfg = Config(check=check, dtype=dtype, shape=SHAPE, seed=seed, weight_scale=3.0)
        good, bad = run_check(After, cfg), run_check(_OneUlpOff, cfg)
        assert good.passed, (seed, good)
        assert not bad.passed, (seed, bad)
        assert bad.details["not_correctly_rounded"] > 0.5, bad.details


def test_directional_mode_is_unsupported_in_half_precision() -> None:
    (r,) = run(Sweep(kernels=["after"], targets=[("cpu", "bf16")], checks=["dx"],
                     weights=["randn"], zcg=[False], mode="directional", shapes=[SHAPE],
                     layouts=["contiguous"]))
    assert r.status == "unsupported" and "directional" in r.message, r


def test_gradient_beyond_the_dtype_range_is_right_when_inf() -> None:
    # fp16, x·1e-4 and γ·100: r ≈ 1e3, so |dx| ≈ |g γ r| passes 65504 on some elements; their
    # correctly rounded value is inf, and a kernel that returns inf there is right.
    cfg = Config(check="dx", dtype="fp16", shape=(3, 300), input_scale=1e-4,
                 weight_scale=100.0)
    m = run_check(After, cfg)
    x, w, g = make_inputs(cfg)
    dx = torch.autograd.grad(After.apply(x.requires_grad_(True), w, cfg.eps, False), x, g)[0]
    assert bool(torch.isinf(dx).any()), "the regime no longer overflows fp16: pick another"
    assert m.passed, m


def test_a_forward_that_is_fp32_inside_fp64_is_lifted_to_fp32() -> None:
    # Mutant 13 computes fp64 input in fp32 (so do Liger's llama and gemma modes); in bf16 it
    # is a correct kernel. Differenced as fp64, its fp32 noise at D = 1 (no columns to
    # measure the noise from) would fail it.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "mutants"))
    import catalog

    fn = catalog.load("m13_compute_in_fp32")
    for check in ("dx", "dw"):
        m = run_check(fn, Config(check=check, dtype="bf16", shape=(5, 1)))
        assert m.passed and m.details["method"] == "lifted to fp32", m
        assert "less than fp64 accuracy" in m.details["not_lifted_to"], m.details
