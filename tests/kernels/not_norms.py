"""Modules named like norms that compute no op of the tool (written here, not taken from a
library), each built ``Class(hidden_size, eps)`` as transformers' norm classes are:

* ``NoNorm`` — ``y = x·w + b``, elementwise, no statistic (the shape of MobileBERT's
  ``NoNorm``): its parameters (a weight and a bias) mark a norm with a bias, its output
  scales with x;
* ``InputScaledRMSNorm`` — ``y = rms_norm(x·(1 + w))``, the weight inside the norm and none
  after (the shape of transformers' ``MuseSparkTextInputScaledRMSNorm``): its name says
  RMSNorm, its output is not affine in the weight;
* ``BesselRMSNorm`` — an RMSNorm whose forward divides the sum of x² by D − 1 (a defect
  that keeps a norm's shape): named RMSNorm, checked as one, its forward fails.
"""

from __future__ import annotations

import torch


class NoNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * self.weight + self.bias


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class InputScaledRMSNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _rms(hidden_states * (1.0 + self.weight), self.eps)


class BesselRMSNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        ms = x.pow(2).sum(-1, keepdim=True) / (x.shape[-1] - 1)
        return x * torch.rsqrt(ms + self.eps) * self.weight
