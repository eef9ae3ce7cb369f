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

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks._measure import measured_per_element, to_host
from gradcheck_bi.fd.refine import REFINE, Refined
from gradcheck_bi.fd.stencil import LEVELS
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
from gradcheck_bi.tolerance.summation import combined_floor, detectable_median, dw_sigma
from gradcheck_bi.vocab import Config, Measurement, Unsupported

Refine = Callable[[torch.Tensor], Refined]
Estimate = fd.FDEstimate | fd.DirectionalEstimate


def rounding_scale(est: Estimate, x: torch.Tensor, working: str | None = None) -> float:
    """``max(λ u, u_w)``: the kernel's backward rounds at least at its dtype's ``u`` — or at
    its measured working precision's ``u_w`` where that is coarser
    (:mod:`gradcheck_bi.checks.precision`: it holds where the forward is exactly 0, at
    γ = zeros, too) — and at the forward's measured ``λ u`` where that is coarser still."""
    u = unit_roundoff(x.dtype)
    return max(est.noise_scale * u, judged_roundoff(x.dtype, working))


def fd_verdict(err: torch.Tensor, est: Estimate, reference: torch.Tensor,
               rounding: torch.Tensor, cfg: Config, notes: Sequence[str],
               extra: dict[str, Any] | None = None) -> Measurement:
    """Judge ``err`` element by element against the estimate's noise floor with the kernel's
    own ``rounding`` (σ, absolute) in quadrature — or the config's ``atol``/``rtol``; see
    :func:`~gradcheck_bi.checks._measure.measured_per_element`."""
    assert est.sigma is not None and est.truncation is not None
    floor = combined_floor(est.sigma, est.truncation, rounding)
    tol = fd_tolerance(floor, reference, cfg)
    m = measured_per_element(err, tol, notes, {})
    at = tuple(m.worst or [])
    # the details' numbers, read by the host together: one sync where one each took four
    steps = est.step.reshape(-1)
    ends = [steps[0], steps[0]] if steps.numel() == 1 else [steps.min(), steps.max()]
    read = [*ends, est.noise_floor.max(), est.noise_floor[at], rounding[at]]
    if tol.numel():
        read.append(detectable_median(tol, reference))
    step_min, step_max, floor_max, noise, rounded, *median = to_host(*read)
    m.details = {**_fd_details(est, step_min, step_max, floor_max), **(extra or {}),
                 **m.details, "noise_floor": noise, "rounding_floor": K_SIGMA * rounded,
                 "detectable_rel": median[0] if median else math.inf}
    return m


def _fd_details(est: Estimate, step_min: float, step_max: float, floor_max: float
                ) -> dict[str, Any]:
    """The estimate's details, in the order the report lists them (its step range and
    largest floor as :func:`fd_verdict` read them)."""
    return {
        "stencil": est.stencil.name,
        "step_min": step_min, "step_max": step_max,
        "noise_floor_max": floor_max,
        "k_sigma": K_SIGMA,
        "k_trunc": K_TRUNC,
        "noise_scale": est.noise_scale,  # λ: the forward's measured rounding / dtype model
        "u_eff": est.u_eff,  # the unit roundoff the forward actually delivers
        "forward_calls": est.forward_calls,
    }


# The pooled λ is "contaminated" where it exceeds the median's (at least the dtype model's)
# this many times: rounding noise gives the two within a factor ~1.5, a kink in a few
# stencils orders of magnitude apart (relu(rms_norm) in fp64: 1.5e15).
CONTAMINATED = 16.0
# A forward that rounds coarser than bf16 (u = 2^-8) rounds at no dtype checked here.
IMPLAUSIBLE_U = 2.0**-8


def _tolerance(est: fd.FDEstimate, rounding: torch.Tensor, cfg: Config) -> torch.Tensor:
    assert est.sigma is not None and est.truncation is not None
    return fd_tolerance(combined_floor(est.sigma, est.truncation, rounding), est.grad, cfg)


def _decontaminated(est: fd.FDEstimate, judged: float) -> fd.FDEstimate | None:
    """``est`` with its noise at a λ that kinks did not set, where the pooled one is
    contaminated, else ``None``: contaminated when it exceeds the median's (at least the
    dtype model's) :data:`CONTAMINATED` times, or when the unit roundoff it implies is
    coarser than any dtype's (:data:`IMPLAUSIBLE_U`: no rounding, a kink in every stencil).
    The new λ: the median's if plausible, else the judged roundoff's (``judged``, in units
    of the dtype's ``u``)."""
    robust = max(est.noise_scale_robust or 1.0, 1.0)
    u = est.u_eff / est.noise_scale if est.noise_scale > 0 else 0.0
    implausible = est.u_eff > IMPLAUSIBLE_U
    if not implausible and est.noise_scale <= CONTAMINATED * robust:
        return None
    assert est.sigma is not None and est.truncation is not None
    lam = robust if robust * u <= IMPLAUSIBLE_U else max(judged, 1.0)
    sigma = est.sigma * (lam / est.noise_scale)
    return replace(est, sigma=sigma, noise_floor=noise_floor(sigma, est.truncation),
                   noise_scale=lam, u_eff=lam * u)


