"""The gradient checks: analytic dx and dw against central differences of the kernel's forward.

* ``dx`` — every element, row-coloured (:func:`gradcheck_bi.fd.input_grad`), or with
  ``mode = "directional"`` the projections ``⟨dx, v⟩`` on random unit ``v`` per row;
* ``dw`` — every element, one perturbation of all weights at once.

Each element is held to its own floor: the finite difference's noise
(:mod:`gradcheck_bi.tolerance.noise`, from the forward alone) and, in quadrature, the
rounding the kernel's own backward may legitimately add in any summation order
(:mod:`gradcheck_bi.tolerance.summation`, from the inputs alone): a wrong backward cannot
widen its own tolerance. Pass iff ``max_i err_i / tol_i ≤ 1``. ``details["detectable_rel"]`` is the
median over elements of ``tol_i / |reference_i|``: the smallest relative error in the
gradient that this point typically catches. bf16/fp16 kernels are checked by lifting the
differences to fp64/fp32 (:mod:`.lifted`).
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks._measure import nonfinite
from gradcheck_bi.checks.fd_judge import (
    Judge,
    fd_verdict,
    kink_verdict,
    rounding_scale,
    weight_verdict,
)
from gradcheck_bi.checks.lifted import check_dw_lifted, check_dx_lifted
from gradcheck_bi.fd.refine import refine_elements
from gradcheck_bi.fd.step import input_step_rel
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import analytic_grads, forward_in_w, forward_in_x
from gradcheck_bi.kernels.reduction import row_sum
from gradcheck_bi.tolerance.summation import dw_sigma, dx_sigma
from gradcheck_bi.vocab import DTYPES, HALF_DTYPES, Config, Measurement


def check_dx(fn: Any, cfg: Config) -> Measurement:
    """Analytic ``dx`` vs. row-coloured central differences of the kernel's own forward
    (bf16/fp16: lifted, see :mod:`.lifted`)."""
    if cfg.dtype in HALF_DTYPES:
        return check_dx_lifted(fn, cfg)
    stencil = fd.STENCILS[cfg.stencil]
    x, w, g = make_inputs(cfg)
    _, dx, _ = analytic_grads(fn, x, w, g, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
    if cfg.mode == "directional":
        return _check_dx_directional(fn, cfg, stencil, x, w, g, dx)
    if cfg.mode != "full":
        raise ValueError(f"unknown mode {cfg.mode!r}; expected 'full' or 'directional'")
    forward = forward_in_x(fn, w, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
    est = fd.input_grad(forward, x, g, cfg.eps, stencil, step_rel_of(cfg), cfg.max_memory)
    notes = [nonfinite("analytic dx", dx), nonfinite("finite-difference dx", est.grad)]
    judge = Judge(dx, dx_sigma(x, _gamma(w, cfg), g, cfg.eps), x, cfg, notes)
    return kink_verdict(judge, est, lambda mask: refine_elements(
        lambda t: [forward(t)], x, [g], est.step, mask, stencil))


def _check_dx_directional(fn: Any, cfg: Config, stencil: fd.Stencil, x: torch.Tensor,
                          w: torch.Tensor, g: torch.Tensor, dx: torch.Tensor) -> Measurement:
    """``⟨dx, v⟩`` vs. central differences along ``cfg.directions`` random unit ``v`` per row.

    The worst index is ``[direction, *row]``; no single element of dx is checked.
    """
    est = fd.directional_input_grad(
        forward_in_x(fn, w, cfg.eps, cfg.zero_centered_gamma, cfg.layout), x, g, cfg.eps,
        cfg.directions, cfg.seed, stencil, step_rel_of(cfg), cfg.max_memory,
    )
    analytic = row_sum(dx.to(torch.float64).unsqueeze(0) * est.directions)
    err = (analytic - est.projection).abs()
    # Each element's rounding, added along the direction without cancellation (a bound).
    sigma_dx = (rounding_scale(est, x, cfg.working_precision)
                * dx_sigma(x, _gamma(w, cfg), g, cfg.eps))
    rounding = row_sum(est.directions.abs() * sigma_dx.unsqueeze(0))
    details = {
        "mode": "directional",
        "directions": cfg.directions,
        "projections_checked": int(est.projection.numel()),
        "coverage": f"dx projected on {cfg.directions} random unit direction(s) per row; "
                    "individual dx elements were not checked",
    }
    notes = [nonfinite("analytic dx", dx), nonfinite("finite-difference projection",
                                                        est.projection)]
    return fd_verdict(err, est, est.projection, rounding, cfg, notes, details)


def _gamma(w: torch.Tensor, cfg: Config) -> torch.Tensor:
    return w.to(torch.float64) + (1.0 if cfg.zero_centered_gamma else 0.0)


def step_rel_of(cfg: Config) -> float | None:
    """An input's relative FD step: the config's; else, for a kernel computing coarser
    inside than its dtype, its working precision's best step (a step fit for fp64 drowns
    an fp32 forward's differences in its rounding); ``None``: the dtype's."""
    if cfg.step_rel is not None or cfg.working_precision is None:
        return cfg.step_rel
    return input_step_rel(DTYPES[cfg.working_precision])


def check_dw(fn: Any, cfg: Config) -> Measurement:
    """Analytic ``dw`` vs. central differences of the forward in the weight."""
    if cfg.dtype in HALF_DTYPES:
        return check_dw_lifted(fn, cfg)
    stencil = fd.STENCILS[cfg.stencil]
    x, w, g = make_inputs(cfg)
    _, _, dw = analytic_grads(fn, x, w, g, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
    fwd_w = forward_in_w(fn, x, cfg.eps, cfg.zero_centered_gamma, cfg.layout)
    est = fd.weight_grad(fwd_w, w, x, g, stencil)
    notes = [nonfinite("analytic dw", dw), nonfinite("finite-difference dw", est.grad)]
    assert est.terms is not None
    return weight_verdict(Judge(dw, dw_sigma(est.terms), x, cfg, notes), fwd_w, w, g, est)
