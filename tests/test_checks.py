"""The four checks on the bundled kernels: the pattern the fix was argued with."""

from __future__ import annotations

import pytest
import torch

from gradcheck_bi.checks import run_check
from gradcheck_bi.checks._measure import measured_per_element
from gradcheck_bi.kernels.registry import BUNDLED
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec

FN = {name: spec.fn for name, spec in BUNDLED.items()}


def measure(kernel: str, check: str, weight: str, zcg: bool = False, dtype: str = "fp64",
            **kw: object) -> float:
    cfg = Config(check=check, control=weight, zero_centered_gamma=zcg, dtype=dtype,
                 **kw)  # type: ignore[arg-type]
    m = run_check(FN[kernel], cfg)
    return m.max_abs_err


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_dx_controls_discriminate_the_double_weight_defect(dtype: str) -> None:
    before = {w: measure("before", "dx", w, dtype=dtype) for w in ("randn", "ones", "zeros")}
    after = {w: measure("after", "dx", w, dtype=dtype) for w in ("randn", "ones", "zeros")}
    floor = {"fp64": 1e-10, "fp32": 3e-5}[dtype]
    assert before["randn"] > 1e-2, before
    assert after["randn"] <= floor, after
    assert before["ones"] == after["ones"] <= floor, (before, after)  # the blind control
    assert before["zeros"] == after["zeros"] == 0.0
    ratio = before["randn"] / before["ones"]
    assert ratio >= {"fp64": 1e8, "fp32": 1e4}[dtype], f"discrimination ratio {ratio:.2e}"


def test_forward_defect_shows_only_with_zcg() -> None:
    assert measure("before", "forward", "randn", zcg=True) > 1.0
    assert measure("before", "forward", "ones", zcg=True) > 1.0
    assert measure("before", "forward", "randn", zcg=False) < 1e-13
    assert measure("after", "forward", "randn", zcg=True) < 1e-13


def test_dw_is_right_in_every_kernel() -> None:
    for kernel in FN:
        for zcg in (False, True):
            m = run_check(FN[kernel], Config(check="dw", zero_centered_gamma=zcg))
            assert m.passed, (kernel, zcg, m.max_abs_err, m.tolerance)


def test_measurements_carry_what_a_reviewer_needs() -> None:
    m = run_check(FN["before"], Config(check="dx", control="randn"))
    assert not m.passed
    assert m.worst is not None and len(m.worst) == 3  # [batch, seq, col] in the (2, 8, 256) input
    assert m.details["stencil"] == "central-4"
    assert 0 < m.details["step_min"] <= m.details["step_max"]
    # Per element: the reported error and tolerance belong to the worst-ratio element.
    assert 0 < m.details["noise_floor"] <= m.tolerance < m.max_abs_err
    # The kernel's own rounding adds in quadrature (tolerance/summation.py).
    assert m.tolerance <= m.details["noise_floor"] + m.details["rounding_floor"] * (1 + 1e-12)
    assert m.tolerance <= m.details["noise_floor_max"] < 1e-9
    assert m.details["ratio"] == m.max_abs_err / m.tolerance > 1
    assert m.details["max_abs_err_any"] >= m.max_abs_err


def test_tolerance_is_overridable() -> None:
    m = run_check(FN["after"], Config(check="dx", atol=1e-20))
    assert m.tolerance == 1e-20 and not m.passed
    m = run_check(FN["before"], Config(check="dx", atol=10.0))
    assert m.passed


def test_batch_invariance_catches_a_batch_dependent_backward() -> None:
    import torch

    from gradcheck_bi.kernels.bundled.rmsnorm import After
    from gradcheck_bi.measure import run_point
    from gradcheck_bi.vocab import KernelSpec

    class BatchDependent(torch.autograd.Function):
        """`after`'s forward; the backward's s is shifted by a batch-wide constant and back."""

        @staticmethod
        def forward(ctx, x, w, eps, zcg):  # type: ignore[no-untyped-def]
            ctx.save_for_backward(x, w)
            ctx.eps, ctx.zcg = eps, zcg
            return After.apply(x, w, eps, zcg)

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            x, w = ctx.saved_tensors
            gamma = w + 1 if ctx.zcg else w
            r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
            p = g * x * gamma
            shift = p.abs().mean()  # depends on every row in the batch
            s = ((p + shift).sum(-1, keepdim=True) - shift * x.shape[-1])
            dx = g * gamma * r - r**3 * x * s / x.shape[-1]
            dw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
            return dx, dw, None, None

    spec = KernelSpec("batch-dependent", BatchDependent, source="test")
    dx = run_point(spec, Config(check="dx"), Sweep(), None)
    assert dx.status == "pass", dx  # the math is right ...
    bi = run_point(spec, Config(check="batch_invariance"), Sweep(), None)
    assert bi.status == "fail" and "dx row" in bi.message, bi  # ... the bits are not
    assert bi.worst is not None


