"""The bundled BI RMSNorm kernels: forward vs fp64 reference, the two defects, invariance."""

from __future__ import annotations

import pytest
import torch
from conftest import rand, where_differs

from gradcheck_bi.kernels.bundled.rmsnorm import (
    After,
    Before,
    FixedDx,
    FixedForward,
    KernelInputError,
    reference_forward,
)
from gradcheck_bi.sums.reduction import use_backend

EPS = 1e-6
SHAPES = [(3, 1), (4, 5), (2, 1000), (2, 5000), (2, 4096), (7,), (3, 64), (2, 3, 64), (2, 2, 3, 64)]


def grads(fn, x, w, g, zcg):  # type: ignore[no-untyped-def]
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = fn.apply(xr, wr, EPS, zcg)
    y.backward(g)
    return y.detach(), xr.grad, wr.grad


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("zcg", [False, True])
def test_after_forward_matches_fp64_reference(shape: tuple[int, ...], zcg: bool) -> None:
    x, w = rand(*shape, seed=1), rand(shape[-1], seed=2)
    y = After.apply(x, w, EPS, zcg)
    ref = reference_forward(x, w, EPS, zcg)
    # fp64 rounding: a few ulps of the largest output, growing with log2(D) for the sum.
    tol = 32 * torch.finfo(torch.float64).eps * ref.abs().max().item()
    assert (y - ref).abs().max().item() <= tol, where_differs(y, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_after_forward_in_low_precision(dtype: torch.dtype) -> None:
    x, w = rand(4, 1000, seed=3, dtype=dtype), rand(1000, seed=4, dtype=dtype)
    y = After.apply(x, w, EPS, True)
    assert y.dtype == dtype
    ref = reference_forward(x, w, EPS, True)
    tol = 2 * torch.finfo(dtype).eps * ref.abs().max().item()
    assert (y.double() - ref).abs().max().item() <= tol, where_differs(y, ref)


def test_fp64_is_never_dropped_to_fp32() -> None:
    x, w = rand(2, 300, seed=5), rand(300, seed=6)
    y = After.apply(x, w, EPS, False)
    err = (y - reference_forward(x, w, EPS, False)).abs().max().item()
    assert y.dtype == torch.float64 and err < 1e-13, f"fp64 forward error {err:.3e}"


@pytest.mark.parametrize("fn", [Before, FixedDx])
def test_forward_ignoring_zcg_is_bitwise_the_zcg_off_forward(fn: type) -> None:
    x, w = rand(2, 3, 100, seed=7), rand(100, seed=8)
    assert torch.equal(fn.apply(x, w, EPS, True), fn.apply(x, w, EPS, False))


@pytest.mark.parametrize("fn", [After, FixedForward])
def test_fixed_forward_applies_the_offset(fn: type) -> None:
    x, w = rand(2, 3, 100, seed=9), rand(100, seed=10)
    y = fn.apply(x, w, EPS, True)
    ref = reference_forward(x, w + 1, EPS, False)
    assert (y - ref).abs().max().item() < 1e-13, where_differs(y, ref)


@pytest.mark.parametrize("zcg", [False, True])
def test_before_minus_after_dx_is_the_closed_form_defect(zcg: bool) -> None:
    d = 300
    x, w, g = rand(2, 4, d, seed=11), rand(d, seed=12), rand(2, 4, d, seed=13)
    _, dx_before, dw_before = grads(Before, x, w, g, zcg)
    _, dx_after, dw_after = grads(After, x, w, g, zcg)
    gamma = w + 1 if zcg else w
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    s = (g * x * gamma).sum(-1, keepdim=True)
    # before: g γ r − γ r³ x s / D;  after: g γ r − r³ x s / D
    defect = -(gamma - 1) * r**3 * x * s / d
    diff = dx_before - dx_after
    assert (diff - defect).abs().max().item() < 1e-12, where_differs(diff, defect)
    assert defect.abs().max().item() > 1e-2  # the defect is O(1) with real weights
    assert torch.equal(dw_before, dw_after)  # the weight gradient was never wrong


@pytest.mark.parametrize("zcg", [False, True])
def test_double_weight_defect_vanishes_at_unit_weight(zcg: bool) -> None:
    x, g = rand(3, 200, seed=14), rand(3, 200, seed=15)
    w = torch.zeros(200, dtype=torch.float64) if zcg else torch.ones(200, dtype=torch.float64)
    _, dx_fixed_fwd, _ = grads(FixedForward, x, w, g, zcg)
    _, dx_after, _ = grads(After, x, w, g, zcg)
    assert torch.equal(dx_fixed_fwd, dx_after), where_differs(dx_fixed_fwd, dx_after)


@pytest.mark.parametrize("fn", [After, Before])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_y_and_dx_bitwise_batch_invariant(fn: type, backend: str, dtype: torch.dtype) -> None:
    d = 1000
    x, w, g = rand(70, d, seed=16, dtype=dtype), rand(d, seed=17, dtype=dtype), rand(
        70, d, seed=18, dtype=dtype)
    with use_backend(backend):
        y_all, dx_all, _ = grads(fn, x, w, g, True)
        for size in (1, 3, 8, 64):
            y_b, dx_b, _ = grads(fn, x[:size], w, g[:size], True)
            for name, part, whole in (("y", y_b, y_all), ("dx", dx_b, dx_all)):
                assert torch.equal(part, whole[:size]), (
                    f"{name}, batch {size}: {where_differs(part, whole[:size])}")


def test_dw_is_deterministic_run_to_run() -> None:
    x, w, g = rand(64, 512, seed=19), rand(512, seed=20), rand(64, 512, seed=21)
    first = grads(After, x, w, g, False)[2]
    for _ in range(3):
        assert torch.equal(grads(After, x, w, g, False)[2], first)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_interpreter_and_torch_paths_agree_through_the_kernel(dtype: torch.dtype) -> None:
    x, w, g = rand(5, 1500, seed=22, dtype=dtype), rand(1500, seed=23, dtype=dtype), rand(
        5, 1500, seed=24, dtype=dtype)
    with use_backend("torch"):
        a = grads(After, x, w, g, True)
    with use_backend("triton"):
        b = grads(After, x, w, g, True)
    u = torch.finfo(dtype).eps
    for name, ta, tb in zip(("y", "dx", "dw"), a, b, strict=True):
        tol = 64 * u * max(1.0, ta.abs().max().item())
        err = (ta.double() - tb.double()).abs().max().item()
        assert err <= tol, f"{name}: {where_differs(ta, tb)}"


@pytest.mark.parametrize(
    ("x", "w", "eps", "match"),
    [
        (torch.randn(2, 8), torch.randn(7), 1e-6, "does not match the last dim"),
        (torch.ones(2, 8, dtype=torch.int32), torch.randn(8), 1e-6, "must be one of"),
        (torch.randn(2, 0), torch.randn(0), 1e-6, "empty last dimension"),
        (torch.randn(2, 8), torch.randn(8), -1.0, "eps must be"),
        (torch.randn(2, 8), torch.randn(8), float("nan"), "eps must be"),
    ],
)
def test_bad_input_raises_a_clear_error(x: torch.Tensor, w: torch.Tensor, eps: float,
                                        match: str) -> None:
    with pytest.raises(KernelInputError, match=match):
        After.apply(x, w, eps, False)


def test_cuda_tensor_without_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises((RuntimeError, AssertionError)):
        After.apply(torch.randn(2, 8, device="cuda"), torch.randn(8, device="cuda"), 1e-6, False)
