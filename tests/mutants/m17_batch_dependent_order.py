"""Mutant 17: the row reduction splits D in two when there are few rows.

A split-K heuristic keyed on the number of rows: every value is right to rounding, but a
row's bits depend on its batch. Deliberately not the fixed-order row_sum.

Everything else is a correct batch-invariant RMSNorm (see tests/mutants/README.md): the
defect is marked ``# MUTANT``.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.sums.reduction import row_sum as _fixed_row_sum


def row_sum(t: torch.Tensor) -> torch.Tensor:  # MUTANT
    # Few rows: two half-row partial sums (more parallelism); many rows: one pass.
    rows = t.reshape(-1, t.shape[-1])
    if rows.shape[0] < 32 and t.shape[-1] >= 2:
        half = t.shape[-1] // 2
        out = _fixed_row_sum(rows[:, half:]) + _fixed_row_sum(rows[:, :half])
    else:
        out = _fixed_row_sum(rows)
    return out.reshape(t.shape[:-1])


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
        dw = (gc * xc * r).reshape(-1, d).sum(dim=0)
        return dx.to(x.dtype), dw.to(weight.dtype), None, None
