"""Gradients of a half-precision kernel, checked by *lifting* the finite differences: the
judge, the choice of the lifted dtype and the diagnosis every op's lifted check uses
(:mod:`.lifted`).

Central differences of a bf16/fp16 forward sit on a floor near 1e-1: useless. But the
inputs of a bf16 point are exactly representable in fp32 and fp64, so the *same kernel's*
forward can be evaluated there — at exactly the inputs its bf16 backward saw — and
differenced on that dtype's floor. The kernel's bf16 gradient is then compared with that
lifted reference ``R``, element by element, against

    tol_i = ½ ulp_out(R_i) + u_fp32 · K_OPS · M_i
          + K_SIGMA · sqrt(σ_fd,i² + (u_fp32 σ_k,i)²) + K_TRUNC · T_i

(:func:`gradcheck_bi.tolerance.half.lifted_tolerance`), where ``σ_fd`` and ``T`` are the
lifted estimate's noise and truncation (:mod:`gradcheck_bi.tolerance.noise`), ``σ_k`` the
kernel's own fp32 rounding in any summation order and ``M_i`` the magnitude of the terms
that make up element ``i`` (the op's models, :mod:`gradcheck_bi.tolerance.rows`). A
kernel that computes in fp32 and rounds each gradient once to the output dtype stays within
``tol``; one that rounds an intermediate to bf16, or sums in bf16, is off by ulps.

The lifted dtype is fp64 if the kernel's forward accepts it and is accurate to fp64 there,
else fp32. A kernel that refuses both is compared with the exact gradients, and the details
say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi import fd, lowp
from gradcheck_bi.checks._measure import measured_per_element, nonfinite
from gradcheck_bi.kernels.calling.refusal import refusal
from gradcheck_bi.tolerance.half import higher_tolerance, lifted_tolerance
from gradcheck_bi.tolerance.noise import unit_roundoff
from gradcheck_bi.tolerance.rules import fd_tolerance
from gradcheck_bi.tolerance.summation import detectable
from gradcheck_bi.vocab import Config, Measurement

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


def first_lift(inaccuracy: Callable[[torch.dtype], str | None]) -> Lift:
    """The first of :data:`LIFT_DTYPES` in which the kernel's forward runs and is accurate:
    ``inaccuracy(dtype)`` runs it there and says how it falls short (``None``: it does not).
    The last dtype is taken if it runs, however accurate.

    Only an explicit refusal of the dtype (:func:`~gradcheck_bi.kernels.calling.refusal.refusal`)
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


def judge_lifted(analytic: torch.Tensor, ref: torch.Tensor, floor: torch.Tensor,
                 magnitude: torch.Tensor, lift: Lift, cfg: Config, name: str,
                 extra: dict[str, Any], higher: Callable[[], str | None] | None = None
                 ) -> Measurement:
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
        m.message, m.details["cause"] = _diagnosis(name, audit, median_ulp,
                                                   higher() if higher else None)
    return m


def _diagnosis(name: str, audit: lowp.AuditResult, median_ulp: float,
               higher: str | None) -> tuple[str, str]:
    """A failing gradient in a kernel maintainer's words, and its cause for the closing
    block's ranking (:func:`gradcheck_bi.gate.precision_only`): precision or formula.

    Decided by the kernel's own backward in the lifted dtype (``higher``: ``"fp64"`` when it
    matched the lifted differences there, ``"!fp64"`` when it did not): a formula error
    shows in every precision, a precision error vanishes when the casts become no-ops.
    Without it (no lift), by the typical (median) element: near-zero elements have huge
    errors in ulps of their own tiny value whatever the cause.
    """
    numbers = (f"{name}: {audit.frac_not_correctly_rounded:.1%} of elements not correctly "
               f"rounded against the lifted reference, median error {median_ulp:.2g} ulp, max "
               f"{audit.max_ulp:.3g}, mean signed {audit.mean_signed_ulp:+.2g} ulp")
    cause = "formula"
    if higher is not None and higher.startswith("!"):
        why = (f"wrong formula: the kernel's {higher[1:]} backward disagrees with its own "
               f"{higher[1:]} forward too")
    elif higher is not None:
        why, cause = (f"precision: in {higher} the same backward matches its forward, so an "
                      "intermediate is rounded to, or summed in, a precision below fp32"), \
            "precision"
    elif median_ulp > lowp.WRONG_FORMULA_ULP:
        why = "the typical element is off beyond any rounding: a wrong formula"
    else:
        why, cause = ("the typical element is off by a few ulps at most: a rounding or "
                      "accumulation in low precision, or a formula error this small (the "
                      "kernel's backward could not run in a higher precision to tell them "
                      "apart)"), "precision"
    return f"{numbers} — {why}", cause


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


def fd_extra(est: fd.FDEstimate) -> dict[str, Any]:
    steps = est.step.reshape(-1)
    return {"stencil": est.stencil.name, "step_min": float(steps.min()),
            "step_max": float(steps.max()), "noise_floor": float(est.noise_floor.max()),
            "forward_calls": est.forward_calls}
