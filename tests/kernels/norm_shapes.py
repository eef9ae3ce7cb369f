"""Kernels of the norm family in the shapes people ship them, for the recognition tests:
functions, keyword-only parameters, other parameter orders, nn.Module classes. Written with
torch autograd (their backward is torch's own); only their signatures matter here."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def fused_add(hidden_states, residual, weight, eps=1e-6):  # type: ignore[no-untyped-def]
    s = hidden_states + residual
    return _rms(s, eps) * weight, s


def fused_add_y_only(X, R, W, eps):  # type: ignore[no-untyped-def]
    return _rms(X + R, eps) * W


def gated(z, x, gamma, *, eps=1e-5, group_size=None,  # type: ignore[no-untyped-def]
          norm_before_gate=True):
    g = x.shape[-1] if group_size is None else group_size
    v = x if norm_before_gate else x * F.silu(z)
    n = _rms(v.reshape(*v.shape[:-1], -1, g), eps).reshape(v.shape) * gamma
    return n * F.silu(z) if norm_before_gate else n


def layer_norm(input, weight, bias, variance_epsilon):  # type: ignore[no-untyped-def]
    c = input - input.mean(-1, keepdim=True)
    return _rms(c, variance_epsilon) * weight + bias


def rms_with_optional(x, weight, bias=None, residual=None, eps=1e-6,  # type: ignore[no-untyped-def]
                      prenorm=False):
    if residual is not None or prenorm:
        raise AssertionError("an optional parameter the op does not need was filled")
    y = _rms(x, eps) * weight
    return y if bias is None else y + bias


def fused_and_bias(x, residual, weight, bias, eps):  # type: ignore[no-untyped-def]
    return _rms(x + residual, eps) * weight + bias


class FusedAddNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        s = hidden_states + residual
        return _rms(s, self.eps) * self.weight, s


class GatedNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = True) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        assert z is not None
        return gated(z, x, self.weight, eps=self.eps, group_size=self.group_size,
                     norm_before_gate=self.norm_before_gate)


class BiasNorm(torch.nn.Module):
    """A LayerNorm module whose (D,) parameters are named gamma and beta."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.ones(dim))
        self.beta = torch.nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.gamma, self.beta, self.eps)
