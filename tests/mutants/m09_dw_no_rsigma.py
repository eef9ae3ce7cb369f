"""Mutant 09: dw forgets the 1/rms factor: Σ g·x instead of Σ g·x·r.

Right whenever the rows have unit RMS, which randn data nearly has.

Everything else is a correct batch-invariant RMSNorm (see tests/mutants/README.md): the
defect is marked ``# MUTANT``.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.sums.reduction import row_sum


class Mutant(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool
    ) -> torch.Tensor:
        cdt = torch.promote_types(x.dtype, torch.float32)
        xc = x.to(cdt)
        wc = weight.to(cdt)
        gamma = wc + 1 if zero_centered_gamma else wc
        mean_sq = row_sum(xc * xc) / x.shape[-1]
        r = 1.0 / torch.sqrt(mean_sq + eps)
        y = xc * r.unsqueeze(-1) * gamma
        ctx.save_for_backward(x, weight, r)
        ctx.zcg = bool(zero_centered_gamma)
        ctx.eps = eps
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, weight, r = ctx.saved_tensors
        cdt = r.dtype
        d = x.shape[-1]
        xc, gc = x.to(cdt), g.to(cdt)
        wc = weight.to(cdt)
        gamma = wc + 1 if ctx.zcg else wc
        r = r.unsqueeze(-1)
        s = row_sum(gc * xc * gamma).unsqueeze(-1)
        dx = gc * gamma * r - r * r * r * xc * s / d
        dw = (gc * xc).reshape(-1, d).sum(dim=0)  # MUTANT
        return dx.to(x.dtype), dw.to(weight.dtype), None, None
