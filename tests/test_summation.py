"""The kernel's own rounding in any summation order (gradcheck_bi/tolerance/summation.py).

Correct kernels that reduce sequentially, in reverse, blocked (37 lanes) or in a frozen
atomic order (tests/independent/orders.py) pass dx and dw; the same kernels with a gradient
scaled by a small factor fail; the variance model matches the rounding it bounds. The full
sizes (rows up to 8192, D up to 16384, and the issue's shapes) are in
benchmarks/summation_orders.py and docs/summation_orders.md.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "independent"))
import orders

from gradcheck_bi.checks import run_check
from gradcheck_bi.sums.reduction import row_sum
from gradcheck_bi.tolerance.noise import K_SIGMA
from gradcheck_bi.tolerance.summation import any_order_var, forward_factor, order_sums
from gradcheck_bi.vocab import Config

# Many rows, few columns: dw's sum over the rows is long, dx and the forward stay cheap.
# (2048, 24) failed dw under the old tolerance for three of the four orders (sequential,
# reversed, atomic: err/tol 1.2-3.1, fp32 and fp64).
# dx is judged on fewer rows (its cost is rows · D²; its own sums run over D).
POINTS = [((2048, 24), "fp32"), ((2048, 24), "fp64"), ((3, 40, 7), "fp32"), ((1, 300), "bf16")]
DX_POINTS = [((64, 24), "fp32"), ((64, 24), "fp64"), ((3, 40, 7), "fp32"), ((1, 300), "bf16")]
CASES = [*itertools.product(orders.ORDERS, POINTS, ("dw", "forward")),
         *itertools.product(orders.ORDERS, DX_POINTS, ("dx",))]


@pytest.mark.parametrize(("order", "point", "check"), CASES)
def test_a_correct_kernel_passes_in_any_order(order: str, point: tuple, check: str) -> None:
    shape, dtype = point
    m = run_check(orders.KERNELS[order], Config(check=check, dtype=dtype, shape=shape, seed=3))
    assert m.passed, f"{order} {dtype} {shape} {check}: {m.max_abs_err:.3e} vs " \
                     f"{m.tolerance:.3e} ({m.details.get('ratio')}) {m.message}"


@pytest.mark.parametrize(("check", "dtype", "scale"),
                         [("dw", "fp32", 1e-4), ("dw", "fp64", 1e-8), ("dx", "fp32", 1e-4)])
def test_a_slightly_scaled_gradient_is_still_caught(check: str, dtype: str, scale: float) -> None:
    fn = orders.make("sequential", **{f"{check}_scale": 1 + scale})
    shape = (2048, 24) if check == "dw" else (64, 24)
    m = run_check(fn, Config(check=check, dtype=dtype, shape=shape, seed=3))
    assert not m.passed, f"{check} × (1 + {scale}) passed: ratio {m.details['ratio']:.3g}"
    assert m.details["detectable_rel"] < scale


def test_any_order_var_is_the_mean_over_orders() -> None:
    """``V`` is the expected ``Σ_k s_k²`` over random orders of the same terms."""
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(12, dtype=torch.float64, generator=gen) + 0.5
    total = torch.zeros((), dtype=torch.float64)
    trials = 4000
    for _ in range(trials):
        prefix = t[torch.randperm(12, generator=gen)].cumsum(0)[1:]
        total += (prefix * prefix).sum()
    expected = float(any_order_var(t[None])[0])
    assert abs(float(total) / trials - expected) < 0.03 * expected
    var, q, s = order_sums(t[None])  # V with the sums it is made of
    assert (float(var[0]), float(q[0]), float(s[0])) == (
        expected, float(row_sum(t * t)), float(row_sum(t))), (var, q, s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_bound_covers_a_sequential_sum_with_room(dtype: torch.dtype) -> None:
    """Sequential sums of 512 signed terms: RMS error ≈ 0.42 u·sqrt(V), never near K_SIGMA."""
    gen = torch.Generator().manual_seed(1)
    t = torch.randn(512, 2048, dtype=torch.float64, generator=gen).to(dtype)
    exact = t.to(torch.float64).sum(0) if dtype == torch.float32 else None
    acc = t[0].clone()
    for k in range(1, t.shape[0]):
        acc += t[k]
    if exact is None:  # fp64: compare with the sum in extended precision
        exact = torch.tensor(t.numpy().astype("longdouble").sum(0).astype("float64"))
    u = float(torch.finfo(dtype).eps) / 2
    z = (acc.to(torch.float64) - exact).abs() / (u * any_order_var(t.to(torch.float64).T).sqrt())
    rms = float(z.pow(2).mean().sqrt())
    assert 0.25 < rms < 0.6, rms
    assert float(z.max()) < 0.5 * K_SIGMA


def test_forward_factor_grows_like_sqrt_d_and_keeps_the_worst_case_for_few_terms() -> None:
    assert forward_factor(1) == 1 / 2 + 4
    assert forward_factor(4096) < 8 * forward_factor(64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_pow2_scale_is_the_power_of_two_at_or_below(dtype: torch.dtype) -> None:
    """Every magnitude the dtype holds — subnormals, its largest, 0, ±inf, NaN — against
    ``2^(e-1)`` from frexp's exponent (1 where t is 0 or not finite)."""
    import math

    from gradcheck_bi.tolerance.noise import pow2_scale

    fi = torch.finfo(dtype)
    gen = torch.Generator().manual_seed(7)
    e = torch.randint(int(math.log2(fi.smallest_normal)) - 30, int(math.log2(fi.max)) + 2,
                      (20000,), generator=gen)
    t = (torch.randn(20000, generator=gen, dtype=torch.float64) * torch.pow(2.0, e.double())
         ).to(dtype)
    t[:8] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fi.max, fi.tiny,
                          -fi.tiny], dtype=torch.float64).to(dtype)
    a = t.abs()
    ok = (a > 0) & torch.isfinite(a)
    want = torch.where(ok, torch.ldexp(torch.ones_like(a), torch.frexp(
        torch.where(ok, a, torch.ones_like(a))).exponent - 1), torch.ones_like(a))
    got = pow2_scale(t)
    differ = got.double() != want.double()
    assert got.dtype == dtype and not differ.any(), (
        f"{int(differ.sum())} differ, e.g. t={t[differ][:3].tolist()}: "
        f"{got[differ][:3].tolist()} against {want[differ][:3].tolist()}")
    assert ((a < fi.tiny) & (a > 0)).any()  # subnormals were among them
