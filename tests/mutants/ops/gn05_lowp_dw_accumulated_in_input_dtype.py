"""Mutant gn05: dw summed over the rows in the input dtype (blind in fp64).

Everything else is the correct kernel of tests/kernels/: the defect is marked ``# MUTANT``.
"""

from __future__ import annotations

from typing import Any

import torch


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the last dim by pairwise halving: the order depends on D only."""
    d = t.shape[-1]
    width = 1 << max(0, (d - 1).bit_length())
    if width != d:
        t = torch.nn.functional.pad(t, (0, width - d))
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


def sigmoid(z: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-z))`` from +, −, ×, ÷ and exact scalings only (called in fp64 and
    rounded once), so every element's bits are the same wherever it sits in a batch
    (torch's CPU ``sigmoid``/``exp`` take a vector or a scalar path by position, one ulp
    apart). ``exp(t) = 2^k · exp(r)``, ``t = k ln2 + r``, ``|r| ≤ ln2 / 2``, ``exp(r)`` by
    Horner to degree 17, ``2^k`` by ``ldexp``."""
    t = (-z).clamp(-745.0, 709.0)
    k = torch.round(t * 1.4426950408889634)
    r = (t - k * 0.693145751953125) - k * 1.4286068203094173e-06
    p = torch.ones_like(r)
    for n in range(17, 0, -1):
        p = 1.0 + p * r / n
    return 1.0 / (1.0 + torch.ldexp(p, k))


def _groups(t: torch.Tensor, g: int) -> torch.Tensor:
    return t.reshape(*t.shape[:-1], t.shape[-1] // g, g)


class Mutant(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, z: torch.Tensor,  # type: ignore[override]
                weight: torch.Tensor, eps: float, group_size: int | None = None,
                norm_before_gate: bool = True) -> torch.Tensor:
        cdt = torch.promote_types(x.dtype, torch.float32)
        gsize = x.shape[-1] if group_size is None else int(group_size)
        xc, zc, w = x.to(cdt), z.to(cdt), weight.to(cdt)
        gate = zc * sigmoid(zc.double()).to(cdt)
        v = xc if norm_before_gate else xc * gate
        vg = _groups(v, gsize)
        r = 1.0 / torch.sqrt(tree_sum(vg * vg) / gsize + eps)
        n = (vg * r.unsqueeze(-1)).reshape(v.shape)
        y = n * w * gate if norm_before_gate else n * w
        ctx.save_for_backward(xc, zc, weight, r)
        ctx.cfg = (gsize, bool(norm_before_gate), x.dtype, z.dtype)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xc, zc, weight, r = ctx.saved_tensors
        gsize, before, xdt, zdt = ctx.cfg
        cdt, d = xc.dtype, xc.shape[-1]
        w, g = weight.to(cdt), dy.to(cdt)
        sig = sigmoid(zc.double()).to(cdt)
        gate, dgate = zc * sig, sig * (1 + zc * (1 - sig))
        v = xc if before else xc * gate
        cot = g * gate if before else g  # the cotangent of n·w
        vg, cg = _groups(v, gsize), _groups(cot * w, gsize)
        rr = r.unsqueeze(-1)
        dot = tree_sum(cg * vg).unsqueeze(-1)
        dv = (cg * rr - vg * rr * rr * rr * dot / gsize).reshape(v.shape)
        n = (vg * rr).reshape(v.shape)
        if before:
            dx, dz, dw_rows = dv, g * n * w * dgate, g * n * gate
        else:
            dx, dz, dw_rows = dv * gate, dv * xc * dgate, g * n
        dw = torch.zeros(d, dtype=weight.dtype, device=xc.device)
        for row in dw_rows.reshape(-1, d):
            dw = dw + row.to(weight.dtype)  # MUTANT
        return dx.to(xdt), dz.to(zdt), dw.to(weight.dtype), None, None, None
