"""RMSNorm Functions whose arithmetic depends on the memory they are handed — what a real
kernel does when a strided or transposed tensor takes another code path (another tiling,
another order of a sum). Right on every layout but with other last bits (``SumsByLayout``,
``ForwardSumsByLayout``), or wrong on one layout by a small finite amount (``SlipsOnStridedGrad``):
the layout twins (gradcheck_bi/checks/twins.py) must pass the first two and never the third.
"""

from __future__ import annotations

from typing import Any

import torch
from side_effects import Correct


def _split_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The sum over ``dim`` in another order: its even slices, then its odd ones."""
    t = t.movedim(dim, 0)
    return t[0::2].sum(0) + t[1::2].sum(0)


class SumsByLayout(Correct):
    """The backward sums ``s`` and ``dw`` in another order when its cotangent is not
    contiguous: the same gradients, other last bits."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        if g.is_contiguous():
            return Correct.backward(ctx, g)
        d = x.shape[-1]
        s = _split_sum(g * x * gamma, -1).unsqueeze(-1)
        dx = g * gamma * r - r.pow(3) * x * s / d
        dw = _split_sum((g * x * r).reshape(-1, d), 0)
        return dx, dw, None, None


class ForwardSumsByLayout(Correct):
    """The forward sums ``x²`` in another order when x is not contiguous: y differs in its
    last bits, so no twin can judge its gradients (their own finite differences do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                eps: float, zero_centered_gamma: bool) -> torch.Tensor:
        if x.is_contiguous():
            return Correct.forward(ctx, x, weight, eps, zero_centered_gamma)
        gamma = weight + 1 if zero_centered_gamma else weight
        r = torch.rsqrt(_split_sum(x.pow(2), -1).unsqueeze(-1) / x.shape[-1] + eps)
        ctx.save_for_backward(x, r, gamma)
        return x * r * gamma


class SlipsOnStridedGrad(Correct):
    """dx off by one part in 10⁷ when its cotangent is not contiguous: finite, small, and
    far beyond fp64's rounding — a layout bug the twin's margin must not absorb."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        dx, dw, *rest = Correct.backward(ctx, g)
        return (dx if g.is_contiguous() else dx * (1 + 1e-7)), dw, *rest
