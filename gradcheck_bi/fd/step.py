"""Finite-difference steps: relative to each row's length scale, rounded to a power of two.

The input step for a row is ``h_rel · ℓ`` with ``ℓ = sqrt(Σ_j x_j² + D·eps)`` — the scale
over which ``y`` bends as one ``x_k`` moves. A power of two makes ``x ± h`` exact wherever
the exponent allows.

>>> import torch
>>> row_steps(torch.full((1, 4), 2.0, dtype=torch.float64), 0.0, 2.0**-5).tolist()
[0.125]
"""

from __future__ import annotations

import math

import torch

# Step relative to the row length scale ℓ, per dtype of the forward. Near u^(1/5) for the
# 4th-order stencil (fp64 ~7e-4, fp32 ~4e-2). `gradcheck-bi plot` measures the error against
# the step: its minimum sits at 2^-11 in fp64 and 2^-5 in fp32 (docs/checks.md, docs/img/).
STEP_REL = {torch.float64: 2.0**-11, torch.float32: 2.0**-5}
DEFAULT_STEP_REL = 2.0**-5
# dw: y is linear in w for RMSNorm, so a large step costs no truncation error and divides
# the rounding error.
WEIGHT_STEP_REL = 0.5


def input_step_rel(dtype: torch.dtype, step_rel: float | None = None) -> float:
    """``step_rel`` if given, else the measured best relative step for ``dtype``."""
    return step_rel if step_rel is not None else STEP_REL.get(dtype, DEFAULT_STEP_REL)


def pow2(t: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.round(torch.log2(t)))


def row_steps(x2: torch.Tensor, eps: float, step_rel: float) -> torch.Tensor:
    """Per-row step ``h_rel · sqrt(Σ x^2 + D eps)``, a power of two, fp64, shape (R,)."""
    x64 = x2.to(torch.float64)
    scale = torch.sqrt((x64 * x64).sum(-1) + x2.shape[-1] * eps)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return pow2(step_rel * scale)


def weight_step(w: torch.Tensor, step_rel: float = WEIGHT_STEP_REL) -> float:
    """A power of two near ``step_rel · max(1, max|w|)``: the one step for every weight."""
    scale = max(1.0, float(w.detach().abs().max()))  # exact in any float dtype
    return float(2.0 ** round(math.log2(step_rel * scale)))
