"""Mutant ln05: the normalised row rounded to the input dtype before γ and β (blind in fp64).

Everything else is the correct kernel of tests/kernels/: the defect is marked ``# MUTANT``.
"""

from __future__ import annotations

from typing import Any

import torch


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the last dim by pairwise halving: the order depends on D only."""
    d = t.shape[-1]
    width = 1 << max(0, (d - 1).bit_length())
    if width != d:
        t = torch.nn.functional.pad(t, (0, width - d))
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


class Mutant(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor, eps: float) -> torch.Tensor:
        cdt = torch.promote_types(x.dtype, torch.float32)
        d = x.shape[-1]
        xc = x.to(cdt)
        c = xc - (tree_sum(xc) / d).unsqueeze(-1)
        rho = 1.0 / torch.sqrt(tree_sum(c * c) / d + eps)
        n = (c * rho.unsqueeze(-1)).to(x.dtype).to(cdt)  # MUTANT
        ctx.save_for_backward(n, weight, rho)
        ctx.dtype = x.dtype
        return (n * weight.to(cdt) + bias.to(cdt)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        n, weight, rho = ctx.saved_tensors
        cdt, d = n.dtype, n.shape[-1]
        g = dy.to(cdt)
        gw = g * weight.to(cdt)
        m1 = (tree_sum(gw) / d).unsqueeze(-1)
        m2 = (tree_sum(gw * n) / d).unsqueeze(-1)
        dx = rho.unsqueeze(-1) * (gw - m1 - n * m2)
        dw = (g * n).reshape(-1, d).sum(0)
        db = g.reshape(-1, d).sum(0)
        return dx.to(ctx.dtype), dw.to(weight.dtype), db.to(weight.dtype), None
