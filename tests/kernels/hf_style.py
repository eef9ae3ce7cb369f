"""RMSNorm modules shaped the way model code ships them, for the adapter tests.

Written for these tests in the shape of the usual model files (constructor
``(hidden_size, eps)``, a ``weight`` parameter, ``forward(hidden_states)``); only torch is
imported, and nothing here knows gradcheck_bi.

* ``LlamaRMSNorm``      y = w · x r, r computed in fp32, weight initialised to ones;
* ``GemmaRMSNorm``      y = (1 + w) · x r, weight initialised to zeros (zcg built in);
* ``DoubleWeightNorm``  a module around a hand-written autograd Function whose dx carries
                         the weight twice in its variance term (the Megatron defect);
* ``ConfigNorm``        needs a ``config`` constructor argument besides the size and eps;
* ``ScaleNorm``         its parameter is called ``scale``, its size ``dim``;
* functions: ``plain_rms_norm`` (x, weight, eps), ``plain_rms_norm_zcg`` (+ the flag),
  ``offset_rms_norm`` (Liger-style offset); Functions: ``LigerShapedFn`` (Liger's
  parameter names), ``SetupContextFn`` (forward without ctx).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _normalise(hidden_states: torch.Tensor, eps: float) -> torch.Tensor:
    h = hidden_states.to(torch.float32)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        return self.weight * _normalise(hidden_states, self.variance_epsilon).to(dtype)


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _normalise(x, self.eps) * (1.0 + self.weight.float())
        return out.to(x.dtype)


class _DoubleWeightFn(torch.autograd.Function):
    """dx = g w r − w · r³ x Σ(g x w) / D: the second w is the defect (blind at w = 1)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                eps: float) -> torch.Tensor:
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, r)
        return x * r * w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, w, r = ctx.saved_tensors
        s = (g * x * w).sum(-1, keepdim=True)
        dx = g * w * r - w * r.pow(3) * x * s / x.shape[-1]
        dw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
        return dx, dw, None


class DoubleWeightNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _DoubleWeightFn.apply(x, self.weight, self.eps)


class ConfigNorm(LlamaRMSNorm):
    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-6) -> None:
        if config != "llama":
            raise ValueError(f"unknown config {config!r}")
        super().__init__(hidden_size, eps)


class ScaleNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def make_llama(hidden_size: int, eps: float) -> nn.Module:
    """A factory, as model code often has one."""
    return LlamaRMSNorm(hidden_size, eps)


def plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def plain_rms_norm_zcg(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       zero_centered_gamma: bool) -> torch.Tensor:
    gamma = weight + 1 if zero_centered_gamma else weight
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    offset: float = 0.0) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight)


class LigerShapedFn(torch.autograd.Function):
    """Liger's parameter names and order — ``(X, W, eps, offset, casting_mode, in_place)`` —
    in plain torch, with a correct backward; ``casting_mode`` must be given a known value."""

    @staticmethod
    def forward(ctx: Any, X: torch.Tensor, W: torch.Tensor,  # type: ignore[override]
                eps: float, offset: float = 0.0, casting_mode: str = "llama",
                in_place: bool = True) -> torch.Tensor:
        if casting_mode not in ("llama", "gemma", "none"):
            raise AssertionError(f"Invalid casting mode: {casting_mode}")
        r = torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(X, W, r)
        ctx.offset = offset
        return X * r * (W + offset)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, w, r = ctx.saved_tensors
        gamma = w + ctx.offset
        s = (g * x * gamma).sum(-1, keepdim=True)
        dx = g * gamma * r - r.pow(3) * x * s / x.shape[-1]
        dw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
        return dx, dw, None, None, None, None


class SetupContextFn(torch.autograd.Function):
    """The forward-without-ctx style (``setup_context``), Megatron's parameters."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, eps: float,  # type: ignore[override]
                zero_centered_gamma: bool) -> torch.Tensor:
        gamma = weight + 1 if zero_centered_gamma else weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, weight, eps, zcg = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.zcg = eps, zcg

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        gamma = weight + 1 if ctx.zcg else weight
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
        s = (g * x * gamma).sum(-1, keepdim=True)
        dx = g * gamma * r - r.pow(3) * x * s / x.shape[-1]
        return dx, (g * x * r).reshape(-1, x.shape[-1]).sum(0), None, None
