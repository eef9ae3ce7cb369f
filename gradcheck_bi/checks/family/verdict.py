"""A finite-difference gradient check's verdict, element by element, for every op.

Each element is held to its own floor: the finite difference's noise
(:mod:`gradcheck_bi.tolerance.noise`, from the forward alone) and, in quadrature, the
rounding the kernel's own backward may legitimately add in any summation order (the op's
model, :mod:`gradcheck_bi.tolerance.family`, from the inputs alone): a wrong backward cannot
widen its own tolerance. Pass iff ``max_i err_i / tol_i ≤ 1``. ``details["detectable_rel"]``
is the median over elements of ``tol_i / |reference_i|``: the smallest relative error in the
gradient that this point typically catches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks._measure import measured_per_element
from gradcheck_bi.fd.step import input_step_rel
from gradcheck_bi.tolerance.noise import K_SIGMA, K_TRUNC, judged_roundoff, unit_roundoff
from gradcheck_bi.tolerance.rules import fd_tolerance
from gradcheck_bi.tolerance.summation import combined_floor, detectable
from gradcheck_bi.vocab import DTYPES, Config, Measurement


def step_rel_of(cfg: Config) -> float | None:
    """An input's relative FD step: the config's; else, for a kernel computing coarser
    inside than its dtype, its working precision's best step (a step fit for fp64 drowns
    an fp32 forward's differences in its rounding); ``None``: the dtype's."""
    if cfg.step_rel is not None or cfg.working_precision is None:
        return cfg.step_rel
    return input_step_rel(DTYPES[cfg.working_precision])


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
