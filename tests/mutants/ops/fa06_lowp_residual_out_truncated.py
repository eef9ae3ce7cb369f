"""Mutant fa06: residual_out truncated to bf16, not rounded (blind in fp64).

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


def truncated(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bf16: the fp32 value's low 16 bits dropped (toward zero); else rounded."""
    if dtype != torch.bfloat16:
        return s.to(dtype)
    bits = s.to(torch.float32).view(torch.int32) & ~0xFFFF  # MUTANT
    return bits.view(torch.float32).to(dtype)


class Mutant(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, residual: torch.Tensor,  # type: ignore[override]
                weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False) -> Any:
        cdt = torch.promote_types(x.dtype, torch.float32)
        s = x.to(cdt) + residual.to(cdt)
        r = 1.0 / torch.sqrt(tree_sum(s * s) / x.shape[-1] + eps)
        gamma = weight.to(cdt) + 1 if zero_centered_gamma else weight.to(cdt)
        y = s * r.unsqueeze(-1) * gamma
        ctx.save_for_backward(s, weight, r)
        ctx.zcg, ctx.dtypes = bool(zero_centered_gamma), (x.dtype, residual.dtype)
        return y.to(x.dtype), truncated(s, x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, dres: torch.Tensor  # type: ignore[override]
                 ) -> tuple[Any, ...]:
        s, weight, r = ctx.saved_tensors
        cdt, d = s.dtype, s.shape[-1]
        gamma = weight.to(cdt) + 1 if ctx.zcg else weight.to(cdt)
        g = dy.to(cdt)
        r = r.unsqueeze(-1)
        dot = tree_sum(g * gamma * s).unsqueeze(-1)
        ds = g * gamma * r - s * r * r * r * dot / d + dres.to(cdt)
        dw = (g * s * r).reshape(-1, d).sum(0)
        return ds.to(ctx.dtypes[0]), ds.to(ctx.dtypes[1]), dw.to(weight.dtype), None, None
