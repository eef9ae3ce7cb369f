"""An RMSNorm written from scratch, to show gradcheck-bi passes a kernel it has never seen.

Derived independently of ``gradcheck_bi/kernels/bundled/rmsnorm.py``, in terms of the normalised
row ``n = x · r`` rather than ``x`` and ``r³``::

    r   = (Σ_j x_j² / D + eps)^(-1/2),   n = x · r,   γ = w (+ 1 under zcg),   y = n · γ
    ∂r/∂x_k = -r³ x_k / D = -r² n_k / D, so with  a = g · γ  (the gradient reaching n):
    dx  = r · a + Σ_i a_i x_i ∂r/∂x_k = r · (a - n · (Σ_i a_i n_i) / D)
    dw  = Σ_rows g · n

Batch invariance comes from its own fixed-order sum, :func:`ordered_sum` (not the
package's ``row_sum``): 32-wide column strips added left to right into a 32-wide
accumulator, then the 32 lanes added left to right. Every operation is elementwise or
walks columns in an order fixed by ``D``, so a row's bits never depend on its batch.
It computes in ``promote(x.dtype, float32)`` and runs on any device torch does.
"""

from __future__ import annotations

from typing import Any

import torch

LANES = 32


def ordered_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in an order that depends only on its length."""
    d = t.shape[-1]
    pad = (-d) % LANES
    if pad:
        t = torch.nn.functional.pad(t, (0, pad))
    strips = t.reshape(*t.shape[:-1], -1, LANES)
    acc = strips[..., 0, :].clone()
    for j in range(1, strips.shape[-2]):
        acc = acc + strips[..., j, :]
    total = acc[..., 0].clone()
    for lane in range(1, LANES):
        total = total + acc[..., lane]
    return total


class IndependentRMSNorm(torch.autograd.Function):
    """``apply(x, weight, eps, zero_centered_gamma) -> y``, Megatron's signature."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool
    ) -> torch.Tensor:
        work = torch.promote_types(x.dtype, torch.float32)
        xw = x.to(work)
        gamma = weight.to(work)
        if zero_centered_gamma:
            gamma = gamma + 1.0
        # 1/sqrt, both correctly rounded: a vectorised rsqrt may round a row's tail lanes
        # differently from its body, which would make bits depend on the batch.
        rinv = (1.0 / torch.sqrt(ordered_sum(xw * xw) / x.shape[-1] + eps)).unsqueeze(-1)
        normed = xw * rinv
        ctx.save_for_backward(normed, rinv, gamma)
        ctx.shapes = (x.dtype, weight.dtype)
        return (normed * gamma).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        normed, rinv, gamma = ctx.saved_tensors
        x_dtype, w_dtype = ctx.shapes
        d = normed.shape[-1]
        gy = grad_y.to(normed.dtype)
        a = gy * gamma
        proj = (ordered_sum(a * normed) / d).unsqueeze(-1)
        grad_x = rinv * (a - normed * proj)
        grad_w = ordered_sum((gy * normed).reshape(-1, d).T.contiguous())
        return grad_x.to(x_dtype), grad_w.to(w_dtype), None, None
