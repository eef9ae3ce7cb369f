"""The finite-difference noise floor: one model for dx, directional dx, dw and the row ops.

The forward is evaluated at ``±o·h`` for ``o`` in the levels ``(1, 2, 4)`` and once
unperturbed (``y0``); :mod:`gradcheck_bi.fd` does that and hands the level sums here. Per
perturbed column (dx), direction (directional dx) or weight (dw), with ``S_o = Σ_i g_i
(y_i(+o) - y_i(-o))`` and ``A_o = Σ_i g_i ((y_i(+o) - y0_i) + (y_i(-o) - y0_i))``
(differences exact in fp64, see :mod:`~gradcheck_bi.fd.estimate`):

* **truncation**, by Richardson from the next level: the estimate ``E(h) = Σ w S_o / h``
  errs by ``c h^p`` (``p`` the stencil's order), ``E(2h)`` by ``2^p c h^p``, so
  ``T = |E(2h) - E(h)| / (2^p - 1)`` (:func:`truncation`). No constant from RMSNorm's
  Taylor series.
* **rounding, measured**: ``R = 64 A_1 - 20 A_2 + A_4`` cancels every smooth term below
  ``h^6`` (the coefficients are orthogonal to ``(1, 4, 16)`` and ``(1, 16, 256)``), leaving
  ``8 h^6 f^(6)`` (negligible at our steps), a ``-90 Σ g y0`` shared by all columns of a row
  (removed by centring) and the forward's rounding noise, ``Var R = 8994 σ²`` with ``σ²`` the
  variance of ``Σ g y`` at one point. The spread of ``R`` over a row's columns measures the
  noise of *this* forward, in whatever precision it really computes. It scales a dtype model
  (:func:`model_sigma`, root-sum-square: roundings add like √D, not like D) by ``λ``
  (:func:`noise_scale`); ``u_eff = λ u`` is the unit roundoff the forward delivers.
* **floor** ``= K_SIGMA · σ_E + K_TRUNC · T`` per element, ``σ_E`` the noise of ``E(h)``
  (:func:`noise_floor`).

Everything comes from the forward alone: a wrong backward cannot widen its own tolerance.
The kernel's own rounding in its backward (dw's sum over the rows, above all), which no
finite difference of the forward can show, is a separate model from the inputs:
:mod:`gradcheck_bi.tolerance.summation`, added by the checks.

>>> import torch
>>> unit_roundoff(torch.float64) == 2.0**-53
True
>>> REMAINDER_VAR, Y0_VAR
(8994.0, 8100.0)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch

from gradcheck_bi.sums.reduction import row_sum
from gradcheck_bi.vocab import DTYPES

REMAINDER = (64.0, -20.0, 1.0)  # R = Σ c_o A_o over the levels (1, 2, 4)
REMAINDER_VAR = 2 * sum(c * c for c in REMAINDER)  # Var R = 2 (64² + 20² + 1) σ²
Y0_VAR = (2.0 * sum(REMAINDER)) ** 2  # y0's weight in R, where no row shares it: 90²
# Floor = K_SIGMA σ + K_TRUNC T. A Gaussian exceeds 8σ with probability ~1e-15 per element;
# the largest of 10^6 elements sits near 5σ. T is a deterministic estimate; it over-counts
# the next term (4.2 × the h^6 term of E(h)), and 2 covers a partial cancellation of the
# h^4 and h^6 terms inside E(2h) - E(h).
K_SIGMA = 8.0
K_TRUNC = 2.0
# Pseudo degrees of freedom at λ = 1 (the dtype model): few columns (D = 1, 2, ...) cannot
# decide λ alone.
NU_PRIOR = 8.0


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def judged_roundoff(dtype: torch.dtype, working: str | None) -> float:
    """The unit roundoff a check judges rounding at: ``dtype``'s, or the kernel's measured
    working precision's (``"fp32"`` …) where that is coarser
    (:mod:`gradcheck_bi.checks.precision`)."""
    u = unit_roundoff(dtype)
    return u if working is None else max(u, unit_roundoff(DTYPES[working]))


def pow2_scale(t: torch.Tensor) -> torch.Tensor:
    """Per element the power of two at or below ``|t|`` (1 where ``t`` is 0 or not finite).

    The noise model squares magnitudes: an output of 1e-240 (silu at -550) squares to 0 in
    fp64 and its rounding would vanish from the tolerance. Dividing by a power of two and
    multiplying back is exact, so sums of squares taken on ``t / pow2_scale(t)`` give the
    same bits wherever the plain squares do not underflow or overflow.

    >>> pow2_scale(torch.tensor([3.0, 0.0, -0.75])).tolist()
    [2.0, 1.0, 0.5]
    """
    # t = m·2^e with |m| in [0.5, 1): t / 2m = 2^(e-1) exactly (a representable quotient
    # of representable values, subnormals included; the signs cancel, so no |t| is taken).
    # 0, ±inf and NaN give 0/0, inf/inf, NaN: NaN, made 1. Four ops, where the mask, ones and
    # ldexp took thirteen.
    m = torch.frexp(t).mantissa
    return torch.nan_to_num(t / (m * 2), nan=1.0)


def truncation(e_h: torch.Tensor, e_2h: torch.Tensor, order: int) -> torch.Tensor:
    """``|E(2h) - E(h)| / (2^p - 1)``: Richardson's estimate of the truncation error of
    ``E(h)``, from the same stencil at ``h`` and ``2h``, ``p`` its order."""
    return (e_2h - e_h).abs() / (2.0**order - 1)


def noise_floor(sigma: torch.Tensor, trunc: torch.Tensor) -> torch.Tensor:
    """Per element ``K_SIGMA · σ + K_TRUNC · T``."""
    return K_SIGMA * sigma + K_TRUNC * trunc


def stencil_remainder(even: torch.Tensor) -> torch.Tensor:
    """``R = Σ c_o A_o`` (``c = REMAINDER``): zero for every smooth term below ``h^6``."""
    return level_total(weighted_levels(even, REMAINDER), range(len(REMAINDER)))


@functools.lru_cache(maxsize=32)
def _coefficients(values: tuple[float, ...], dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, made once and only read."""
    return torch.tensor(values, dtype=dtype, device=device)


