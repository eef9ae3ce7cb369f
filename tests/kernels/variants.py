"""Kernels of the ops' optional parts and of misleading names, for tests/test_recognise.py.

Written here in plain torch (autograd's backward, computing in promote(dtype, fp32) and
rounding each output once), each as a user ships it: RMSNorms
without a weight or with a bias, a gated norm whose gate defaults to None and that takes no
group size or gate order, a class named RMSNorm whose forward subtracts the mean, a norm that
is none of the ops, and one defect of a bias variant (its dbias scaled by γ).
"""

from __future__ import annotations

from typing import Any

import torch


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = _up(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            eps: float) -> torch.Tensor:
    y = _rms(x, eps) * _up(weight)
    return (y if bias is None else y + _up(bias)).to(x.dtype)


def rms_norm_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x, eps)``: an RMSNorm without affine parameters."""
    return _rms(x, eps).to(x.dtype)


def rms_norm_unweighted_fp32_inside(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x, eps)`` computing in fp32 whatever x's dtype (Llama4TextL2Norm's way)."""
    return _rms(x.float(), eps).to(x.dtype)


def rms_norm_bias(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """``(x, weight, bias, eps)``, named as an RMSNorm."""
    return _affine(x, weight, bias, eps)


def affine_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                eps: float) -> torch.Tensor:
    """The same, under a name that says nothing: its output decides."""
    return _affine(x, weight, bias, eps)


class _DbiasTimesGamma(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor, eps: float) -> torch.Tensor:
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(), weight.detach().requires_grad_()
            y = _rms(xd, eps) * _up(wd)
        ctx.save_for_backward(xd, wd, y)
        return (y.detach() + _up(bias)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xd, wd, y = ctx.saved_tensors
        dx, dw = torch.autograd.grad(y, (xd, wd), _up(g))
        dbias = (_up(g) * _up(wd)).reshape(-1, g.shape[-1]).sum(0)  # MUTANT: dbias times γ
        dbias = dbias.to(wd.dtype)
        return dx, dw, dbias, None


def rms_norm_bias_dbias_times_gamma(x: torch.Tensor, weight: torch.Tensor,
                                    bias: torch.Tensor, eps: float) -> torch.Tensor:
    """An RMSNorm with a bias whose dbias is Σ g·γ instead of Σ g."""
    return _DbiasTimesGamma.apply(x, weight, bias, eps)


class RMSNormWithBias(torch.nn.Module):
    """A module RMSNorm with a (D,) weight and bias."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _affine(hidden_states, self.weight, self.bias, self.eps)


class MeanSubtractingRMSNorm(torch.nn.Module):
    """Named RMSNorm, but its forward subtracts the mean: a LayerNorm without bias."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        c = hidden_states - hidden_states.mean(-1, keepdim=True)
        return _affine(c, self.weight, None, self.eps)


class T5StyleLayerNorm(torch.nn.Module):
    """Named a LayerNorm, computes an RMS norm (no mean, no bias): T5's convention."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _affine(hidden_states, self.weight, None, self.variance_epsilon)


class MeanlessLayerNorm(torch.nn.Module):
    """Named a LayerNorm, with a bias, but its forward forgets the mean: a defect."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _affine(hidden_states, self.weight, self.bias, self.eps)


class SiluRMSNormGated(torch.nn.Module):
    """A gated RMSNorm (silu gate after the norm, whole row) whose gate defaults to None and
    that takes neither group_size nor norm_before_gate (as transformers' gated classes)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None
                ) -> torch.Tensor:
        y = _rms(hidden_states, self.variance_epsilon) * _up(self.weight)
        gate = _up(gate)  # raises with the default None
        return (y * torch.nn.functional.silu(gate)).to(hidden_states.dtype)


def doubling_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """None of the ops: ``2 x γ``."""
    return 2 * x * weight


def rmsnorm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               z: torch.Tensor | None = None, eps: float = 1e-6, group_size: int | None = None,
               norm_before_gate: bool = True) -> torch.Tensor:
    """Mamba's gated RMSNorm signature (a bias and a gate): ``(x, weight, bias, z, eps,
    group_size, norm_before_gate)``. β is added before the gate, as Mamba's reference
    does."""
    xf, d = _up(x), x.shape[-1]
    gate = torch.nn.functional.silu(_up(z)) if z is not None else None
    if gate is not None and not norm_before_gate:
        xf = xf * gate
    g = group_size or d
    xg = xf.reshape(*xf.shape[:-1], d // g, g)
    y = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(xf.shape)
    y = y * _up(weight) + (_up(bias) if bias is not None else 0)
    if gate is not None and norm_before_gate:
        y = y * gate
    return y.to(x.dtype)
