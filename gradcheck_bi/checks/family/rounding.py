"""The kernel's own rounding in its backward, per op: the family's twin of :mod:`..summation`.

Each function returns, per element of a gradient, the RMS of the rounding a correct kernel
may make in any summation order, in units of ``u`` (the checks scale it by ``max(λ, 1)·u``
and add it in quadrature to the finite difference's noise). The template is RMSNorm's
(:mod:`gradcheck_bi.checks.summation`): an error ``ε`` of the row statistic is common to
every term of a row, each sum over D adds ``V(terms) + OPS_TERM Σ terms²`` (any order, one
accumulator), and each product rounds a few times. Everything is computed from the inputs,
the cotangents and the *exact* fp64 gradients (autograd through the reference), never from
the backward under test.

**fused_add_rms_norm** (``s = x + residual``): the RMSNorm ``dx`` model at ``s``, and the
addition of ``residual_out``'s cotangent (``OPS_ADD`` roundings of ``|d_s|``); ``dresidual``
is the same tensor.

**layer_norm** (``c = x − μ``, ``ρ = (mean c² + eps)^(-1/2)``, ``n = c ρ``, ``a = ρ g γ``,
``m1 = Σ g γ``, ``m2 = Σ g γ n``, ``dx = a − ρ m1 / D − ρ n m2 / D``)::

    var dx = (a − b1 − 3 b2)² v_ρ + OPS_DIRECT (a² + b1²) + OPS_VARIANCE b2²
             + (ρ/D)² (V(gγ) + OPS_TERM Σ(gγ)²) + (ρ n/D)² (V(gγn) + OPS_TERM Σ(gγn)²)
             + (ρ² (m2 + n m1) / D)² var μ

with ``b1 = ρ m1 / D``, ``b2 = ρ n m2 / D`` (``b2 ∝ ρ³``, hence the 3), ``v_ρ`` the mean
square's model over ``c`` and ``var μ = V(x) / D² + μ²`` (the mean's sum and its division: an
error ``δμ`` shifts every ``c_i``, moving ``n_k`` by ``−ρ δμ`` and ``m2`` by ``−ρ δμ m1``).

**rms_norm_gated** (groups of G features, ``s = silu(z)``): before the gate, ``dx`` is the
RMSNorm model per group with cotangent ``g s`` (+ ``OPS_GATE`` roundings of that product),
``dz = g n γ silu'(z)`` is elementwise (``(v_r + OPS_GATE) dz²``); after the gate
(``u = x s``), ``du`` is the RMSNorm model per group at ``u``, ``dx = du s`` and
``dz = du x silu'(z)`` carry it, plus ``OPS_GATE`` roundings of each.

**Parameters** (``dw``, ``dbias``): terms ``g ∂y/∂γ`` (``g`` for β) as the forward makes
them, summed over the rows: RMSNorm's model, :func:`gradcheck_bi.checks.summation.dw_sigma`
(applied by the check to ``FDEstimate.terms``).
"""

from __future__ import annotations

import torch

from gradcheck_bi.checks.family.point import OpPoint, exact_grads
from gradcheck_bi.checks.summation import (
    OPS_DIRECT,
    OPS_TERM,
    OPS_VARIANCE,
    any_order_var,
    dx_sigma,
    rsigma_var,
)
from gradcheck_bi.kernels.reduction import row_sum
from gradcheck_bi.ops.references import grouped

OPS_ADD = 2.0  # fused add: + the residual_out cotangent, and its share of the output cast
# silu(z) = z / (1 + exp(-z)) and silu'(z): exp (not always correctly rounded), an add, a
# division and the products around them.
OPS_GATE = 8.0


def _f64(point: OpPoint) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                                  dict[str, torch.Tensor]]:
    g = {n: t.to(torch.float64) for n, t in point.cotangents.items()}
    return point.inputs64, point.effective, g