class Judge:
    """What every verdict of one check shares: the analytic gradient, the kernel's own
    rounding σ (in units of the judged roundoff, :func:`rounding_scale`), the config."""

    def __init__(self, analytic: torch.Tensor, sigma_k: torch.Tensor, x: torch.Tensor,
                 cfg: Config, notes: Sequence[str], extra: dict[str, Any] | None = None):
        self.analytic = analytic.to(torch.float64)
        self.sigma_k, self.x, self.cfg = sigma_k, x, cfg
        self.notes, self.extra = notes, dict(extra or {})

    def with_sigma(self, sigma_k: torch.Tensor) -> Judge:
        return Judge(self.analytic, sigma_k, self.x, self.cfg, self.notes, self.extra)

    def rounding(self, est: fd.FDEstimate) -> torch.Tensor:
        return rounding_scale(est, self.x, self.cfg.working_precision) * self.sigma_k

    def verdict(self, est: fd.FDEstimate, err: torch.Tensor | None = None,
                more: dict[str, Any] | None = None) -> Measurement:
        err = (self.analytic - est.grad).abs() if err is None else err
        return fd_verdict(err, est, est.grad, self.rounding(est), self.cfg, self.notes,
                          {**self.extra, **(more or {})})

    def judged(self) -> float:
        """The judged roundoff in units of the dtype's (1, or the working precision's)."""
        return (judged_roundoff(self.x.dtype, self.cfg.working_precision)
                / unit_roundoff(self.x.dtype))

    def failing(self, est: fd.FDEstimate) -> torch.Tensor:
        err = (self.analytic - est.grad).abs()
        return ~(per_element_ratio(err, _tolerance(est, self.rounding(est), self.cfg)) <= 1)


def kink_verdict(judge: Judge, est: fd.FDEstimate, refine: Refine | None,
                 more: dict[str, Any] | None = None) -> Measurement:
    """The analytic gradient against ``est`` (:func:`fd_verdict`); where elements fail, or
    the FD's λ is contaminated (:func:`_decontaminated`: then every element is judged at
    the median's λ), the failing ones again at a finer step through ``refine`` (a bool mask
    → :class:`~gradcheck_bi.fd.refine.Refined`), as the module says. Without either, or
    with a note (non-finite values), the first verdict stands untouched."""
    more = dict(more or {})
    m = judge.verdict(est, more=more)
    clean = _decontaminated(est, judge.judged())
    if (m.passed and clean is None) or refine is None or any(judge.notes):
        return m
    first_lam = est.noise_scale
    if clean is not None:
        est = clean
        more["noise_scale_pooled"] = first_lam
    failing = judge.failing(est)
    if not bool(failing.any()):
        out = judge.verdict(est, more=more)
        out.message = _lam_words(first_lam, est)
        return out
    assert est.sigma is not None and est.truncation is not None
    # Estimated again only where some failing element is suspect — its own two steps
    # (h, 2h) disagree beyond noise and by an eighth of its error, or its second
    # differences do not grow as the step squared (:func:`_not_smooth`) — or λ was
    # contaminated; then every failing element (many small kinks of other outputs in a
    # row can pass for smooth). A smooth defect shows neither: it fails at no further cost.
    err = (judge.analytic - est.grad).abs()
    bend = (2.0**est.stencil.order - 1) * est.truncation
    suspect = failing & (((8 * bend >= err) & (bend > K_SIGMA * est.sigma))
                         | _not_smooth(est.jumps, failing, est.sigma))
    if not bool(suspect.any()) and clean is None:
        return m
    fine = refine(failing)
    shape = est.grad.shape
    grad2, trunc2 = fine.grad.reshape(shape), fine.truncation.reshape(shape)
    sigma2 = est.sigma * fine.ratio  # the same rounding over a step 1/ratio as long
    p2 = torch.maximum(est.sigma, sigma2).clamp_min(torch.finfo(torch.float64).tiny)
    allowed = (K_SIGMA * p2 * torch.hypot(est.sigma / p2, sigma2 / p2)
               + K_TRUNC * (est.truncation + trunc2))
    kink = failing & ((est.grad - grad2).abs() > allowed)
    at_point = failing & _at_point(fine, est.sigma)
    kink = kink | at_point
    if not bool(kink.any()) and clean is None:
        return m
    merged = replace(est, grad=torch.where(kink, grad2, est.grad),
                     sigma=torch.where(kink, sigma2, est.sigma),
                     truncation=torch.where(kink, trunc2, est.truncation),
                     noise_floor=torch.where(kink, noise_floor(sigma2, trunc2),
                                             est.noise_floor))
    err2 = (judge.analytic - merged.grad).abs()
    unconverged = at_point | (kink & judge.failing(merged))
    err2 = torch.where(unconverged, torch.zeros_like(err2), err2)
    n_kink, n_left = int(kink.sum()), int(unconverged.sum())
    h = est.step.reshape(-1)
    steps = (f"{float(h.min()):.3g}" if bool((h == h.min()).all())
             else f"{float(h.min()):.3g}–{float(h.max()):.3g} by row")
    if n_left == err2.numel():
        raise Unsupported(
            f"{judge.cfg.check}: every element not differentiable within ±4h/{fine.ratio} "
            f"(h = {steps}): the slope jumps at the point or the FD at h and h/{fine.ratio} "
            "disagree; nothing to judge")
    words = [_lam_words(first_lam, est) if clean is not None else ""]
    if n_kink:
        words.append(
            f"{n_kink} of {err2.numel()} elements not differentiable within ±4h (h = "
            f"{steps}): the FD at h and at h/{fine.ratio} disagree beyond their noise and "
            f"truncation, or the slope jumps at the point; judged at h/{fine.ratio}"
            + (f"; {n_left} of them not differentiable within ±4h/{fine.ratio} either, not "
               "judged" if n_left else ""))
    message = "; ".join(w for w in words if w)
    out = judge.verdict(merged, err2, {
        **more, "not_differentiable": n_kink, "not_differentiable_unjudged": n_left,
        "finer_step_ratio": fine.ratio, "finer_forward_calls": fine.forward_calls})
    out.message = message
    return out


