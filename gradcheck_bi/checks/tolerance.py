"""What each measured error is held to: tolerances as data and small formulas.

* forward: the output's rounding plus a summation bound for the compute dtype,
  ``max|ref| · (u_out + u_c · (4 + 2·log2(D + 1)))``;
* dx, dw: ``FD_SAFETY`` × the largest finite-difference noise floor of the estimate
  (:mod:`gradcheck_bi.fd.noise`), estimated from the forward alone;
* batch invariance: 0, every compared element bitwise identical.

``--atol`` replaces the derived tolerance; ``--rtol`` adds ``rtol × max|reference|``.

>>> forward_tolerance(1.0, 2.0**-53, 2.0**-53, 255) == (1 + 4 + 16) * 2.0**-53
True
"""

from __future__ import annotations

import math

from gradcheck_bi.vocab import Config

FD_SAFETY = 4.0


def forward_tolerance(scale: float, u_out: float, u_compute: float, n_cols: int) -> float:
    """Output rounding plus a summation bound, relative to ``scale = max|ref|``."""
    return scale * (u_out + u_compute * (4 + 2 * math.log2(n_cols + 1)))


def fd_tolerance(floor: float) -> float:
    return FD_SAFETY * floor


def overridden(tol: float, scale: float, cfg: Config) -> float:
    """Apply the config's ``atol`` (replaces) and ``rtol`` (adds ``rtol × scale``)."""
    if cfg.atol is not None:
        tol = cfg.atol
    if cfg.rtol is not None:
        tol += cfg.rtol * scale
    return tol
