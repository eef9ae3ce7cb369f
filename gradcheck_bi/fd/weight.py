"""How the output depends on a parameter, read from the kernel's forward, and the weight FD
that fits it.

:func:`~gradcheck_bi.fd.estimate.weight_grad` perturbs every weight at once by a large step
(``WEIGHT_STEP_REL``): exact when output column ``j`` depends on the weight through ``w_j``
alone (*separable*) and linearly. A weight inside the norm (``rmsnorm(x · (1 + w))``) is
neither: every column depends on every weight through the statistic. :func:`weight_shape`
finds out with six forward calls (within ``SLACK`` roundings).

Then the step: a linear function keeps the large step; one that bends gets the input's
relative step (:data:`~gradcheck_bi.fd.step.STEP_REL`, ``u^(1/5)``-sized) times the same
scale, its truncation measured by Richardson as every estimate's. A weight that is not
separable is differenced one element at a time (:func:`weight_grad_each`: ``6 D`` forward
calls).

>>> import torch
>>> x = torch.randn(4, 8, dtype=torch.float64); g = torch.ones_like(x)
>>> w = torch.randn(8, dtype=torch.float64)
>>> u = 2.0**-53
>>> weight_shape(lambda v: x * v, w, 0.5, u), weight_shape(lambda v: x * v * v, w, 0.5, u)
((True, True), (True, False))
>>> weight_shape(lambda v: torch.nn.functional.normalize(x * v, dim=-1), w, 0.5, u)[0]
False
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from gradcheck_bi.fd.chunks import perturbed
from gradcheck_bi.fd.estimate import FDEstimate, jumps
from gradcheck_bi.fd.stencil import (
    CENTRAL4,
    LEVELS,
    Stencil,
    level_offsets,
    level_pairs,
    stencil_estimate,
    stencil_var,
)
from gradcheck_bi.fd.step import input_step_rel, weight_step
from gradcheck_bi.tolerance.noise import (
    REMAINDER_VAR,
    noise_floor,
    noise_scales,
    stencil_remainder,
)

# A column "does not move" / "has no second difference" within this many unit roundoffs of
# the magnitudes involved: a linear kernel rounds each y a few times (rstd, the products);
# a weight inside a norm moves y by O(H²/D) relative, far above at H = 0.5 and any D here.
SLACK = 64.0


def weight_shape(forward: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor, step: float,
                 u: float, known: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[bool, bool]:
    """``(separable, linear)`` of ``forward`` in ``w`` at step ``step``, rounding at ``u``
    (the unit roundoff the kernel is judged at). Six forward calls, ``m`` every other
    element:

    * separable: the columns off ``m`` are the same at ``w + H`` and at ``w + H (1 - m)``
      (the weights on ``m`` differ between the two; at ``w + H`` no output is 0 merely
      because its own weight is, as at γ = zeros);
    * linear: on ``m``, no second difference ``y(w + Hm) + y(w - Hm) - 2 y(w)``, and half the
      step moves ``y`` half as far (an odd function, a scale-invariant norm at γ = 0, has no
      second difference).

    The three tests run as one set of ops on every column, the columns each does not look at
    masked: about twenty ops and one host sync whatever ``D``. ``known``: ``(y(w), y(w + H))``
    in fp64, as ``(rows, D)``, where the caller has them (the weight's finite difference
    evaluates both, :func:`~gradcheck_bi.fd.estimate.weight_grad`): four calls, not six.
    """
    w0 = w.detach()
    n = w0.shape[-1]
    probes, unknown, ignored = _probes(n, w0.dtype, w0.device)
    run = probes if known is None else unknown
    with torch.no_grad():
        ws = perturbed(w0, step * run)
        ys = torch.stack([forward(v).reshape(-1, n) for v in ws]).to(torch.float64)
    if known is not None:
        yp, ym, yh, yb = ys
        ys = torch.stack([known[0], yp, ym, yh, known[1], yb])
    y0, yp, ym, yh, ya, yb = ys
    a0, ap, am, ah, aa, ab = ys.abs()  # every |y| the bounds add, taken once
    diff = torch.stack([ya - yb, yp + ym - 2 * y0, yp + y0 - 2 * yh])
    # each bound |y| added in the order the test lists them (0 + |y| is |y|: none starts at 0)
    both = a0 + ap
    bound = torch.stack([aa + ab, both + am + a0, both + ah + ah])
    within = (diff.abs() <= SLACK * u * bound) | ignored
    # the three answers brought to the host together: one sync
    separable, second, half = within.flatten(1).all(1).tolist()
    return separable, second and half


@functools.lru_cache(maxsize=8)
def _probes(n: int, dtype: torch.dtype, device: torch.device
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`weight_shape`'s six directions ``(0, m, -m, m/2, m + (1 - m), 1 - m)`` (``m``
    every other element); the four whose outputs a caller with ``y(w)`` and ``y(w + H)``
    does not know; and per test the columns it does not look at (``(3, 1, D)``: the
    separable test looks off ``m``, the two linear ones on it). Made once, only read."""
    m = (torch.arange(n, device=device) % 2 == 0).to(dtype)
    probes = torch.stack([0 * m, m, -m, m / 2, m + (1 - m), 1 - m])
    on = m.bool()
    ignored = torch.stack([on, ~on, ~on])[:, None]
    return probes, probes[[1, 2, 3, 5]], ignored