def _at_point(fine: Refined, sigma: torch.Tensor) -> torch.Tensor:
    """Where the finer estimate sees the slope jump at the point (:func:`_jumps_at_point`)."""
    return _jumps_at_point(fine.jumps, fine.mask.reshape(sigma.shape), sigma * fine.ratio)


def _not_smooth(jumps: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor,
                sigma: torch.Tensor) -> torch.Tensor:
    """Where the second differences over the step, ``J_o = A_o / (o h)``, break a smooth
    function's ``J_4 = 4 J_1`` (``o h f''``, to ``h³``) beyond their noise (about ``10 σ``
    of the estimate's) and a tenth of ``J_4``: a kink somewhere within ``±4h``."""
    if jumps is None:
        return torch.zeros_like(mask)
    j1, j4 = (j.reshape(sigma.shape) for j in jumps)
    return mask & ((j4 - 4 * j1).abs() > 10 * K_SIGMA * sigma + 0.1 * j4.abs())


def _jumps_at_point(jumps: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor,
                    sigma: torch.Tensor) -> torch.Tensor:
    """Where the slope jumps at the point itself: the second difference over the step is
    beyond noise (``sigma``, the estimate's) and the same at ``h`` and ``4h`` (smooth: four
    times larger). ``False`` without the second differences (an input's estimate)."""
    if jumps is None:
        return torch.zeros_like(mask)
    j1, j4 = (j.reshape(sigma.shape) for j in jumps)
    return mask & (j1.abs() > 3 * K_SIGMA * sigma) & ((j4 - j1).abs() < 0.5 * j1.abs())


def _lam_words(first: float, est: fd.FDEstimate) -> str:
    return (f"the FD's measured rounding (λ = {first:.3g}, pooled over columns) is set by "
            f"kinks or bends inside the stencils, not by rounding: judged at λ = "
            f"{est.noise_scale:.3g}")


def _as_refined(est: fd.FDEstimate, mask: torch.Tensor, ratio: int) -> Refined:
    trunc = est.truncation if est.truncation is not None else torch.zeros_like(est.grad)
    return Refined(torch.where(mask, est.grad, 0.0), torch.where(mask, trunc, 0.0),
                   mask, est.step, est.forward_calls, ratio, est.jumps)


def _at_least_model(est: fd.FDEstimate) -> fd.FDEstimate:
    """``est`` with ``λ ≥ 1``: at a small step each output moves by a few ulps and rounds
    all or nothing (as :mod:`gradcheck_bi.fd.coloured` says), so a pooled ``λ`` below the
    dtype model measures how often roundings differ, not how large one is."""
    if est.noise_scale >= 1.0 or est.sigma is None or est.truncation is None:
        return est
    sigma = est.sigma / est.noise_scale
    return replace(est, sigma=sigma, noise_floor=noise_floor(sigma, est.truncation),
                   noise_scale=1.0, u_eff=est.u_eff / est.noise_scale)


