"""Mutant sw02: every row's gradients stored into row 0 (a program-id bug).

The last row's win there, the others stay 0; blind on a single row.
Everything else is the correct kernel of tests/kernels/: the defect is marked ``# MUTANT``.
"""

from __future__ import annotations

from typing import Any

import torch

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
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor  # type: ignore[override]
                ) -> torch.Tensor:
        cdt = torch.promote_types(a.dtype, torch.float32)
        ac, bc = a.to(cdt), b.to(cdt)
        ctx.save_for_backward(ac, bc)
        ctx.dtype = a.dtype
        return (ac * lanes(torch.sigmoid, ac) * bc).to(a.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        g = dy.to(a.dtype)
        sig = lanes(torch.sigmoid, a)
        da = g * b * sig * (1 + a * (1 - sig))
        db = g * a * sig
        return _row_zero(da).to(ctx.dtype), _row_zero(db).to(ctx.dtype)


def _row_zero(t: torch.Tensor) -> torch.Tensor:
    rows = t.reshape(-1, t.shape[-1])
    out = torch.zeros_like(rows)
    for i in range(rows.shape[0]):
        out[0] = rows[i]  # MUTANT: the row index is the program's, not i
    return out.reshape(t.shape)
