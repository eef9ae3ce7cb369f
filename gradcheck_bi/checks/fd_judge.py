"""The finite-difference verdict, shared by every gradient check, and the second look it
takes where the first step did not fit the function.

* :func:`fd_verdict` — each element against its own floor (the FD's noise and truncation,
  the kernel's rounding in quadrature);
* :func:`kink_verdict` — the elements that fail are estimated again at ``h / 16``
  (:mod:`gradcheck_bi.fd.refine`). Where the two estimates agree within their noise and
  truncation the function is smooth there and the failure stands: a wrong gradient. Where
  they disagree the element is **not differentiable within ±4h** (its stencil straddles a
  kink or a bend sharper than the step): it is judged at the finer step instead, and where
  the finer estimate has not converged either (its truncation above its noise) it is left
  unjudged. Both counts are in the details and the message, never dropped silently; only a
  result that has such elements gains those keys;
* :func:`weight_verdict` — a weight the output is not linear in, or not elementwise in
  (:mod:`gradcheck_bi.fd.weight`), is differenced again at a step that fits, then as above.

A kernel whose every failing element is a kink passes, with the message saying how many
elements were not differentiable and at which step they were judged: the contract's
statuses are pass, fail, error and unsupported, a kink is no defect (exit 0 for a correct
norm + ReLU), and ``unsupported`` (exit 3, "could not run here") would misstate a check that
did run and judged every other element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks._measure import measured_per_element
from gradcheck_bi.fd.refine import REFINE, Refined
from gradcheck_bi.fd.step import WEIGHT_STEP_REL, input_step_rel
from gradcheck_bi.fd.weight import fitted_step, weight_grad_each, weight_shape
from gradcheck_bi.tolerance.noise import (
    K_SIGMA,
    K_TRUNC,
    judged_roundoff,
    noise_floor,
    unit_roundoff,
)
from gradcheck_bi.tolerance.rules import fd_tolerance, per_element_ratio
from gradcheck_bi.tolerance.summation import combined_floor, detectable
from gradcheck_bi.vocab import Config, Measurement

Refine = Callable[[torch.Tensor], Refined]
Estimate = fd.FDEstimate | fd.DirectionalEstimate

def rounding_scale(est: fd.FDEstimate | fd.DirectionalEstimate, x: torch.Tensor,
                   working: str | None = None) -> float:
    """``max(λ u, u_w)``: the kernel's backward rounds at least at its dtype's ``u`` — or at
    its measured working precision's ``u_w`` where that is coarser
    (:mod:`gradcheck_bi.checks.precision`: it holds where the forward is exactly 0, at
    γ = zeros, too) — and at the forward's measured ``λ u`` where that is coarser still."""
    u = unit_roundoff(x.dtype)
    return max(est.noise_scale * u, judged_roundoff(x.dtype, working))


def fd_verdict(err: torch.Tensor, est: fd.FDEstimate | fd.DirectionalEstimate,
                reference: torch.Tensor, rounding: torch.Tensor, cfg: Config,
                notes: Sequence[str], extra: dict[str, Any] | None = None) -> Measurement:
    """Judge ``err`` element by element against the estimate's noise floor with the kernel's
    own ``rounding`` (σ, absolute) in quadrature — or the config's ``atol``/``rtol``; see
    :func:`~gradcheck_bi.checks._measure.measured_per_element`."""
    assert est.sigma is not None and est.truncation is not None
    floor = combined_floor(est.sigma, est.truncation, rounding)
    tol = fd_tolerance(floor, float(reference.abs().max()), cfg)
    m = measured_per_element(err, tol, notes, {**_fd_details(est), **(extra or {})})
    at = tuple(m.worst or [])
    m.details["noise_floor"] = float(est.noise_floor[at].item())
    m.details["rounding_floor"] = float(K_SIGMA * rounding[at].item())
    m.details["detectable_rel"] = detectable(tol, reference)
    return m


def _fd_details(est: fd.FDEstimate | fd.DirectionalEstimate) -> dict[str, Any]:
    steps = est.step.reshape(-1)
    return {
        "stencil": est.stencil.name,
        "step_min": float(steps.min()),
        "step_max": float(steps.max()),
        "noise_floor_max": float(est.noise_floor.max()),
        "k_sigma": K_SIGMA,
        "k_trunc": K_TRUNC,
        "noise_scale": est.noise_scale,  # λ: the forward's measured rounding / dtype model
        "u_eff": est.u_eff,  # the unit roundoff the forward actually delivers
        "forward_calls": est.forward_calls,
    }


def _tolerance(est: Estimate, rounding: torch.Tensor, cfg: Config) -> torch.Tensor:
    assert est.sigma is not None and est.truncation is not None
    reference = est.grad if isinstance(est, fd.FDEstimate) else est.projection
    return fd_tolerance(combined_floor(est.sigma, est.truncation, rounding),
                        float(reference.abs().max()), cfg)