def test_every_bundled_kernel_meets_its_declared_expectations() -> None:
    results = run(Sweep(kernels=list(FN), targets=[("cpu", "fp64")]))
    wrong = [(r.kernel, r.check, r.weight, r.zero_centered_gamma, r.status) for r in results
             if not r.as_expected]
    assert not wrong, wrong
    fails = {(r.kernel, r.check) for r in results if r.status == "fail"}
    assert ("fixed-forward", "dx") in fails and ("fixed-forward", "forward") not in fails
    assert ("fixed-dx", "forward") in fails and ("after", "dx") not in fails


def test_each_element_is_held_to_its_own_floor() -> None:
    # Element 1's error is under the largest floor (10) but 2x its own floor (0.5): a fail,
    # reported at that element with its own error and tolerance.
    err = torch.tensor([[1.0, 1.0, 3.0]], dtype=torch.float64)
    tol = torch.tensor([[10.0, 0.5, 10.0]], dtype=torch.float64)
    m = measured_per_element(err, tol, [], {})
    assert not m.passed and m.worst == [0, 1], m
    assert (m.max_abs_err, m.tolerance, m.details["ratio"]) == (1.0, 0.5, 2.0)
    assert m.details["max_abs_err_any"] == 3.0 and m.details["tolerance_at_max_err"] == 10.0
    ok = measured_per_element(err, tol * 4, [], {})
    assert ok.passed and ok.max_abs_err <= ok.tolerance, ok  # the contract: ≤ iff pass
    nan = measured_per_element(torch.tensor([0.0, float("nan")]), torch.ones(2), [], {})
    assert not nan.passed and nan.worst == [1]


def test_zero_output_is_judged_exactly() -> None:
    # γ = zeros: y ≡ 0, the finite difference is exact (0) and so is its floor. A correct
    # kernel's dx is exactly 0 there and passes; any nonzero dx fails (error / 0 = inf).
    m = run_check(FN["after"], Config(check="dx", control="zeros", dtype="fp32"))
    assert m.passed and m.max_abs_err == m.tolerance == 0.0, m

    class Leaky(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, eps, zcg):  # type: ignore[no-untyped-def]
            ctx.save_for_backward(w)
            return FN["after"].apply(x, w, eps, zcg)

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            (w,) = ctx.saved_tensors
            return g * 1e-30, torch.zeros_like(w), None, None

    bad = run_check(Leaky, Config(check="dx", control="zeros", dtype="fp32"))
    assert not bad.passed and bad.tolerance == 0.0 and bad.details["ratio"] == float("inf")


def test_forward_reports_the_precision_it_delivers() -> None:
    m = run_check(FN["after"], Config(check="forward", dtype="fp64"))
    assert m.passed and 0 < m.details["u_eff_ratio"] < 2, m.details
    assert m.details["u_dtype"] == 2.0**-53
    # A kernel that computes in fp32 when given fp64 delivers fp32's precision.

    class Narrow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, eps, zcg):  # type: ignore[no-untyped-def]
            return FN["after"].apply(x.float(), w.float(), eps, zcg).double()

    narrow = run_check(Narrow, Config(check="forward", dtype="fp64"))
    assert not narrow.passed
    assert 2.0**-27 < narrow.details["u_eff"] < 2.0**-22, narrow.details


class _GradModeDispatch:
    """A wrapper that picks its training path when grad is enabled (as one choosing between
    an inference and a training kernel would); the training path is off by 2^-40 relative."""

    @staticmethod
    def apply(x, w, eps, zcg):  # type: ignore[no-untyped-def]
        y = FN["after"].apply(x, w, eps, zcg)
        return y * (1 + 2.0**-40) if torch.is_grad_enabled() else y


