"""Finite differences of a kernel's own forward: stencils, steps, coloured batched perturbation.

For ``L = Σ g·y`` the input gradient is estimated column by column with a central stencil

    dL/dx_k ≈ Σ_o w_o · Σ_i g_i (y_i(x + o h e_k) - y_i(x - o h e_k)) / h

(outputs differenced elementwise *before* the dot with ``g``: the pairs nearly cancel, so
the dot adds little rounding). Rows of a norm are independent, so perturbing column ``k``
of *every* row at once gives the derivative for all rows (a row-coloured Jacobian); the
``D`` columns × stencil points are stacked into batched forward calls, chunked under a
memory budget. A batch-invariant kernel gives each perturbed row the same bits in any
chunk, so the chunk size never changes the result.

The weight gradient uses that ``y_i`` depends on ``w`` only through ``w_i`` (the weight is
elementwise): one perturbation of every weight at once gives every ``∂y_i/∂w_i``.

Steps are relative to each row's length scale ``ℓ = sqrt(Σ_j x_j^2 + D·eps)`` — the scale
over which ``y`` bends as one ``x_k`` moves — and rounded to a power of two.

Noise floor estimate, per element (``u`` the unit roundoff of the forward's output dtype):

* rounding   ``K_ROUND · u · (2 Σ_o |w_o|) · Σ_i |g_i| max_o |y_i(±o h)| / h``
* truncation ``K_TRUNC · h_rel^2 · |D2(h) - D(h)|`` where ``D2(h)`` is the 2nd-order
  difference from the same evaluations. ``D2 - D4 ≈ h² f'''/6`` and the 4th-order error is
  ``h⁴ f⁽⁵⁾/30``, so their ratio is ``(h²/5)·f⁽⁵⁾/f'''``. The row scale enters through
  ``r ∝ (1 + t²)^(-1/2)`` with ``t = x_k/ℓ``, whose Taylor series gives
  ``f⁽⁵⁾/f''' ≈ 25/ℓ²``: hence ``K_TRUNC = 5``.

Both parts come from the forward alone: a wrong backward cannot widen its own tolerance.

>>> import torch
>>> from gradcheck_bi.kernels.rmsnorm import After
>>> x = torch.randn(4, 16, dtype=torch.float64); g = torch.randn(4, 16, dtype=torch.float64)
>>> w = torch.randn(16, dtype=torch.float64)
>>> est = input_grad(lambda t: After.apply(t, w, 1e-6, False), x, g, eps=1e-6)
>>> est.grad.shape
torch.Size([4, 16])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradcheck_bi.kernels.reduction import row_sum


@dataclass(frozen=True)
class Stencil:
    """A central difference: ``f' ≈ Σ_o weights[o] (f(x+o h) - f(x-o h)) / h``."""

    name: str
    offsets: tuple[int, ...]
    weights: tuple[float, ...]
    order: int

    @property
    def points(self) -> int:
        return 2 * len(self.offsets)

    @property
    def abs_weight_sum(self) -> float:
        return 2 * sum(abs(w) for w in self.weights)


CENTRAL2 = Stencil("central-2", (1,), (0.5,), 2)
CENTRAL4 = Stencil("central-4", (1, 2), (8 / 12, -1 / 12), 4)
STENCILS = {s.name: s for s in (CENTRAL2, CENTRAL4)}

# Step relative to the row length scale ℓ, per dtype of the forward. Near u^(1/5) for the
# 4th-order stencil (fp64 ~7e-4, fp32 ~4e-2); see docs/benchmarks.md for the measurements.
STEP_REL = {torch.float64: 2.0**-11, torch.float32: 2.0**-5}
K_ROUND = 2.0
K_TRUNC = 5.0

# Bytes held per perturbed element in one chunk: the input, the forward's intermediates
# (a handful of compute-dtype temporaries) and our fp64 copy of the output.
BYTES_PER_ELEMENT = {torch.float64: 8 * 8, torch.float32: 4 * 8 + 8}
DEFAULT_MAX_MEMORY = 1 << 30


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


@dataclass
class FDEstimate:
    """A finite-difference gradient with its per-element noise-floor estimate."""

    grad: torch.Tensor  # fp64, shape of the differentiated tensor
    noise_floor: torch.Tensor  # fp64, same shape
    step: torch.Tensor  # fp64: per row for dx, a scalar for dw
    stencil: Stencil
    forward_calls: int


def _pow2(t: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.round(torch.log2(t)))


def row_steps(x2: torch.Tensor, eps: float, step_rel: float) -> torch.Tensor:
    """Per-row step ``h_rel · sqrt(Σ x^2 + D eps)``, a power of two, fp64, shape (R,)."""
    x64 = x2.to(torch.float64)
    scale = torch.sqrt((x64 * x64).sum(-1) + x2.shape[-1] * eps)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return _pow2(step_rel * scale)


