"""Norms without some of their parameters, each wrapping a correct kernel of tests/kernels/
with the identity in place of what it does not take (γ = 1, β = 0).

``layer_norm_plain(x, eps)`` and ``layer_norm_weight(x, weight, eps)`` with ``--op
layer_norm``; ``gated_plain(x, z, eps, group_size, norm_before_gate)`` with ``--op
rms_norm_gated``; ``gated_bias`` (a gated norm with a bias, which the op has as an
optional part): each is checked with every gradient it has, at the identity of what it
lacks, no γ or β control swept.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_norm import LayerNorm
from rms_norm_gated import RMSNormGated, sigmoid


def _ones(x: torch.Tensor) -> torch.Tensor:
    return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)


def layer_norm_plain(x: torch.Tensor, eps: float) -> torch.Tensor:
    return LayerNorm.apply(x, _ones(x), torch.zeros_like(_ones(x)), eps)


def layer_norm_weight(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return LayerNorm.apply(x, weight, torch.zeros_like(weight), eps)


def gated_plain(x: torch.Tensor, z: torch.Tensor, eps: float, group_size: int | None = None,
                norm_before_gate: bool = True) -> torch.Tensor:
    return RMSNormGated.apply(x, z, _ones(x), eps, group_size, norm_before_gate)


def gated_bias(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float, group_size: int | None = None, norm_before_gate: bool = True
               ) -> torch.Tensor:
    """A gated norm with a bias, added before the gate (Mamba-2's order) in the compute
    dtype: ``y = gated(x, z) + β · silu(z)`` before the gate, ``+ β`` after it, rounded
    once (adding β to the rounded norm rounds twice: the bf16 audit fails it)."""
    cdt = torch.promote_types(x.dtype, torch.float32)
    zc = z.to(cdt)
    y = RMSNormGated.apply(x.to(cdt), zc, weight.to(cdt), eps, group_size,
                           norm_before_gate)
    gate = zc * sigmoid(zc.double()).to(cdt)
    beta = bias.to(cdt) * gate if norm_before_gate else bias.to(cdt)
    return (y + beta).to(x.dtype)
