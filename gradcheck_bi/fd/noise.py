"""The finite-difference noise floor: one model for dx, directional dx and dw.

Per estimated derivative (``u`` the unit roundoff of the forward's output dtype):

* rounding   ``K_ROUND · u · (2 Σ_o |w_o|) · Σ_i |g_i| max_o |y_i(±o h)| / h``
* truncation ``K_TRUNC · h_rel² · |D2(h) - D(h)|`` where ``D2(h)`` is the 2nd-order
  difference from the same evaluations. ``D2 - D4 ≈ h² f'''/6`` and the 4th-order error is
  ``h⁴ f⁽⁵⁾/30``, so their ratio is ``(h²/5)·f⁽⁵⁾/f'''``. The row scale enters through
  ``r ∝ (1 + t²)^(-1/2)`` with ``t = x_k/ℓ``, whose Taylor series gives
  ``f⁽⁵⁾/f''' ≈ 25/ℓ²``: hence ``K_TRUNC = 5``.

Both parts come from the forward alone: a wrong backward cannot widen its own tolerance.

>>> import torch
>>> unit_roundoff(torch.float64) == 2.0**-53
True
"""

from __future__ import annotations

import torch

from gradcheck_bi.fd.stencil import Stencil

K_ROUND = 2.0
K_TRUNC = 5.0


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def truncation(difference: torch.Tensor, step_rel: float) -> torch.Tensor:
    """``K_TRUNC · h_rel² · |D2 - D|`` from the difference of the two estimates."""
    return (K_TRUNC * step_rel * step_rel) * difference.abs()


def rounding_coefficient(dtype: torch.dtype, stencil: Stencil) -> float:
    """``K_ROUND · u · 2Σ|w_o|``: multiply by ``Σ|g||y| / h`` for the rounding part."""
    return K_ROUND * unit_roundoff(dtype) * stencil.abs_weight_sum