def columns_per_chunk(n_rows: int, n_cols: int, stencil: Stencil, dtype: torch.dtype,
                      max_memory: int) -> int:
    """How many perturbed columns fit in one batched call under ``max_memory`` bytes."""
    per_column = stencil.points * n_rows * n_cols * BYTES_PER_ELEMENT.get(dtype, 64)
    return max(1, min(n_cols, max_memory // max(1, per_column)))


def memory_estimate(n_rows: int, n_cols: int, stencil: Stencil, dtype: torch.dtype) -> int:
    """Bytes one perturbed column needs: the floor under any memory budget."""
    return stencil.points * n_rows * n_cols * BYTES_PER_ELEMENT.get(dtype, 64)


def _combine(ys: torch.Tensor, stencil: Stencil) -> tuple[torch.Tensor, torch.Tensor]:
    """(stencil numerator, 2nd-order numerator at h) from stacked outputs ``[+o..., -o...]``."""
    n = len(stencil.offsets)
    num = torch.zeros_like(ys[0])
    for j, w in enumerate(stencil.weights):
        num += w * (ys[j] - ys[n + j])
    return num, 0.5 * (ys[0] - ys[n])


def input_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    stencil: Stencil = CENTRAL4,
    step_rel: float | None = None,
    max_memory: int = DEFAULT_MAX_MEMORY,
) -> FDEstimate:
    """Central-difference ``dL/dx`` for ``L = Σ g·forward(x)``, every element, row-coloured."""
    n_cols = x.shape[-1]
    x2 = x.detach().reshape(-1, n_cols)
    n_rows = x2.shape[0]
    g2 = g.detach().reshape(-1, n_cols).to(torch.float64)
    rel = step_rel if step_rel is not None else STEP_REL.get(x.dtype, 2.0**-5)
    h = row_steps(x2, eps, rel)
    u = unit_roundoff(x.dtype)
    g_abs = g2.abs()
    signed = torch.tensor(
        [o for o in stencil.offsets] + [-o for o in stencil.offsets], dtype=torch.float64
    )
    grad = torch.empty(n_rows, n_cols, dtype=torch.float64, device=x.device)
    trunc = torch.empty_like(grad)
    rounding = torch.empty_like(grad)
    chunk = columns_per_chunk(n_rows, n_cols, stencil, x.dtype, max_memory)
    calls = 0
    for c0 in range(0, n_cols, chunk):
        cols = torch.arange(c0, min(n_cols, c0 + chunk), device=x.device)
        n_c = cols.numel()
        xs = x2.unsqueeze(0).unsqueeze(0).repeat(stencil.points, n_c, 1, 1)
        delta = (signed.to(x.device)[:, None, None] * h[None, None, :]).to(x.dtype)
        local = torch.arange(n_c, device=x.device)
        # xs[s, c, r, cols[c]] += signed[s] * h[r]
        xs[:, local, :, cols] = xs[:, local, :, cols] + delta.expand(-1, n_c, -1).permute(1, 0, 2)
        with torch.no_grad():
            ys = forward(xs.reshape(-1, n_cols)).reshape(stencil.points, n_c, n_rows, n_cols)
        calls += 1
        ys64 = ys.to(torch.float64)
        num, num2 = _combine(ys64, stencil)
        d = row_sum(num * g2) / h  # (n_c, R)
        d2 = row_sum(num2 * g2) / h
        grad[:, c0 : c0 + n_c] = d.T
        trunc[:, c0 : c0 + n_c] = (K_TRUNC * rel * rel) * (d2 - d).abs().T
        gy = row_sum(ys64.abs().amax(0) * g_abs) / h
        rounding[:, c0 : c0 + n_c] = (K_ROUND * u * stencil.abs_weight_sum) * gy.T
    floor = trunc + rounding
    return FDEstimate(grad.reshape(x.shape), floor.reshape(x.shape), h, stencil, calls)


def weight_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    w: torch.Tensor,
    x: torch.Tensor,
    g: torch.Tensor,
    stencil: Stencil = CENTRAL4,
    step_rel: float = 0.5,
) -> FDEstimate:
    """Central-difference ``dL/dw`` for ``L = Σ g·forward(w)``; the weight is elementwise.

    ``forward`` maps a weight vector to ``y`` of the shape of ``g``. The step is a power of
    two near ``step_rel · max(1, max|w|)``: ``y`` is linear in ``w`` for RMSNorm, so a large
    step costs no truncation error and divides the rounding error.
    """
    n_cols = w.shape[-1]
    g2 = g.detach().reshape(-1, n_cols).to(torch.float64)
    w0 = w.detach()
    scale = max(1.0, float(w0.to(torch.float64).abs().max()))
    h = float(2.0 ** round(math.log2(step_rel * scale)))
    u = unit_roundoff(x.dtype)
    ys = []
    with torch.no_grad():
        for o in list(stencil.offsets) + [-o for o in stencil.offsets]:
            ys.append(forward(w0 + o * h).reshape(-1, n_cols).to(torch.float64))
    stacked = torch.stack(ys)
    num, num2 = _combine(stacked, stencil)
    # Column sums over rows: fixed order via row_sum on the transpose.
    grad = row_sum((num * g2).T.contiguous()) / h
    grad2 = row_sum((num2 * g2).T.contiguous()) / h
    gy_abs = row_sum((g2.abs() * stacked.abs().amax(0)).T.contiguous())  # (D,)
    trunc = (K_TRUNC * step_rel * step_rel) * (grad2 - grad).abs()
    rounding = K_ROUND * u * stencil.abs_weight_sum * gy_abs / h
    return FDEstimate(grad, trunc + rounding, torch.tensor(h, dtype=torch.float64), stencil,
                      stencil.points)
