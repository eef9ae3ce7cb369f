"""The kernel's own rounding, for every legitimate order of every reduction it performs.

A correct kernel may sum in any order that does not depend on the data: sequential, reversed,
blocked, a tree, split work added by atomics in whatever order they land. Its gradients then
differ from the exact ones by its own rounding, which the finite differences of its forward
cannot show (dw's reference is nearly exact: the forward is linear in w). This module bounds
that rounding statistically, from the terms of this point's data.

**One sum.** Any order of adding ``n`` terms is a binary tree of ``n - 1`` additions; the one
at node ``v`` rounds by ``δ_v · v`` (``|δ| ≤ u``), so the sum errs by ``Σ_v δ_v v`` to first
order, of variance ``σ_δ² Σ_v v²``. A single accumulator walked in any order (sequential,
reversed, an atomic order) has the largest nodes: its prefix sums ``s_2 … s_n``. For terms
in an order independent of their values (exchangeable), with ``Q = Σ t²`` and ``S = Σ t``,
``E s_k² = (k/n) Q + k(k-1)/(n(n-1)) (S² - Q)``, so (:func:`any_order_var`)::

    V = Σ_{k=2..n} E s_k² = (n + 1)(Q/6 + S²/3) - Q/n

A tree or a blocked sum has smaller nodes (``≈ log2 n`` levels of partial sums), so ``V``
covers them too. The bound used is ``K_SIGMA · u · sqrt(V)``: every rounding at RMS ``u``,
while a rounding uniform over its interval has RMS ``≤ u/√3`` and the measured RMS of
sequential, reversed and atomic orders is ``0.36-0.45 u·sqrt(V)`` (docs/summation_orders.md).
The margin, ``8 / 0.45 ≈ 18`` true σ, is for the tail: one order's ``Σ s_k²`` fluctuates about
its mean (for a random walk ``≈ 0.8 χ²₁ ×`` the mean), so the error is a Gaussian scale
mixture (a product of two Gaussians); its chance beyond 18σ is ``< 1e-8`` per element.
The largest error measured over 256-8192 columns per case was ``2.8 u·sqrt(V)`` (35 % of
the bound).

**The reductions of RMSNorm** (``a = g γ r``, ``b = r³ x s / D``, ``dx = a - b``,
``dw = Σ_rows t``, ``t = g x r``), each variance in units of ``u²``:

* mean square over D (terms ``x² ≥ 0``): ``v_ms = V(x²) / S²``, relative. Terms of one sign
  have steady prefix sums (``s_k ≈ (k/n) S``), so this error is Gaussian, no mixture: it is
  counted at the RMS ``u/√3`` of a uniform rounding (``ONE_SIGN = 1/3``; measured 0.39-0.42).
  r inherits half of it (``r = (ms + eps)^(-1/2)``, times ``f = ms / (ms + eps)``) plus
  ``OPS_RSQRT`` roundings: ``v_r = f² v_ms / 12 + OPS_RSQRT`` (:func:`rsigma_var`);
* dx: r's error ``ε`` is common to both terms, ``a(1 + ε) - b(1 + ε)³ ≈ dx + ε (a - 3b)``,
  ``s = Σ g x γ`` is one sum over D, and the products round ``OPS_DIRECT`` /
  ``OPS_VARIANCE`` times::

      var dx = (a - 3b)² v_r + OPS_DIRECT a² + OPS_VARIANCE b²
               + (r³ x / D)² (V(g x γ) + OPS_TERM Σ (g x γ)²)

* dw: a sum over the R rows of ``t = g ∂y/∂w``, measured on the forward (the finite
  difference in w gives it exactly), each term rounded ``OPS_TERM`` times::

      var dw = OPS_TERM Σ_rows t² + V(t over rows)

  r is the forward's: the finite difference in w sees the forward's r exactly (``y`` is
  linear in w), so a backward that uses the saved r, or recomputes it in the forward's
  order, adds nothing there. A backward that recomputes r in *another* order is not
  covered: its dw is off by the difference of two mean-square roundings per row, ``≈ 0.3 u
  sqrt(D/3)`` relative — the same kind of error as an r stored at reduced precision (the
  mutant m22), which the check exists to catch (docs/summation_orders.md has the number);
* forward (:func:`forward_factor`): ``y = x r γ`` is off by r's error and ``OPS_SCALE``
  products; with terms of one sign ``Q ≤ S²``, so ``v_ms ≤ (D + 1) / 2``, a bound in D
  alone, capped by the worst case ``D/2 + 4`` where that is smaller (few terms).

The half-precision path uses the same variances at ``u = 2^-24`` (fp32 arithmetic inside,
:mod:`gradcheck_bi.checks.rows.lift`). Everything here comes from the inputs (x, g, γ, eps),
never from the backward under test.

>>> import torch
>>> t = torch.ones(1, 4, dtype=torch.float64)
>>> any_order_var(t).item()  # sequential: s_2² + s_3² + s_4² = 4 + 9 + 16
29.0
>>> round(forward_factor(255), 1)
30.6
"""

