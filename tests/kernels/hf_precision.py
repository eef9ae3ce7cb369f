"""HF's LlamaRMSNorm (fp32 inside an fp64 call) with a defect just above fp32 rounding.

``LlamaRMSNormDxScaled``: the forward is LlamaRMSNorm's; the input gradient is multiplied
by ``1 + 1e-5`` — about 170 fp32 unit roundoffs, far below fp64's tolerances of a kernel
judged at fp32 before its working precision was measured, and a defect all the same.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.kernels.hf_style import LlamaRMSNorm

DX_SCALE = 1 + 1e-5


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; its backward scales the gradient by ``DX_SCALE``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g * DX_SCALE


class LlamaRMSNormDxScaled(LlamaRMSNorm):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(_ScaleGrad.apply(hidden_states))
