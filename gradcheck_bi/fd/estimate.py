"""Finite-difference estimates with their noise floors: the record every estimate returns,
random directions of an input's gradient, and every element of a weight's gradient.

For ``L = Σ g·y`` a central stencil differences the outputs elementwise *before* the dot
with ``g`` (the pairs nearly cancel, so the dot adds little rounding)::

    ⟨dL/dx, v⟩ ≈ Σ_o w_o · Σ_i g_i (y_i(x + o h v) - y_i(x - o h v)) / h

Every element of an input's gradient, row-coloured: :mod:`~gradcheck_bi.fd.coloured`. The
weight gradient uses that ``y_i`` depends on ``w`` only through ``w_i`` (the weight is
elementwise): one perturbation of every weight at once gives every ``∂y_i/∂w_i``.

Every point is evaluated at ``±h, ±2h, ±4h`` (:data:`~gradcheck_bi.fd.stencil.LEVELS`):
the stencil at ``h`` is the estimate, the rest measure its truncation and rounding. Steps:
:mod:`~gradcheck_bi.fd.step`; the noise floor of each estimate: :mod:`gradcheck_bi.tolerance.noise`.

>>> import torch
>>> from gradcheck_bi.kernels.bundled.rmsnorm import After
>>> x = torch.randn(4, 16, dtype=torch.float64); g = torch.randn(4, 16, dtype=torch.float64)
>>> w = torch.randn(16, dtype=torch.float64)
>>> est = weight_grad(lambda v: After.apply(x, v, 1e-6, False), w, x, g)
>>> est.grad.shape
torch.Size([16])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradcheck_bi.fd.budget import batch_rows, check_budget, chunk_shape, ladder_base
from gradcheck_bi.fd.chunks import pad_rows, perturbed
from gradcheck_bi.fd.reduce import level_sums, native_worth
from gradcheck_bi.fd.stencil import (
    CENTRAL4,
    LEVELS,
    Stencil,
    level_offsets_in,
    level_offsets_on,
    level_pairs,
    stencil_estimate,
    stencil_sum,
    stencil_var,
)
from gradcheck_bi.fd.step import WEIGHT_STEP_REL, input_step_rel, row_steps, weight_step
from gradcheck_bi.fd.threads import cpu_threads, run_steps
from gradcheck_bi.tolerance.noise import (
    REMAINDER_VAR,
    dw_remainder_var,
    model_sigma,
    noise_floor,
    noise_scale,
    noise_scales,
    point_var,
    stencil_remainder,
    unit_roundoff,
)


@dataclass
class FDEstimate:
    """A finite-difference gradient with its per-element noise-floor estimate."""

    grad: torch.Tensor  # fp64, shape of the differentiated tensor
    noise_floor: torch.Tensor  # fp64, same shape
    step: torch.Tensor  # fp64: per row for dx, a scalar for dw
    stencil: Stencil
    forward_calls: int
    noise_scale: float = 1.0  # λ: the forward's measured rounding / the dtype model
    u_eff: float = 0.0  # λ·u: the unit roundoff the forward actually delivers
    # noise_floor = K_SIGMA · sigma + K_TRUNC · truncation, kept apart so that a check can
    # add other independent noise (the kernel's own rounding) in quadrature.
    sigma: torch.Tensor | None = None
    truncation: torch.Tensor | None = None
    # dw only: the (rows, D) terms g·∂y/∂w the analytic dw sums, from the forward
    terms: torch.Tensor | None = None
    # λ from the remainder's median (tolerance.noise.noise_scales): far below λ where
    # kinks inside a few stencils set the pooled one (checks.fd_judge)
    noise_scale_robust: float | None = None
    # (J_1, J_4): the second differences over the step (:func:`jumps`)
    jumps: tuple[torch.Tensor, torch.Tensor] | None = None
    # dw only: the (2L + 1, rows, D) outputs in fp64, the points (+o levels first), then y0
    points: torch.Tensor | None = None


def jumps(even: torch.Tensor, h: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A_1 / h, A_4 / 4h)`` from the even level sums ``A_o = Σ g (y(+o h) + y(-o h) - 2 y0)``:
    at a kink on the point itself each is the jump of the slope, the same at both levels; a
    smooth function gives ``o h f''``, four times larger at the outer level."""
    return even[0] / h, even[LEVELS.index(4)] / (4 * h)