def _with_offset(est: fd.FDEstimate, y0: torch.Tensor, g: torch.Tensor,
                 offset: torch.Tensor) -> fd.FDEstimate:
    """``est``'s noise with each nonzero output rounding at ``|y - β| + |β|``, not ``|y|``
    (a bias added last nearly cancels next to a ReLU's kink; :mod:`gradcheck_bi.fd.coloured`
    does the same for inputs): per column, the model's ratio, at least 1."""
    n = y0.shape[-1]
    y2, g2 = y0.reshape(-1, n).to(torch.float64), g.reshape(-1, n).to(torch.float64)
    b = offset.to(y2)
    mag = torch.where(y2 != 0, (y2 - b).abs() + b.abs(), torch.zeros_like(y2))
    den = (g2 * y2).pow(2).sum(0).sqrt()
    ratio = torch.where(den > 0, (g2 * mag).pow(2).sum(0).sqrt() / den.clamp_min(1e-300), 1.0)
    assert est.sigma is not None and est.truncation is not None
    sigma = est.sigma * ratio.clamp_min(1.0)
    return replace(est, sigma=sigma, noise_floor=noise_floor(sigma, est.truncation))


def weight_verdict(judge: Judge, forward: Callable[[torch.Tensor], torch.Tensor],
                   w: torch.Tensor, g: torch.Tensor, est: fd.FDEstimate,
                   offset: torch.Tensor | None = None) -> Measurement:
    """A parameter's gradient against ``est`` (:func:`fd.weight_grad`: every element at once,
    the large step), after asking the forward how it depends on the weight
    (:func:`~gradcheck_bi.fd.weight.weight_shape`, six calls: little beside the
    input's ``6 D`` columns). Linear and elementwise: ``est`` stands (then kinks as
    :func:`kink_verdict`). Otherwise it is differenced again at a step that fits, and
    ``details["weight_step"]`` and ``details["weight_fd"]`` say which and why; ``offset``,
    a bias added last, enters the refitted estimate's noise (:func:`_with_offset`)."""
    if any(judge.notes):
        return judge.verdict(est)
    x, stencil = judge.x, est.stencil
    big = float(est.step)
    # y(w) and y(w + 4h), the estimate's own points: weight_shape's step is its outer level
    known = (None if est.points is None
             else (est.points[-1], est.points[LEVELS.index(max(LEVELS))]))
    separable, linear = weight_shape(forward, w, big * max(LEVELS),
                                     judged_roundoff(x.dtype, judge.cfg.working_precision),
                                     known)
    if separable and linear:
        return kink_verdict(judge, est, lambda mask: _as_refined(
            fd.weight_grad(forward, w, x, g, stencil, WEIGHT_STEP_REL / REFINE), mask, REFINE))
    h = fitted_step(w, linear, x.dtype)
    why = ("y is not linear in the weight (its second difference at step "
           f"{big:g}, or its change at half that step, is beyond rounding): step {h:g}, the "
           "input's relative step, truncation measured by Richardson")
    if separable:
        rel = input_step_rel(x.dtype)
        fitted = fd.weight_grad(forward, w, x, g, stencil, rel)

        def refine(mask: torch.Tensor) -> Refined:
            return _as_refined(fd.weight_grad(forward, w, x, g, stencil, rel / REFINE),
                               mask, REFINE)
    else:
        why = ("every output column moves with each weight (not elementwise): each weight "
               f"differenced alone at step {h:g}" + ("" if linear else f"; {why}"))
        u = judged_roundoff(x.dtype, judge.cfg.working_precision)
        fitted = weight_grad_each(forward, w, g, h, u, stencil)

        def refine(mask: torch.Tensor) -> Refined:
            return _as_refined(weight_grad_each(forward, w, g, h / REFINE, u, stencil, mask),
                               mask, REFINE)
    fitted = _at_least_model(fitted)
    if offset is not None:
        with torch.no_grad():
            fitted = _with_offset(fitted, forward(w.detach()), g, offset)
    if fitted.terms is not None:  # the terms g·∂y/∂w at a step that fits (the kernel's σ)
        judge = judge.with_sigma(dw_sigma(fitted.terms))
    out = kink_verdict(judge, fitted, refine, {"weight_step": h, "weight_fd": why})
    out.message = "; ".join(s for s in (f"{judge.cfg.check}: {why}", out.message) if s)
    return out
