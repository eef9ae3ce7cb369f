"""A fused add + RMSNorm that computes in fp32 whatever its dtype and rounds ``s·r`` to the
input dtype before the weight multiply (two roundings in bf16, as Liger's ``llama`` casting
mode): a precision choice, not a formula error. In bf16 its forward misses the ulp audit;
in fp64 it is accurate to fp32 only. Torch ops; autograd gives the backward.
"""

from __future__ import annotations

import torch


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.float() + residual.float()
    r = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    y = (s * r).to(x.dtype).float() * weight.float()
    return y.to(x.dtype), s.to(x.dtype)