class _RequiresGradBranch(torch.autograd.Function):
    """`after`, plus 1e-9 wherever x requires grad (inside a Function's forward grad mode is
    off, so only requires_grad tells the paths apart)."""

    @staticmethod
    def forward(ctx, x, w, eps, zcg):  # type: ignore[no-untyped-def]
        y = FN["after"].forward(ctx, x, w, eps, zcg)
        return y + 1e-9 if x.requires_grad else y

    backward = FN["after"].backward


@pytest.mark.parametrize("fn", [_RequiresGradBranch, _GradModeDispatch])
def test_training_forward_must_equal_the_checked_one(fn: type) -> None:
    m = run_check(fn, Config(check="forward", shape=(3, 64), control="randn"))
    assert not m.passed
    assert m.message.startswith("forward with grad enabled differs from forward under "
                                "no_grad in "), m.message
    assert "of 192 elements of y (max |Δ|" in m.message, m.message
    # The no_grad forward alone is right: the error against the reference stays tiny.
    assert m.max_abs_err <= m.tolerance, (m.max_abs_err, m.tolerance)
    assert run_check(FN["after"], Config(check="forward", shape=(3, 64))).passed


def test_a_fail_within_tolerance_is_not_described_as_over_it() -> None:
    from gradcheck_bi.report.tables import describe

    sweep = Sweep(kernels=["branch"], targets=[("cpu", "fp64")], checks=["forward"],
                  shapes=[(2, 16)], weights=["randn"], zcg=[False], layouts=["contiguous"])
    [r] = run(sweep, [KernelSpec("branch", _RequiresGradBranch, source="api")])
    assert r.status == "fail" and r.max_abs_err <= r.tolerance  # type: ignore[operator]
    line = describe(r)
    assert "≤ tol" in line and "> tol" not in line and "grad enabled differs" in line, line


def test_batch_filler_rows_are_shared_but_never_modified() -> None:
    import torch

    from gradcheck_bi.checks.rows import batch as bi

    def fillers():  # RMSNorm's: x scaled, its cotangent not
        return bi._fillers(5, 40, 2.0, ("x", "y"), ("x",))

    cfg = Config(check="batch_invariance", shape=(3, 40), seed=5, input_scale=2.0)
    run_check(FN["after"], cfg)
    cached = fillers()
    run_check(FN["before"], Config(check="batch_invariance", shape=(3, 40), seed=5,
                                   input_scale=2.0, zero_centered_gamma=True))
    assert fillers() is cached, "one draw per seed, row length and scale"
    bi._fillers.cache_clear()
    fresh = fillers()
    for c, f in zip(cached, fresh, strict=True):
        assert all(torch.equal(c[n], f[n]) for n in c), "a probe row was written into the cache"


def test_queued_bitwise_comparisons_report_as_one_by_one() -> None:
    from gradcheck_bi.checks._measure import BitwiseLog

    gen = torch.Generator().manual_seed(3)
    a = [torch.randn(5, 7, generator=gen, dtype=torch.float64) for _ in range(4)]
    b = [t.clone() for t in a]
    b[1][2, 3] += 1e-3
    b[3][0, 6] = float("nan")
    pairs = [(f"t{i}", x, y, i) for i, (x, y) in enumerate(zip(a, b, strict=True))]
    queued, single = BitwiseLog(), BitwiseLog()
    for label, x, y, row in pairs:
        queued.compare(label, x, y, row)
        single.compare(label, x, y, row)
        single.settle()  # one comparison at a time, as before queueing
    assert queued.queued and not single.queued
    got, want = queued.measurement({}), single.measurement({})
    assert (got.passed, got.message, got.worst, got.max_abs_err) == (
        want.passed, want.message, want.worst, want.max_abs_err), (got, want)
    assert not got.passed and got.message.startswith("t1: 1 of 35 elements differ"), got
    assert got.details["comparisons"] == 4
    clean = BitwiseLog()
    for x in a:
        clean.compare("same", x, x.clone(), 0)
    assert clean.measurement({}).passed