def weighted_levels(t: torch.Tensor, values: tuple[float, ...]) -> torch.Tensor:
    """``values[i] · t[i]`` for every level ``i`` (``t``'s leading dim) in one op, each
    product the one ``values[i] * t[i]`` makes."""
    c = _coefficients(values, t.dtype, t.device)
    return c.view(-1, *([1] * (t.dim() - 1))) * t[: len(values)]


def level_total(terms: torch.Tensor, levels: Iterable[int]) -> torch.Tensor:
    """``terms[l₁] + terms[l₂] + …`` over ``levels``, added in that order."""
    it = iter(levels)
    total = terms[next(it)]
    for i in it:
        total = total + terms[i]
    return total


def model_sigma(g: torch.Tensor, y: torch.Tensor, u: float) -> torch.Tensor:
    """Rounding of ``Σ_i g_i y_i`` at one point, per row: ``u sqrt(Σ (g y)² + (Σ g y)²)``.

    Each ``y_i`` rounds on its own (``Σ (g y)²``: errors add like √D) and the row's shared
    factor ``r`` adds one error common to the whole row (``(Σ g y)²``).
    """
    gy = g * y
    s = pow2_scale(gy.abs().amax(-1, keepdim=True))  # no underflow (:func:`pow2_scale`)
    gy = gy / s
    return u * s[..., 0] * torch.sqrt(row_sum(gy * gy) + row_sum(gy) ** 2)