def fitted_step(w: torch.Tensor, linear: bool, dtype: torch.dtype) -> float:
    """The large weight step where ``y`` is linear in ``w``; else the input's relative step
    for ``dtype`` on the same scale, ``max(1, max|w|)``."""
    return weight_step(w) if linear else weight_step(w, input_step_rel(dtype))


def weight_grad_each(
    forward: Callable[[torch.Tensor], torch.Tensor],
    w: torch.Tensor,
    g: torch.Tensor,
    h: float,
    u: float,
    stencil: Stencil = CENTRAL4,
    columns: torch.Tensor | None = None,
) -> FDEstimate:
    """``dL/dw_j`` for ``L = Σ g · forward(w)``, one weight element at a time, every output
    element summed (a weight that is not separable); ``columns`` (bool, ``(D,)``) limits it
    to those elements (0 elsewhere). Noise: the dx model of one point, ``u sqrt(Σ (g y)²)``,
    scaled by ``λ`` measured from the stencil's remainder (:mod:`gradcheck_bi.tolerance.noise`;
    ``y0`` is shared by every column, centred away)."""
    w0 = w.detach()
    n = w0.shape[-1]
    g64 = g.detach().reshape(-1).to(torch.float64)
    cols = torch.arange(n) if columns is None else torch.nonzero(columns.cpu()).reshape(-1)
    n_lev = len(LEVELS)
    sums = torch.zeros(2 * n_lev, n, dtype=torch.float64, device=w0.device)
    pv = torch.zeros_like(sums)
    with torch.no_grad():
        y0 = forward(w0).reshape(-1).to(torch.float64)
        for j in cols.tolist():
            for p, o in enumerate(level_offsets().tolist()):
                wp = w0.clone()
                wp[j] += o * h
                y = forward(wp).reshape(-1).to(torch.float64)
                sums[p, j] = (g64 * (y - y0)).sum()
                pv[p, j] = u * u * ((g64 * y) ** 2).sum()
    odd = sums[:n_lev] - sums[n_lev:]
    even = sums[:n_lev] + sums[n_lev:]
    grad, trunc = stencil_estimate(odd, stencil, h)
    sel = torch.zeros(n, dtype=torch.bool, device=w0.device)
    sel[cols.to(w0.device)] = True
    var0 = u * u * ((g64 * y0) ** 2).sum()
    resid = stencil_remainder(even)[sel][:, None]
    lam, robust = noise_scales(resid, REMAINDER_VAR * var0, centre=True)
    sigma = lam * torch.sqrt(stencil_var(level_pairs(pv), stencil, h))
    h_t = torch.tensor(h, dtype=torch.float64)
    return FDEstimate(grad, noise_floor(sigma, trunc), h_t, stencil,
                      1 + 2 * n_lev * len(cols), lam, lam * u, sigma, trunc,
                      noise_scale_robust=robust,
                      jumps=jumps(even, h_t))
