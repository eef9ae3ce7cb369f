"""Mutant ls03: every row's gradient stored into row 0 (a program-id bug).

The last row's wins there, the others stay 0; blind on a single row.
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


LANES = 64  # pad rows to whole vector widths: torch's CPU transcendental functions round
# an element differently in the vector loop and in its scalar tail, which moves with the
# batch


def lanes(fn: Any, t: torch.Tensor) -> torch.Tensor:
    """``fn(t)`` elementwise, every element in the vector loop whatever the batch."""
    n = t.shape[-1]
    pad = -n % LANES
    return fn(torch.nn.functional.pad(t, (0, pad)))[..., :n] if pad else fn(t)


class Mutant(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        cdt = torch.promote_types(x.dtype, torch.float32)
        xc = x.to(cdt)
        shifted = xc - xc.amax(-1, keepdim=True)
        y = shifted - lanes(torch.log, tree_sum(lanes(torch.exp, shifted)).unsqueeze(-1))
        ctx.save_for_backward(y)
        ctx.dtype = x.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        g = dy.to(y.dtype)
        dx = g - lanes(torch.exp, y) * tree_sum(g).unsqueeze(-1)
        rows = dx.reshape(-1, dx.shape[-1])
        out = torch.zeros_like(rows)
        for i in range(rows.shape[0]):
            out[0] = rows[i]  # MUTANT: the row index is the program's, not i
        return out.reshape(dx.shape).to(ctx.dtype)
