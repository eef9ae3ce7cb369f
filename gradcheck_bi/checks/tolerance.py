"""What each measured error is held to: tolerances as data and small formulas.

* forward: the output's rounding plus a summation bound for the compute dtype,
  ``max|ref| · (u_out + u_c · (4 + 2·log2(D + 1)))``;
* dx, dw: per element, the finite-difference noise floor of that element's estimate
  (:mod:`gradcheck_bi.fd.noise`: ``K_SIGMA`` × the measured rounding noise + ``K_TRUNC`` ×
  Richardson's truncation estimate), from the forward alone; pass iff
  ``max_i err_i / tol_i ≤ 1``;
* batch invariance: 0, every compared element bitwise identical.

``--atol`` replaces the derived tolerance (of every element); ``--rtol`` adds
``rtol × max|reference|``.

>>> forward_tolerance(1.0, 2.0**-53, 2.0**-53, 255) == (1 + 4 + 16) * 2.0**-53
True
>>> import torch
>>> per_element_ratio(torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 2.0])).tolist()
[0.0, inf, 0.5]
"""

from __future__ import annotations

import math

import torch

from gradcheck_bi.vocab import Config


def summation_factor(n_terms: int) -> float:
    """``4 + 2·log2(n + 1)``: rounding errors of a blocked sum of ``n`` terms, in units of
    ``u_compute × Σ|terms|``."""
    return 4 + 2 * math.log2(n_terms + 1)


def forward_tolerance(scale: float, u_out: float, u_compute: float, n_cols: int) -> float:
    """Output rounding plus a summation bound, relative to ``scale = max|ref|``."""
    return scale * (u_out + u_compute * summation_factor(n_cols))


def fd_tolerance(floor: torch.Tensor, scale: float, cfg: Config) -> torch.Tensor:
    """Per-element tolerance: the noise floor, or ``--atol`` in its place; ``--rtol`` adds
    ``rtol × scale`` (the largest |gradient|) to every element."""
    tol = torch.full_like(floor, cfg.atol) if cfg.atol is not None else floor
    return tol + cfg.rtol * scale if cfg.rtol is not None else tol


def per_element_ratio(err: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """``err / tol`` with ``0 / 0 = 0`` and ``x / 0 = inf``; NaN stays NaN.

    ``0 / 0``: an output that is exactly 0 (γ = zeros makes ``y ≡ 0``) gives an exact finite
    difference and a zero floor; an analytic gradient that is exactly 0 there passes, any
    nonzero one fails.
    """
    ratio = err / tol
    return torch.where((err == 0) & (tol == 0), torch.zeros_like(ratio), ratio)


def overridden(tol: float, scale: float, cfg: Config) -> float:
    """Apply the config's ``atol`` (replaces) and ``rtol`` (adds ``rtol × scale``)."""
    if cfg.atol is not None:
        tol = cfg.atol
    if cfg.rtol is not None:
        tol += cfg.rtol * scale
    return tol