from __future__ import annotations

import math

import torch

from gradcheck_bi.sums.reduction import row_sum
from gradcheck_bi.tolerance.noise import K_SIGMA, K_TRUNC, pow2_scale

OPS_TERM = 2.0  # roundings in forming one product term: g·x·r, g·x·γ
OPS_RSQRT = 2.0  # rsqrt / sqrt / division: not always correctly rounded (GPUs)
OPS_DIRECT = 3.0  # dx's g·γ·r, and its share of the final subtraction
OPS_VARIANCE = 6.0  # dx's r·r·r·x·s/D
OPS_SCALE = 2.0  # the forward's x·r and ·γ
# The mean square adds terms of one sign: its prefix sums grow steadily (s_k ≈ (k/n) S), so
# its error is Gaussian with the RMS u/√3 of a uniform rounding — no mixture tail to cover.
ONE_SIGN = 1.0 / 3.0
# The forward's r, per term of the mean square: ``v_ms ≤ (D + 1) / 2`` terms' worth at
# ONE_SIGN, of which r inherits a quarter (half the relative error).
R_PER_TERM = ONE_SIGN / 8


def any_order_var(terms: torch.Tensor) -> torch.Tensor:
    """``(n + 1)(Q/6 + S²/3) - Q/n`` over the last dim: ``Σ`` of the expected squared partial
    sums that an order walking one accumulator rounds (see the module docstring)."""
    return order_sums(terms)[0]


def order_sums(terms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(any_order_var, Q, S)`` over the last dim: the variance with the two sums it is made
    of, which the models below need again (each sum taken once)."""
    n = terms.shape[-1]
    q = row_sum(terms * terms)
    s = row_sum(terms)
    return (n + 1) * (q / 6 + s * s / 3) - q / n, q, s


def forward_factor(n_cols: int, extra: float = 0.0) -> float:
    """The forward's relative error in units of ``u_compute``: ``K_SIGMA · sqrt(R_PER_TERM
    (D + 1) + OPS_RSQRT + OPS_SCALE + extra)``, or the worst case ``D/2 + OPS_RSQRT +
    OPS_SCALE + extra`` if smaller; ``extra``: an op's further roundings per element."""
    worst = n_cols / 2 + OPS_RSQRT + OPS_SCALE + extra
    return min(worst, K_SIGMA * math.sqrt(R_PER_TERM * (n_cols + 1) + OPS_RSQRT + OPS_SCALE
                                          + extra))