def _unperturbed(forward: Callable[[torch.Tensor], torch.Tensor],
                 x: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """``y0 = forward(x)`` in fp64, as ``(rows, D)``: the centre of the even level sums.
    Called at ``x``'s own shape, which the check's analytic call already fed the kernel (a
    2-D view of a 3-D ``x`` would be one more shape to compile for)."""
    with torch.no_grad():
        y0 = forward(x)
    shape = (*x.shape[:-1], x.shape[-1] if width is None else width)
    if tuple(y0.shape) != shape:
        raise ValueError(f"forward returned shape {tuple(y0.shape)} for {tuple(x.shape)}")
    return y0.reshape(-1, shape[-1]).to(torch.float64)


@dataclass
class DirectionalEstimate:
    """Finite-difference projections ``⟨dL/dx, v⟩`` along random directions, per row.

    ``directions[k]`` is the direction actually stepped along (the realised perturbations,
    combined with the stencil weights, divided by the step): compare ``Σ_i dx_i ·
    directions[k, ..., i]`` with ``projection[k, ...]``. Individual elements of ``dx`` are
    not estimated: an error orthogonal to every direction drawn goes unseen.
    """

    directions: torch.Tensor  # fp64, (K, *x.shape)
    projection: torch.Tensor  # fp64, (K, *x.shape[:-1])
    noise_floor: torch.Tensor  # fp64, same shape as projection
    step: torch.Tensor  # fp64, per row
    stencil: Stencil
    forward_calls: int
    noise_scale: float = 1.0
    u_eff: float = 0.0
    sigma: torch.Tensor | None = None  # as in FDEstimate
    truncation: torch.Tensor | None = None


def directional_input_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    directions: int = 8,
    seed: int = 0,
    stencil: Stencil = CENTRAL4,
    step_rel: float | None = None,
    max_memory: int | None = None,
    *,
    h: torch.Tensor | None = None,
) -> DirectionalEstimate:
    """Central differences of ``L = Σ g·forward(x)`` along ``directions`` random unit vectors
    per row, as jax's ``check_vjp`` does with one: ``stencil.points × directions`` forward
    calls' worth of rows instead of ``stencil.points × D``.

    Each row ``r`` gets its own Gaussian direction ``v`` (unit length, drawn from ``seed``)
    and the step ``h_r`` of :func:`~gradcheck_bi.fd.step.row_steps` (or the given ``h``,
    ``(R,)``); the stencil is applied to ``x_r + o h_r v``. ``forward`` may return rows of
    another width than ``x`` (several outputs side by side), ``g``'s. Noise floor: one
    point's rounding (:func:`~gradcheck_bi.tolerance.noise.model_sigma`) over the whole
    output row, scaled by the ``λ`` its stencil's remainder measures; a row's directions
    share its ``y0``.
    """
    n_cols = x.shape[-1]
    check_budget(tuple(x.shape), stencil, x.dtype, max_memory)
    if directions < 1:
        raise ValueError(f"directions must be >= 1, got {directions}")
    x2 = x.detach().reshape(-1, n_cols)
    n_rows, dev = x2.shape[0], x.device
    width = g.shape[-1]
    g2 = g.detach().reshape(-1, width).to(torch.float64)
    if h is None:
        h = row_steps(x2, eps, input_step_rel(x.dtype, step_rel))
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(directions, n_rows, n_cols, generator=gen, dtype=torch.float64)
    v = (v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)).to(dev)
    n_lev = len(LEVELS)
    signed = level_offsets_on(dev)
    y0 = _unperturbed(forward, x.detach(), width)
    # Stack (direction, row) pairs as rows m = k·R + r.
    n_m = directions * n_rows
    x_m = x2.repeat(directions, 1)
    h_m = h.repeat(directions)
    g_m = g2.repeat(directions, 1)
    y0_m = y0.repeat(directions, 1)
    v_m = v.reshape(n_m, n_cols)
    _, per_call = chunk_shape(n_m, n_cols, stencil, x.dtype, max_memory, dev)
    # Whole multiples of R rows a call: row i of every call is a copy of x's row i mod R
    # (what a forward holding other inputs per row reads, as for input_grad_outputs).
    per_call = max(n_rows, per_call - per_call % n_rows)
    batch = batch_rows(stencil.points * per_call, ladder_base(dev))  # every call's, padded
    sums = torch.empty(2 * n_lev, n_m, dtype=torch.float64, device=dev)
    veff = torch.empty(n_m, n_cols, dtype=torch.float64, device=dev)
    native = native_worth(stencil.points * n_m * n_cols, dev, x.dtype)

    def call(m0: int) -> None:  # one batched forward: every call is `batch` rows
        sl = slice(m0, min(n_m, m0 + per_call))
        xm, hm = x_m[sl], h_m[sl]
        steps = signed[:, None, None] * hm[None, :, None] * v_m[sl][None]
        xs = xm[None] + steps.to(x.dtype)
        with torch.no_grad():
            ys = forward(pad_rows(xs.reshape(-1, n_cols), batch))
        if tuple(ys.shape) != (batch, width):
            raise ValueError(f"forward returned shape {tuple(ys.shape)} for a batch of "
                             f"{(batch, n_cols)}")
        ys = ys[: xs.shape[0] * xs.shape[1]]
        real = xs.to(torch.float64) - xm.to(torch.float64)[None]  # the steps actually taken
        sums[:, sl] = level_sums(ys.reshape(*xs.shape[:-1], width), y0_m[sl], g_m[sl],
                                 native=native)
        veff[sl] = stencil_sum(real[:n_lev] - real[n_lev:], stencil) / hm[:, None]

    starts = range(0, n_m, per_call)
    with cpu_threads(dev, stencil.points * min(per_call, n_m) * n_cols):
        run_steps([functools.partial(call, m0) for m0 in starts], dev)
    calls = 1 + len(starts)
    odd, even = sums[:n_lev], sums[n_lev:]  # (L, K·R)
    proj, trunc = stencil_estimate(odd, stencil, h_m)
    u = unit_roundoff(x.dtype)
    sigma_m = model_sigma(g2, y0, u)  # (R,)
    resid = stencil_remainder(even).reshape(directions, n_rows)  # a row's y0: shared over K
    lam = noise_scale(resid, REMAINDER_VAR * sigma_m**2, centre=True)
    sigma = (lam * stencil.rss_weight) * sigma_m.repeat(directions) / h_m
    lead = (directions, *x.shape[:-1])
    return DirectionalEstimate(veff.reshape(directions, *x.shape), proj.reshape(lead),
                               noise_floor(sigma, trunc).reshape(lead), h,
                               stencil, calls, lam, lam * u, sigma.reshape(lead),
                               trunc.reshape(lead))