def kink_verdict(analytic: torch.Tensor, est: fd.FDEstimate, rounding: torch.Tensor,
                 cfg: Config, notes: Sequence[str], extra: dict[str, Any] | None,
                 refine: Refine | None) -> Measurement:
    """``analytic`` against ``est`` (:func:`fd_verdict`); the elements that fail, again at a
    finer step through ``refine`` (a bool mask of them → :class:`~gradcheck_bi.fd.refine.
    Refined`), as the module says. Without a failure, or with a note (non-finite values),
    the first verdict stands untouched."""
    err = (analytic.to(torch.float64) - est.grad).abs()
    m = fd_verdict(err, est, est.grad, rounding, cfg, notes, extra)
    if m.passed or refine is None or any(notes):
        return m
    assert est.sigma is not None and est.truncation is not None
    failing = ~(per_element_ratio(err, _tolerance(est, rounding, cfg)) <= 1)
    fine = refine(failing)
    shape = est.grad.shape
    grad2, trunc2 = fine.grad.reshape(shape), fine.truncation.reshape(shape)
    sigma2 = est.sigma * fine.ratio  # the same rounding over a step 1/ratio as long
    gap = (est.grad - grad2).abs()
    p2 = torch.maximum(est.sigma, sigma2).clamp_min(torch.finfo(torch.float64).tiny)
    allowed = (K_SIGMA * p2 * torch.hypot(est.sigma / p2, sigma2 / p2)
               + K_TRUNC * (est.truncation + trunc2))
    kink = failing & (gap > allowed)
    if not bool(kink.any()):
        return m
    merged = replace(est, grad=torch.where(kink, grad2, est.grad),
                     sigma=torch.where(kink, sigma2, est.sigma),
                     truncation=torch.where(kink, trunc2, est.truncation),
                     noise_floor=torch.where(kink, noise_floor(sigma2, trunc2),
                                             est.noise_floor))
    err2 = (analytic.to(torch.float64) - merged.grad).abs()
    unconverged = (kink & (K_TRUNC * trunc2 > K_SIGMA * sigma2)
                   & ~(per_element_ratio(err2, _tolerance(merged, rounding, cfg)) <= 1))
    err2 = torch.where(unconverged, torch.zeros_like(err2), err2)
    n_kink, n_left = int(kink.sum()), int(unconverged.sum())
    out = fd_verdict(err2, merged, merged.grad, rounding, cfg, notes, {
        **(extra or {}), "not_differentiable": n_kink, "not_differentiable_unjudged": n_left,
        "finer_step_ratio": fine.ratio, "finer_forward_calls": fine.forward_calls})
    h = est.step.reshape(-1)
    steps = (f"{float(h.min()):.3g}" if bool((h == h.min()).all())
             else f"{float(h.min()):.3g}–{float(h.max()):.3g} by row")
    out.message = (f"{n_kink} of {err.numel()} elements not differentiable within ±4h "
                   f"(h = {steps}): the FD at h and at h/{fine.ratio} disagree beyond their "
                   f"noise and truncation; judged at h/{fine.ratio}"
                   + (f"; {n_left} of them not differentiable within ±4h/{fine.ratio} "
                      "either, not judged" if n_left else ""))
    return out


def _as_refined(est: fd.FDEstimate, mask: torch.Tensor, ratio: int) -> Refined:
    return Refined(torch.where(mask, est.grad, 0.0), torch.where(
        mask, est.truncation if est.truncation is not None else 0.0, 0.0),
        mask, est.step, est.forward_calls, ratio)


def weight_verdict(forward: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor,
                   x: torch.Tensor, g: torch.Tensor, analytic: torch.Tensor,
                   est: fd.FDEstimate, rounding: torch.Tensor, cfg: Config,
                   notes: Sequence[str], extra: dict[str, Any] | None = None) -> Measurement:
    """A parameter's gradient against ``est`` (:func:`fd.weight_grad`: every element at once,
    the large step). Where that fails, or its truncation rather than its noise sets some
    element's floor, the forward is asked how it depends on the weight
    (:func:`~gradcheck_bi.fd.weight.weight_shape`, two calls) and, unless linear and
    elementwise, differenced again at a step that fits; ``details["weight_step"]`` and
    ``details["weight_fd"]`` say which and why. Then kinks as :func:`kink_verdict`."""
    err = (analytic.to(torch.float64) - est.grad).abs()
    m = fd_verdict(err, est, est.grad, rounding, cfg, notes, extra)
    assert est.sigma is not None and est.truncation is not None
    bent = bool((K_TRUNC * est.truncation > K_SIGMA * est.sigma).any())
    if (m.passed and not bent) or any(notes):
        return m
    u = judged_roundoff(x.dtype, cfg.working_precision)
    big = float(est.step)
    separable, linear = weight_shape(forward, w, big, u)
    stencil = est.stencil
    if separable and linear:
        if m.passed:
            return m
        return kink_verdict(analytic, est, rounding, cfg, notes, extra, lambda mask: _as_refined(
            fd.weight_grad(forward, w, x, g, stencil, WEIGHT_STEP_REL / REFINE), mask, REFINE))
    h = fitted_step(w, linear, x.dtype)
    why = ("y is not linear in the weight (a second difference beyond rounding at step "
           f"{big:g}): step {h:g}, the input's relative step, truncation by Richardson")
    if separable:
        rel = input_step_rel(x.dtype)
        fitted = fd.weight_grad(forward, w, x, g, stencil, rel)

        def refine(mask: torch.Tensor) -> Refined:
            return _as_refined(fd.weight_grad(forward, w, x, g, stencil, rel / REFINE),
                               mask, REFINE)
    else:
        why = ("every output column moves with each weight (not elementwise): each weight "
               f"differenced alone at step {h:g}" + ("" if linear else f"; {why}"))
        uu = unit_roundoff(x.dtype)
        fitted = weight_grad_each(forward, w, g, h, uu, stencil)

        def refine(mask: torch.Tensor) -> Refined:
            return _as_refined(weight_grad_each(forward, w, g, h / REFINE, uu, stencil, mask),
                               mask, REFINE)
    more = {**(extra or {}), "weight_step": h, "weight_fd": why}
    out = kink_verdict(analytic, fitted, rounding, cfg, notes, more, refine)
    out.message = "; ".join(s for s in (f"{cfg.check}: {why}", out.message) if s)
    return out
