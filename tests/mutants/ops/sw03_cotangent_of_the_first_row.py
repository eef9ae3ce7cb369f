"""Mutant sw03: every row's backward reads row 0 of the cotangent.

Blind where every row shares one cotangent, and on a single row.
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
        g = dy.to(a.dtype).reshape(-1, dy.shape[-1])[:1].expand(a.reshape(-1, a.shape[-1]).shape)
        g = g.reshape(a.shape)  # MUTANT: row 0's cotangent for every row
        sig = lanes(torch.sigmoid, a)
        da = g * b * sig * (1 + a * (1 - sig))
        db = g * a * sig
        return da.to(ctx.dtype), db.to(ctx.dtype)
