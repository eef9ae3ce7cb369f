"""bf16/fp16: the ulp audit's pass rule and the lifted gradients' tolerance.

**Forward** (:func:`gradcheck_bi.lowp.passes`): a kernel that computes in fp32 and rounds once
misses the correctly rounded value only where its fp32 result and the exact value straddle a
midpoint of the output grid: a fraction ≈ E|fp32 error| in output ulps, measured 1e-5 (bf16)
and 8e-5 (fp16) on average, ≤ 3e-3 in any of 240 multi-row configs even with a naive
sequential fp32 sum. Each miss is a near-tie: its error is 0.5 ulp + the fp32 error, measured
≤ 0.5056 ulp. Misses cluster when γ is constant (every element of a row sharing x's
significand shares its fate), so one row alone reached 3.3% (33 of 1000) and 11% (7 of 64):
the fraction rule is loose, the ulp rule tight. Double roundings through the output dtype err
by up to ~1.5 ulp on ~25% of elements; one through fp16 on the way to bf16 by up to 0.5625
ulp on ~6% (docs/low_precision.md).

**Gradients** (:mod:`gradcheck_bi.checks.rows.lift`), per element against the kernel's own
forward lifted to fp64/fp32 (:func:`lifted_tolerance`)::

    tol_i = HALF_ULP · ulp_out(R_i)                 one rounding to the output dtype
          + U_COMPUTE · K_OPS · M_i                 rsqrt / sqrt / division, deterministic
          + K_SIGMA · sqrt(σ_fd,i² + (U_COMPUTE σ_k,i)²) + K_TRUNC · T_i

``M_i`` the magnitude of the terms that make up element ``i``; ``K_OPS`` ulps cover rsqrt,
sqrt and division, which GPUs do not always round correctly (measured: Liger's dx at D = 1,
pure cancellation, needs it).

**Diagnosis** (formula or precision?): the same kernel run in a higher dtype is "right" within
that dtype's own tolerance plus ``HIGHER_MARGIN`` of the half-precision ``u`` (a kernel may
compute its fp64 path in fp32, as Liger's llama and gemma modes do).

>>> import torch
>>> zero = torch.zeros(1, dtype=torch.float64)
>>> (lifted_tolerance(torch.full_like(zero, 2.0**-8), zero, zero) / 2.0**-8).tolist()
[0.5]
"""

from __future__ import annotations

import torch

FRAC_THRESHOLD = 0.05
"""Pass: at most this fraction of elements not correctly rounded (or at most MIN_COUNT)."""
MIN_COUNT = 8
"""So many misses always pass: in a small tensor a few near-ties are a large fraction."""
MAX_ULP_THRESHOLD = 0.55
"""Pass: max |y - exact| ≤ this many ulps (0.5 bounds correct rounding; fp32 noise ≤ 0.006)."""

HALF_ULP = 0.5  # one correct rounding to the output dtype
U_COMPUTE = 2.0**-24  # fp32: where a correct half-precision kernel does its arithmetic
K_OPS = 4.0  # ulps of rsqrt / sqrt / division (not always correctly rounded on GPUs)
HIGHER_MARGIN = 1 / 16  # of the half-precision u: far below its ulp, above fp32 inside


def lifted_tolerance(ulp: torch.Tensor, magnitude: torch.Tensor,
                     floor: torch.Tensor) -> torch.Tensor:
    """``HALF_ULP · ulp + U_COMPUTE · K_OPS · magnitude + floor`` per element (``floor``: the
    lifted estimate's, with the kernel's fp32 rounding in quadrature)."""
    return HALF_ULP * ulp + U_COMPUTE * K_OPS * magnitude + floor


def higher_margin(u_half: float) -> float:
    """The diagnosis's margin, relative: ``HIGHER_MARGIN · u`` of the half-precision dtype."""
    return u_half * HIGHER_MARGIN


def higher_tolerance(floor: torch.Tensor, magnitude: torch.Tensor,
                     u_half: float) -> torch.Tensor:
    """The diagnosis's bound on a gradient in the lifted dtype: ``floor + (U_COMPUTE · K_OPS
    + HIGHER_MARGIN · u) · M``."""
    return floor + (U_COMPUTE * K_OPS + higher_margin(u_half)) * magnitude