def weight_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    w: torch.Tensor,
    x: torch.Tensor,
    g: torch.Tensor,
    stencil: Stencil = CENTRAL4,
    step_rel: float = WEIGHT_STEP_REL,
) -> FDEstimate:
    """Central-difference ``dL/dw`` for ``L = Σ g·forward(w)``; the weight is elementwise.

    ``forward`` maps a weight vector to ``y`` of the shape of ``g``. The step is a power of
    two near ``step_rel · max(1, max|w|)``: ``y`` is linear in ``w`` for RMSNorm, so a large
    step costs no truncation error and divides the rounding error.
    """
    n_cols = w.shape[-1]
    g2 = g.detach().reshape(-1, n_cols).to(torch.float64)
    w0 = w.detach()
    h = weight_step(w0, step_rel)
    with torch.no_grad():
        ws = perturbed(w0, level_offsets_in(w0.dtype, w0.device)[:, None] * h)
        ys = [forward(v).reshape(-1, n_cols) for v in ws]
        ys.append(forward(w0).reshape(-1, n_cols))
    # (2L + 1, R, D): the points, then y0; exact in fp64 once, for the sums, each point's
    # variance (one pass for all: row sums are the same bits in any batch) and the terms
    points = torch.stack(ys).to(torch.float64)
    stacked, y0 = points[:-1], points[-1]
    # Sums over rows, as fixed-order row sums of the transposes: (2L, D).
    sums = level_sums(stacked.transpose(1, 2), y0.T, g2.T)
    n_lev = len(LEVELS)
    odd, even = sums[:n_lev], sums[n_lev:]
    grad, trunc = stencil_estimate(odd, stencil, h)
    u = unit_roundoff(x.dtype)
    pv_all = point_var(points, g2, u)  # each point's and y0's, (2L + 1, D)
    pairs = level_pairs(pv_all[:-1])  # v(+o) + v(-o): the remainder's and the stencil's
    resid, resid_var = stencil_remainder(even)[None], dw_remainder_var(pairs, pv_all[-1])[None]
    lam, robust = noise_scales(resid, resid_var, centre=False)
    # The analytic dw's own sum over the rows is not the estimate's noise: the check adds it
    # (gradcheck_bi.tolerance.summation).
    sigma = lam * torch.sqrt(stencil_var(pairs, stencil, h))
    h_t = torch.tensor(h, dtype=torch.float64)
    terms = g2 * (stacked[0] - stacked[n_lev]) / (2 * h)
    return FDEstimate(grad, noise_floor(sigma, trunc), h_t, stencil,
                      stencil.points + 1, lam, lam * u, sigma, trunc, terms,
                      robust, jumps(even, h), points)
