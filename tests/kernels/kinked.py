"""Norm kernels the output bends in, with hand-written backwards, for the tests of
:mod:`gradcheck_bi.checks.fd_judge` (written here, not taken from a library):

* ``ReluRMSNorm`` — ``relu(rms_norm(x) · γ)``, the RMSNorm contract ``apply(x, weight, eps,
  zero_centered_gamma)``; a kink wherever ``rms_norm(x) · γ`` crosses 0;
* ``ReluRMSNormDefect`` — the same, its dx wrong by 1e-3 relative where the pre-activation
  exceeds 1 (far from every kink);
* ``relu_layer_norm`` / ``relu_layer_norm_defect`` — ``relu(layer_norm(x) · weight + bias)``
  (the layer_norm op, run by the row ops' engine); the defect: dbias and dx wrong where the
  pre-activation exceeds 1;
* ``torch_relu_layer_norm`` — the same through torch's own functions and autograd;
* ``InputScaledRMSNorm`` — ``rms_norm(x · γ)`` (a weight inside the norm: neither linear nor
  elementwise in it, as transformers' MuseSparkTextInputScaledRMSNorm); ``…Defect``: dw off
  by 1e-4 relative.
"""

from __future__ import annotations

from typing import Any

import torch

THRESHOLD = 1.0  # the defects act where the pre-activation exceeds this


def _rms(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r, r


def _rms_back(xh: torch.Tensor, r: torch.Tensor, dxh: torch.Tensor) -> torch.Tensor:
    """dL/dx of ``xh = x r`` given ``dL/dxh``: ``r (dxh - xh · mean(dxh · xh))``."""
    return r * (dxh - xh * (dxh * xh).mean(-1, keepdim=True))


def _gamma(w: torch.Tensor, zcg: bool) -> torch.Tensor:
    return w + 1.0 if zcg else w


class ReluRMSNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float,
                zero_centered_gamma: bool) -> torch.Tensor:
        xh, r = _rms(x, eps)
        gamma = _gamma(w, zero_centered_gamma)
        pre = xh * gamma
        ctx.save_for_backward(xh, r, gamma, pre)
        return torch.relu(pre)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        xh, r, gamma, pre = ctx.saved_tensors
        dpre = g * (pre > 0)
        dxh = dpre * gamma
        dx = _rms_back(xh, r, dxh)
        dw = (dpre * xh).reshape(-1, xh.shape[-1]).sum(0)
        return dx, dw, None, None


class ReluRMSNormDefect(ReluRMSNorm):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        dx, dw, _, _ = ReluRMSNorm.backward(ctx, g)
        _, _, _, pre = ctx.saved_tensors
        return dx * torch.where(pre > THRESHOLD, 1.001, 1.0), dw, None, None


class _ReluLayerNorm(torch.autograd.Function):
    defect = 0.0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                eps: float) -> torch.Tensor:
        c = x - x.mean(-1, keepdim=True)
        xh, r = _rms(c, eps)
        pre = xh * weight + bias
        ctx.save_for_backward(xh, r, weight, pre)
        return torch.relu(pre)

    @classmethod
    def backward(cls, ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xh, r, weight, pre = ctx.saved_tensors
        dpre = g * (pre > 0) * torch.where(pre > THRESHOLD, 1.0 + cls.defect, 1.0)
        dxh = dpre * weight
        dx = _rms_back(xh, r, dxh - dxh.mean(-1, keepdim=True))
        rows = xh.shape[-1]
        return (dx, (dpre * xh).reshape(-1, rows).sum(0), dpre.reshape(-1, rows).sum(0), None)


class _ReluLayerNormDefect(_ReluLayerNorm):
    defect = 1e-3


def relu_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float) -> torch.Tensor:
    return _ReluLayerNorm.apply(x, weight, bias, eps)


def relu_layer_norm_defect(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                           eps: float) -> torch.Tensor:
    return _ReluLayerNormDefect.apply(x, weight, bias, eps)


class InputScaledRMSNorm(torch.autograd.Function):
    defect = 0.0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float,
                zero_centered_gamma: bool) -> torch.Tensor:
        gamma = _gamma(w, zero_centered_gamma)
        vh, r = _rms(x * gamma, eps)
        ctx.save_for_backward(x, gamma, vh, r)
        return vh

    @classmethod
    def backward(cls, ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, gamma, vh, r = ctx.saved_tensors
        dv = _rms_back(vh, r, g)
        dw = (dv * x).reshape(-1, x.shape[-1]).sum(0) * (1.0 + cls.defect)
        return dv * gamma, dw, None, None


class InputScaledRMSNormDefect(InputScaledRMSNorm):
    defect = 1e-4


def torch_relu_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """torch's own layer_norm and relu, backward by autograd (code not written here)."""
    return torch.relu(torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps))
