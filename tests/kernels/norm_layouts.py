"""Fused add + RMSNorm kernels that are right on fresh contiguous tensors only: each reads one
tensor as if it were contiguous (``as_strided`` with contiguous strides), the class of bug a
hand-written kernel has when it indexes ``data_ptr`` by row × D. Laid out by gradcheck-bi
(strided views have NaN in their gaps), they read NaN or the wrong elements and must fail.
"""

from __future__ import annotations

from typing import Any

import torch
from fused_add_rms_norm import FusedAddRMSNorm


def _as_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory read as if it were contiguous (wrong for any other layout)."""
    return torch.as_strided(t, t.shape, torch.empty(t.shape).stride())


class ResidualAssumedContiguous(FusedAddRMSNorm):
    """Reads ``residual`` as contiguous in the forward: wrong under x-strided/x-offset."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, residual: torch.Tensor,  # type: ignore[override]
                weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False) -> Any:
        return FusedAddRMSNorm.forward(ctx, x, _as_contiguous(residual), weight, eps,
                                       zero_centered_gamma)


class ResidualGradAssumedContiguous(FusedAddRMSNorm):
    """Reads the cotangent of ``residual_out`` as contiguous: wrong under grad-strided."""

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, dres: torch.Tensor  # type: ignore[override]
                 ) -> tuple[Any, ...]:
        return FusedAddRMSNorm.backward(ctx, dy, _as_contiguous(dres))
