"""Gradients of a half-precision kernel, checked by *lifting* the finite differences.

Central differences of a bf16/fp16 forward sit on a floor near 1e-1: useless. But the
inputs of a bf16 point are exactly representable in fp32 and fp64, so the *same kernel's*
forward can be evaluated there — at exactly the inputs its bf16 backward saw — and
differenced on that dtype's floor. The kernel's bf16 ``dx`` / ``dw`` is then compared with
that lifted reference ``R``, element by element, against

    tol_i = ½ ulp_out(R_i) + u_fp32 · K_OPS · M_i
          + K_SIGMA · sqrt(σ_fd,i² + (u_fp32 σ_k,i)²) + K_TRUNC · T_i

(:func:`gradcheck_bi.tolerance.half.lifted_tolerance`), where ``σ_fd`` and ``T`` are the
lifted estimate's noise and truncation (:mod:`gradcheck_bi.tolerance.noise`) and ``σ_k`` the
kernel's own fp32 rounding in any summation order (:mod:`gradcheck_bi.tolerance.summation`:
dx's row dot over D and r's mean square, dw's sum over the rows),
from the terms, so an element that cancels to near 0 is not held to the ulp of its tiny
value. ``M_i`` is the magnitude of the terms that make up element ``i`` (dx:
``|g γ r| + 3 r³ |x| Σ|g x γ| / D`` — r's relative error enters the variance term three
times; dw: ``Σ_rows |g x r|``). A kernel that computes in fp32 and rounds each gradient once
to the output dtype stays within ``tol``; one that rounds an intermediate to bf16, or sums
in bf16, is off by ulps.

The lifted dtype is fp64 if the kernel's forward accepts it and is accurate to fp64 there,
else fp32. A kernel that
refuses both is compared with the independent fp64 reference formula, and the details
say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi import fd, lowp
from gradcheck_bi.checks._measure import measured_per_element, nonfinite
from gradcheck_bi.checks.probe import refusal
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import analytic_grads, call_forward, forward_in_w, forward_in_x
from gradcheck_bi.kernels.rmsnorm import reference_forward
from gradcheck_bi.tolerance.half import U_COMPUTE, higher_tolerance, lifted_tolerance
from gradcheck_bi.tolerance.noise import unit_roundoff
from gradcheck_bi.tolerance.rules import fd_tolerance, forward_tolerance
from gradcheck_bi.tolerance.summation import (
    combined_floor,
    detectable,
    dw_sigma,
    dw_terms,
    dx_magnitude,
    dx_sigma,
)
from gradcheck_bi.vocab import Config, Measurement, Unsupported

LIFT_DTYPES = (torch.float64, torch.float32)


@dataclass
class Lift:
    """The higher dtype the kernel's forward ran in (``None``: it refused every one) and why
    each dtype before it was passed over (``"fp64: Unsupported dtype ..."``)."""

    dtype: torch.dtype | None
    refusals: list[str]

    @property
    def method(self) -> str:
        if self.dtype is None:
            return "independent fp64 formula"
        return f"lifted to {LIFT_NAMES[self.dtype]}"


LIFT_NAMES = {torch.float64: "fp64", torch.float32: "fp32"}


def lift_dtype(fn: Any, x: torch.Tensor, w: torch.Tensor, cfg: Config) -> Lift:
    """The first of fp64, fp32 in which the kernel's forward runs on these inputs **and**
    delivers that dtype's accuracy (:func:`first_lift`).

    A forward that runs in fp64 but computes in fp32 inside (Liger's llama and gemma modes)
    is lifted to fp32: differenced as fp64, its fp32 noise would sit above the floor the
    estimate assumes where there are too few columns to measure it (D = 1).
    """

    def inaccuracy(dt: torch.dtype) -> str | None:
        xh, wh = x.to(dt), w.to(dt)
        with torch.no_grad():
            y = call_forward(fn, xh, wh, cfg.eps, cfg.zero_centered_gamma)
        ref = reference_forward(xh, wh, cfg.eps, cfg.zero_centered_gamma)
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        u = unit_roundoff(dt)
        err = float((y.to(torch.float64) - ref).abs().max()) if ref.numel() else 0.0
        if err > forward_tolerance(scale, u, u, x.shape[-1]):
            return (f"runs, but its forward is off by {err:.2e} (max |y| {scale:.2e}): less "
                    f"than {LIFT_NAMES[dt]} accuracy inside")
        return None

    return first_lift(inaccuracy)


def first_lift(inaccuracy: Callable[[torch.dtype], str | None]) -> Lift:
    """The first of :data:`LIFT_DTYPES` in which the kernel's forward runs and is accurate:
    ``inaccuracy(dtype)`` runs it there and says how it falls short (``None``: it does not).
    The last dtype is taken if it runs, however accurate.

    Only an explicit refusal of the dtype (:func:`~gradcheck_bi.checks.probe.refusal`)
    moves on to the next; anything else the kernel raises is a crash and propagates.
    """
    refusals = []
    for dt in LIFT_DTYPES:
        try:
            short = inaccuracy(dt)
        except Exception as exc:
            why = refusal(exc)
            if why is None:
                raise
            refusals.append(f"{LIFT_NAMES[dt]}: {why}")
            continue
        if short is not None and dt != LIFT_DTYPES[-1]:
            refusals.append(f"{LIFT_NAMES[dt]}: {short}")
            continue
        return Lift(dt, refusals)
    return Lift(None, refusals)


def _reference_grads(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor,
                     cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """dx, dw of the independent fp64 formula (no kernel involved)::

        dx = g γ r - r³ x (Σ_i g_i x_i γ_i) / D,     dw = Σ_rows g x r
    """
    x64, g64 = x.to(torch.float64), g.to(torch.float64)
    gamma = w.to(torch.float64) + (1.0 if cfg.zero_centered_gamma else 0.0)
    r = torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + cfg.eps)
    s = (g64 * x64 * gamma).sum(-1, keepdim=True)
    dx = g64 * gamma * r - r**3 * x64 * s / x.shape[-1]
    return dx, (g64 * x64 * r).reshape(-1, x.shape[-1]).sum(0)


def _term_magnitudes(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor,
                     cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """``M`` for dx and dw (see the module docstring), exact in fp64."""
    x64, g64 = x.to(torch.float64), g.to(torch.float64)
    gamma = w.to(torch.float64) + (1.0 if cfg.zero_centered_gamma else 0.0)
    r = torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + cfg.eps)
    m_dw = (g64 * x64 * r).abs().reshape(-1, x.shape[-1]).sum(0)
    return dx_magnitude(x64, gamma, g64, cfg.eps), m_dw


def judge_lifted(analytic: torch.Tensor, ref: torch.Tensor, floor: torch.Tensor,
           magnitude: torch.Tensor, lift: Lift, cfg: Config, name: str,
           extra: dict[str, Any], higher: Callable[[], str | None] | None = None) -> Measurement:
    a64 = analytic.to(torch.float64)
    rounded = lowp.round_to(ref, analytic.dtype).to(torch.float64)
    err = (a64 - ref).abs()
    # Where the reference overflows the output dtype, the correctly rounded value is ±inf.
    err = torch.where(torch.isinf(a64) & (a64 == rounded), torch.zeros_like(err), err)
    tol = lifted_tolerance(lowp.ulp_of(ref, analytic.dtype), magnitude, floor)
    audit = lowp.audit(analytic, ref)
    unit = lowp.error_ulp(ref, analytic)
    median_ulp = float((err / unit).median()) if err.numel() else 0.0
    details = {
        "method": lift.method,
        "reference": (f"the kernel's own forward in {LIFT_NAMES[lift.dtype]} at the "
                      f"{cfg.dtype} inputs, central differences" if lift.dtype is not None
                      else "the independent fp64 formula (the kernel refuses fp64 and fp32)"),
        "not_correctly_rounded": audit.frac_not_correctly_rounded,
        "max_ulp": audit.max_ulp,
        "mean_signed_ulp": audit.mean_signed_ulp,
        "median_ulp": median_ulp,
        **extra,
    }
    if lift.refusals:
        details["not_lifted_to"] = "; ".join(lift.refusals)
    # Non-finite where the correctly rounded reference is finite (an exact value beyond the
    # dtype's range is inf when correctly rounded, and inf is then the right answer).
    bad = int((~torch.isfinite(a64) & torch.isfinite(rounded)).sum())
    notes = [f"analytic {name} has {bad} non-finite element(s) where the correctly rounded "
             "reference is finite" if bad else "", nonfinite(f"lifted {name}", ref)]
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    tol = fd_tolerance(tol, scale, cfg)
    m = measured_per_element(err, tol, notes, details)
    m.details["detectable_rel"] = detectable(tol, ref)
    if m.worst is not None and err.numel():
        # The output ulp at the element reported: the tables show its error and tolerance
        # in ulps (the JSON keeps units of the gradient).
        m.details["ulp"] = float(unit[tuple(m.worst)])
    if not m.passed and not m.message:
        m.message = _diagnosis(name, audit, median_ulp, higher() if higher else None)
    return m


def _diagnosis(name: str, audit: lowp.AuditResult, median_ulp: float,
               higher: str | None) -> str:
    """A failing gradient in a kernel maintainer's words: precision or formula.

    Decided by the kernel's own backward in the lifted dtype (``higher``: ``"fp64"`` when it
    matched the lifted differences there, ``"!fp64"`` when it did not): a formula error
    shows in every precision, a precision error vanishes when the casts become no-ops.
    Without it (no lift), by the typical (median) element: near-zero elements have huge
    errors in ulps of their own tiny value whatever the cause.
    """
    numbers = (f"{name}: {audit.frac_not_correctly_rounded:.1%} of elements not correctly "
               f"rounded against the lifted reference, median error {median_ulp:.2g} ulp, max "
               f"{audit.max_ulp:.3g}, mean signed {audit.mean_signed_ulp:+.2g} ulp")
    if higher is not None and higher.startswith("!"):
        why = (f"wrong formula: the kernel's {higher[1:]} backward disagrees with its own "
               f"{higher[1:]} forward too")
    elif higher is not None:
        why = (f"precision: in {higher} the same backward matches its forward, so an "
               "intermediate is rounded to, or summed in, a precision below fp32")
    elif median_ulp > lowp.WRONG_FORMULA_ULP:
        why = "the typical element is off beyond any rounding: a wrong formula"
    else:
        why = ("the typical element is off by a few ulps at most: a rounding or accumulation "
               "in low precision, or a formula error this small (the kernel's backward could "
               "not run in a higher precision to tell them apart)")
    return f"{numbers} — {why}"


def _higher_backward(fn: Any, xh: torch.Tensor, wh: torch.Tensor, gh: torch.Tensor,
                     est: fd.FDEstimate, floor: torch.Tensor, magnitude: torch.Tensor,
                     cfg: Config, which: str) -> str | None:
    """``"fp64"`` if the kernel's backward in the lifted dtype matches the lifted
    differences, ``"!fp64"`` if not, ``None`` if it cannot run there."""
    try:
        _, dxh, dwh = analytic_grads(fn, xh, wh, gh, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
    except Exception:  # only a diagnosis: the verdict stands without it
        return None
    grad = dxh if which == "dx" else dwh
    return higher_verdict(grad, est.grad, floor, magnitude, cfg.torch_dtype, xh.dtype)


def higher_verdict(grad: torch.Tensor, reference: torch.Tensor, floor: torch.Tensor,
                   magnitude: torch.Tensor, half: torch.dtype, lifted: torch.dtype) -> str:
    """For :func:`judge_lifted`'s diagnosis: ``"fp64"`` (the ``lifted`` dtype) when the
    kernel's backward run there matches the lifted differences ``reference``, else
    ``"!fp64"``. The formula is right if it is within the lifted floor plus a margin far
    below the half-precision ulp (:func:`gradcheck_bi.tolerance.half.higher_tolerance`)."""
    tol = higher_tolerance(floor, magnitude, unit_roundoff(half))
    name = LIFT_NAMES[lifted]
    ok = bool(((grad.to(torch.float64) - reference).abs() <= tol).all())
    return name if ok else f"!{name}"


def _lifted_inputs(cfg: Config) -> tuple[Any, ...]:
    if cfg.mode != "full":
        raise Unsupported(
            f"the {cfg.dtype} gradient check compares every element with a lifted reference; "
            "--mode directional is for fp32/fp64"
        )
    return make_inputs(cfg)


def fd_extra(est: fd.FDEstimate) -> dict[str, Any]:
    steps = est.step.reshape(-1)
    return {"stencil": est.stencil.name, "step_min": float(steps.min()),
            "step_max": float(steps.max()), "noise_floor": float(est.noise_floor.max()),
            "forward_calls": est.forward_calls}


def _lifted(fn: Any, cfg: Config, which: str) -> Measurement:
    x, w, g = _lifted_inputs(cfg)
    _, dx, dw = analytic_grads(fn, x, w, g, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
    lift = lift_dtype(fn, x, w, cfg)
    m_dx, m_dw = _term_magnitudes(x, w, g, cfg)
    analytic, magnitude = (dx, m_dx) if which == "dx" else (dw, m_dw)
    gamma = w.to(torch.float64) + (1.0 if cfg.zero_centered_gamma else 0.0)
    sigma_k = U_COMPUTE * (dx_sigma(x, gamma, g, cfg.eps) if which == "dx"
                           else dw_sigma(dw_terms(x, g, cfg.eps)))
    if lift.dtype is None:
        ref = _reference_grads(x, w, g, cfg)[0 if which == "dx" else 1]
        zero = torch.zeros_like(ref)
        return judge_lifted(analytic, ref, combined_floor(zero, zero, sigma_k), magnitude, lift,
                      cfg, which, {})
    xh, wh, gh = x.to(lift.dtype), w.to(lift.dtype), g.to(lift.dtype)
    stencil = fd.STENCILS[cfg.stencil]
    if which == "dx":
        fwd_x = forward_in_x(fn, wh, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
        est = fd.input_grad(fwd_x, xh, gh, cfg.eps, stencil, cfg.step_rel, cfg.max_memory)
    else:
        fwd_w = forward_in_w(fn, xh, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
        est = fd.weight_grad(fwd_w, wh, xh, gh, stencil)
        assert est.terms is not None  # dw's terms as the forward makes them
        sigma_k = U_COMPUTE * dw_sigma(est.terms)
    assert est.sigma is not None and est.truncation is not None
    floor = combined_floor(est.sigma, est.truncation, sigma_k)
    return judge_lifted(analytic, est.grad, floor, magnitude, lift, cfg, which,
                  fd_extra(est), lambda: _higher_backward(fn, xh, wh, gh, est, floor,
                                                           magnitude, cfg, which))


def check_dx_lifted(fn: Any, cfg: Config) -> Measurement:
    """The kernel's half-precision ``dx`` against its own forward lifted to fp64 / fp32."""
    return _lifted(fn, cfg, "dx")


def check_dw_lifted(fn: Any, cfg: Config) -> Measurement:
    """The kernel's half-precision ``dw`` against its own forward lifted to fp64 / fp32."""
    return _lifted(fn, cfg, "dw")


__all__ = ["LIFT_DTYPES", "LIFT_NAMES", "Lift", "check_dw_lifted", "check_dx_lifted",
           "fd_extra", "first_lift", "higher_verdict", "judge_lifted", "lift_dtype"]