def rsigma_var(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``v_r`` per row (shape ``x.shape[:-1] + (1,)``): r's relative variance in ``u²``."""
    var, _, total = order_sums(x * x)
    return _rsigma_var(var, total, x.shape[-1], eps)


def _rsigma_var(var: torch.Tensor, total: torch.Tensor, n_cols: int,
                eps: float) -> torch.Tensor:
    """:func:`rsigma_var` from the mean square's :func:`order_sums` ``V`` and ``S``."""
    safe = torch.where(total > 0, total, torch.ones_like(total))
    v_ms = torch.where(total > 0, var / (safe * safe), torch.zeros_like(total))
    ms = total / n_cols
    f = ms / (ms + eps) if eps > 0 else torch.ones_like(ms)
    return (ONE_SIGN * f * f * v_ms / 4 + OPS_RSQRT).unsqueeze(-1)


def dx_sigma(x: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """Per element of dx, the RMS of the kernel's own rounding in units of ``u`` (fp64)."""
    x64, g64, gamma64 = (t.detach().to(torch.float64) for t in (x, g, gamma))
    d = x.shape[-1]
    var_ms, _, total = order_sums(x64 * x64)  # r's sum and its rounding: one pass each
    r = torch.rsqrt(total.unsqueeze(-1) / d + eps)
    gxg = g64 * x64 * gamma64
    var_s, q_s, s = order_sums(gxg)
    a = g64 * gamma64 * r
    rx = r**3 * x64
    b = rx * s.unsqueeze(-1) / d
    v_s = (var_s + OPS_TERM * q_s).unsqueeze(-1)
    var = ((a - 3 * b) ** 2 * _rsigma_var(var_ms, total, d, eps) + OPS_DIRECT * a * a
           + OPS_VARIANCE * b * b + (rx / d) ** 2 * v_s)
    return var.sqrt()


def dx_magnitude(x: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """Per element of dx, the magnitude of the terms that make it, fp64: ``|g γ r| + 3 r³ |x|
    Σ|g x γ| / D`` (r's relative error enters the variance term three times). What an error
    of a few ulps of rsqrt or division (not always correctly rounded on GPUs) scales."""
    x64, g64, gamma64 = (t.detach().to(torch.float64) for t in (x, g, gamma))
    r = torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps)
    s_abs = (g64 * x64 * gamma64).abs().sum(-1, keepdim=True)
    return (g64 * gamma64 * r).abs() + 3 * r**3 * x64.abs() * s_abs / x.shape[-1]


def dw_sigma(terms: torch.Tensor) -> torch.Tensor:
    """Per element of dw (shape ``(D,)``), the RMS of the kernel's own rounding in ``u``, from
    its ``(R, D)`` terms ``g ∂y/∂w`` (measured on the forward: ``FDEstimate.terms``)."""
    var, q, _ = order_sums(terms.T.contiguous())  # (D, R): sums over the rows
    return (OPS_TERM * q + var).sqrt()


def combined_floor(sigma_fd: torch.Tensor, truncation: torch.Tensor,
                   sigma_kernel: torch.Tensor) -> torch.Tensor:
    """``K_SIGMA · sqrt(σ_fd² + σ_kernel²) + K_TRUNC · T``: the finite difference's noise and
    the kernel's own rounding are independent, so they add in quadrature (squared on a power
    of two per element, :func:`~.noise.pow2_scale`: a σ of 1e-250 does not square to 0)."""
    both = torch.stack(torch.broadcast_tensors(sigma_fd, sigma_kernel))  # each op on both
    p2 = pow2_scale(both.amax(0))
    a = both / p2
    a = a * a
    return K_SIGMA * p2 * torch.sqrt(a[0] + a[1]) + K_TRUNC * truncation


def detectable(tol: torch.Tensor, reference: torch.Tensor) -> float:
    """The smallest relative error this point would catch, typically: the median over
    elements of ``tol / |reference|`` (elements whose reference is 0 count as ``inf``)."""
    if tol.numel() == 0:
        return math.inf
    return float(detectable_median(tol, reference))


def detectable_median(tol: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """:func:`detectable` of a non-empty ``tol`` as a 0-d tensor where it was computed, for
    a caller that reads it with other numbers (one host sync for all)."""
    ref = reference.abs()
    ratio = torch.where(ref > 0, tol / ref, math.inf)  # tol / 0 is never taken
    return ratio.reshape(-1).median()