def _fused(point: OpPoint, name: str) -> torch.Tensor:
    inputs, eff, g = _f64(point)
    s = inputs["x"] + inputs["residual"]
    eps = point.options["eps"]
    d_s = exact_grads(point)["x"]
    return (dx_sigma(s, eff["weight"], g["y"], eps) ** 2 + OPS_ADD * d_s * d_s).sqrt()


def _layer(point: OpPoint, name: str) -> torch.Tensor:
    inputs, eff, g = _f64(point)
    x, gamma, gy, eps = inputs["x"], eff["weight"], g["y"], point.options["eps"]
    d = x.shape[-1]
    mu = x.mean(-1, keepdim=True)
    c = x - mu
    rho = torch.rsqrt(row_sum(c * c).unsqueeze(-1) / d + eps)
    n = c * rho
    gg, ggn = gy * gamma, gy * gamma * n
    m1, m2 = row_sum(gg).unsqueeze(-1), row_sum(ggn).unsqueeze(-1)
    a, b1, b2 = rho * gg, rho * m1 / d, rho * n * m2 / d
    var_mu = (any_order_var(x) / d**2).unsqueeze(-1) + mu * mu
    var = ((a - b1 - 3 * b2) ** 2 * rsigma_var(c, eps) + OPS_DIRECT * (a * a + b1 * b1)
           + OPS_VARIANCE * b2 * b2
           + (rho / d) ** 2 * (any_order_var(gg) + OPS_TERM * row_sum(gg * gg)).unsqueeze(-1)
           + (rho * n / d) ** 2 * (any_order_var(ggn)
                                   + OPS_TERM * row_sum(ggn * ggn)).unsqueeze(-1)
           + (rho * rho * (m2 + n * m1) / d) ** 2 * var_mu)
    return var.sqrt()


def _silu_grad(z: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(z)
    return sig * (1 + z * (1 - sig))


def _grouped_dx_sigma(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
                      group: int | None) -> torch.Tensor:
    """The RMSNorm ``dx`` model with the statistic over each group of the last axis."""
    sig = dx_sigma(grouped(v, group), grouped(gamma, group), grouped(g, group), eps)
    return sig.reshape(v.shape)


def _gated(point: OpPoint, name: str) -> torch.Tensor:
    inputs, eff, g = _f64(point)
    x, z, gamma, gy = inputs["x"], inputs["z"], eff["weight"], g["y"]
    eps, group = point.options["eps"], point.options["group_size"]
    gate, dgate = torch.nn.functional.silu(z), _silu_grad(z)
    exact = exact_grads(point)
    d = exact["x" if name == "x" else "z"]
    if point.options["norm_before_gate"]:
        if name == "x":
            a = gy * gate * gamma * torch.rsqrt(
                grouped(x * x, group).mean(-1, keepdim=True) + eps).expand(
                grouped(x, group).shape).reshape(x.shape)
            return (_grouped_dx_sigma(x, gamma, gy * gate, eps, group) ** 2
                    + OPS_GATE * a * a).sqrt()
        v_r = rsigma_var(grouped(x, group), eps).expand(grouped(x, group).shape)
        return ((v_r.reshape(x.shape) + OPS_GATE) * d * d).sqrt()
    u = x * gate
    sigma_du = _grouped_dx_sigma(u, gamma, gy, eps, group)
    carry = gate if name == "x" else x * dgate
    return (sigma_du**2 * carry * carry + OPS_GATE * d * d).sqrt()


_INPUT_MODELS = {"fused_add_rms_norm": _fused, "layer_norm": _layer, "rms_norm_gated": _gated}


def kernel_sigma(point: OpPoint, name: str) -> torch.Tensor:
    """Per element of ``d<name>`` (an input), the RMS of a correct kernel's own rounding, in
    ``u``. A parameter's is RMSNorm's ``dw`` model on the terms ``g·∂y/∂p`` the forward makes
    (:func:`gradcheck_bi.checks.summation.dw_sigma` of ``FDEstimate.terms``)."""
    return _INPUT_MODELS[point.op.name](point, name)