def _spread(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A group's value ``(R, n, 1)`` on each of its elements, as ``(R, n k)``."""
    return v.expand_as(like).reshape(like.shape[0], -1)


def reached_sigma(g2: list[torch.Tensor], y0: list[torch.Tensor], reach: list[int]
                  ) -> torch.Tensor:
    """``sqrt(Σ (g y0)² + (Σ g y0)²)`` per column and row ``(D, R)``, each sum over the
    elements column ``c`` reaches: its group of ``reach[k]`` consecutive elements in
    output ``k`` (1: itself only). :func:`model_sigma` in units of ``u``, where a column
    does not move the whole row (:mod:`gradcheck_bi.fd.coloured`)."""
    # Each group's sums are taken on the group's own power of two, then brought to one per
    # row and column, the largest its groups have (:func:`pow2_scale`: the same bits).
    parts = []
    for g, y, k in zip(g2, y0, reach, strict=True):
        gy = (g * y).reshape(g.shape[0], -1, k)
        t = pow2_scale(gy.abs().amax(-1, keepdim=True))
        gy = gy / t
        parts.append((_spread(t, gy), _spread((gy * gy).sum(-1, keepdim=True), gy),
                      _spread(gy.sum(-1, keepdim=True), gy)))
    s = parts[0][0]
    for t, _, _ in parts[1:]:
        s = torch.maximum(s, t)
    sq = torch.zeros_like(y0[0])
    lin = torch.zeros_like(y0[0])
    for t, q, m in parts:
        f = t / s
        sq = sq + q * (f * f)
        lin = lin + m * f
    return (s * torch.sqrt(sq + lin * lin)).T


def _modelled(resid: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows (columns of ``resid``) whose model variance is above 0 everywhere: as they
    are when every row is (one host sync, no copy), else selected."""
    ok = (var > 0).all(0)
    if bool(ok.all()):
        return resid, var
    return resid[:, ok], var[:, ok]


def noise_scale(resid: torch.Tensor, model_var: torch.Tensor, centre: bool) -> float:
    """``λ``: the measured rounding of the forward in units of the dtype model, pooled.

    ``resid`` is ``(n, rows)``: ``n`` remainders per row, each of model variance
    ``model_var`` (broadcast). ``centre`` removes a term the ``n`` share (``y0``), leaving
    ``n - 1`` degrees of freedom. With ``SS`` a row's sum of squares::

        λ² = (Σ_rows SS / model_var + ν0) / (Σ_rows dof + ν0),   ν0 = NU_PRIOR

    Rows whose model variance is 0 (an output that is exactly 0) do not count.
    """
    resid, var = _modelled(resid, model_var.expand_as(resid))
    ss = float(_sum_of_squares(resid, var, centre)) if resid.numel() else 0.0
    return _pooled_scale(ss, _dof(resid, centre))


def _sum_of_squares(resid: torch.Tensor, var: torch.Tensor, centre: bool) -> torch.Tensor:
    """``Σ SS / model_var`` of :func:`noise_scale`, on ``resid``'s device (not read back)."""
    pooled = resid - resid.mean(0, keepdim=True) if centre else resid
    return (pooled * pooled / var).sum()


def _dof(resid: torch.Tensor, centre: bool) -> int:
    return (resid.shape[0] - int(centre)) * resid.shape[1]


def _pooled_scale(ss: float, dof: float) -> float:
    return math.sqrt((ss + NU_PRIOR) / (dof + NU_PRIOR))


# λ without the outliers: a kink inside some stencils puts those columns' remainders orders of
# magnitude above rounding (1e13× in fp64) and the pooled λ with them. A remainder beyond
# TRIM times the median's scale is left out; the rest pool as in noise_scale, so rounding
# that is merely uneven (a cancellation near the kink) still counts. 0.6745: the median of
# |z| for a standard normal z.
MEDIAN_ABS_NORMAL = 0.6745
TRIM = 1000.0


def noise_scales(resid: torch.Tensor, model_var: torch.Tensor, centre: bool
                 ) -> tuple[float, float]:
    """``(λ, λ_robust)``: :func:`noise_scale`, and ``λ`` from the remainders within ``TRIM``
    times the median's scale (at least the dtype model's) of ``|R| / sqrt(model_var)``
    (centred on the median over the ``n``): the rounding where no kink or bend adds to the
    remainder. Every row is taken first, and whether each has a model variance above 0 read
    with the pooled sum and the median: one host sync where every row does (the usual case);
    the rows are selected only where one does not."""
    var = model_var.expand_as(resid)
    if resid.numel():
        z, size, (ss, median, least) = _robust_reads(resid, var, centre)
        if not least > 0:  # a row with model variance 0 (or NaN): as _modelled selects
            resid, var = _modelled(resid, var)
            if resid.numel():
                z, size, (ss, median, _) = _robust_reads(resid, var, centre)
    n, dof = resid.shape[0], _dof(resid, centre)
    if resid.numel() == 0:
        return _pooled_scale(0.0, dof), 1.0
    scale = max(median / MEDIAN_ABS_NORMAL, 1.0)
    kept = z[size <= TRIM * scale]
    dof_kept = kept.numel() * (n - int(centre)) / n
    return (_pooled_scale(ss, dof),
            _pooled_scale(float((kept * kept).sum().item()), dof_kept))


def _robust_reads(resid: torch.Tensor, var: torch.Tensor, centre: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """``z`` of :func:`noise_scales`, ``|z|``, and ``[Σ SS / model_var, median |z|, min
    model_var]`` read by the host together."""
    z = (resid - resid.median(0, keepdim=True).values if centre else resid) / var.sqrt()
    size = z.abs()
    reads = torch.stack([_sum_of_squares(resid, var, centre), size.median(), var.amin()])
    return z, size, reads.tolist()


# dw: the points differ in |y| (γ ± o h), y0 is a column's own (not shared by columns), and
# r does not depend on w, so its rounding is the same at every point (not noise).

def point_var(ys: torch.Tensor, g2: torch.Tensor, u: float) -> torch.Tensor:
    """Model variance of ``Σ_rows g y`` per point and column, ``u² Σ_rows (g y)²``: (P, D)."""
    gy = g2 * ys.to(torch.float64)
    return u * u * row_sum((gy * gy).transpose(1, 2).contiguous())


def dw_remainder_var(pairs: torch.Tensor, pv0: torch.Tensor) -> torch.Tensor:
    """Model variance of :func:`stencil_remainder` per column: each level's pair of points
    (``pairs[l] = v(+o) + v(-o)``, each ``v`` the :func:`point_var` of a ``(R, D)`` output)
    times ``c_o²``, and ``y0``'s (``pv0``: a column's own here) times ``Y0_VAR``."""
    terms = weighted_levels(pairs, tuple(c * c for c in REMAINDER))
    total = Y0_VAR * pv0
    for j in range(len(REMAINDER)):
        total = total + terms[j]
    return total
