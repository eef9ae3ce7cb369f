"""The tolerances of the family's other ops: the forward's bound and the kernel's own rounding.

The template is RMSNorm's (:mod:`.summation`); everything is computed from the point's inputs,
cotangents and *exact* fp64 gradients (autograd through the reference), never from the
backward under test.

**Forward** (:func:`forward_tolerances`): each output is held to ``max|ref| · (u_out + u_c ·
factor)``, RMSNorm's :func:`~.summation.forward_factor` over the statistic's ``n`` terms
(``group_size`` for the gated norm) with the op's extra roundings per element inside the
root (``EXTRA_OPS``): the fused add's ``x + residual`` (1), the layer norm's centring and
bias (2), the gate's silu and product (``OPS_GATE + 1``). The layer norm adds its mean's own
error (:func:`mean_error`) times ``K_SIGMA u_c max|γ| ρ``. ``residual_out`` is one addition:
``max|ref| · (u_out + u_c)``.

**The kernel's own rounding** (:func:`kernel_sigma`): per element of a gradient, the RMS of
the rounding a correct kernel may make in any summation order, in units of ``u`` (the checks
scale it by ``max(λ, 1)·u`` and add it in quadrature to the finite difference's noise). An
error ``ε`` of the row statistic is common to every term of a row, each sum over D adds
``V(terms) + OPS_TERM Σ terms²`` (any order, one accumulator), and each product rounds a few
times.

* fused_add_rms_norm (``s = x + residual``): the RMSNorm ``dx`` model at ``s``, and the
  addition of ``residual_out``'s cotangent (``OPS_ADD`` roundings of ``|d_s|``);
  ``dresidual`` is the same tensor.
* layer_norm (``c = x − μ``, ``ρ = (mean c² + eps)^(-1/2)``, ``n = c ρ``, ``a = ρ g γ``,
  ``m1 = Σ g γ``, ``m2 = Σ g γ n``, ``dx = a − ρ m1 / D − ρ n m2 / D``)::

      var dx = (a − b1 − 3 b2)² v_ρ + OPS_DIRECT (a² + b1²) + OPS_VARIANCE b2²
               + (ρ/D)² (V(gγ) + OPS_TERM Σ(gγ)²) + (ρ n/D)² (V(gγn) + OPS_TERM Σ(gγn)²)
               + (ρ² (m2 + n m1) / D)² var μ

  with ``b1 = ρ m1 / D``, ``b2 = ρ n m2 / D`` (``b2 ∝ ρ³``, hence the 3), ``v_ρ`` the mean
  square's model over ``c`` and ``var μ = V(x) / D² + μ²`` (:func:`mean_var`: the mean's sum
  and its division; an error ``δμ`` shifts every ``c_i``, moving ``n_k`` by ``−ρ δμ`` and
  ``m2`` by ``−ρ δμ m1``).
* rms_norm_gated (groups of G features, ``s = silu(z)``): before the gate, ``dx`` is the
  RMSNorm model per group with cotangent ``g s`` (+ ``OPS_GATE`` roundings of that product),
  ``dz = g n γ silu'(z)`` is elementwise (``v_r dz² + OPS_GATE (g n γ S)²``); after the
  gate (``u = x s``), ``du`` is the RMSNorm model per group at ``u``, ``dx = du s`` and
  ``dz = du x silu'(z)`` carry it, plus ``OPS_GATE`` roundings of each (``dz``'s of
  ``du x S``). ``S = σ(1 + |z|(1 − σ))`` is the size of the terms of ``silu'(z) = σ(1 +
  z(1 − σ))``: its rounding is relative to them, not to ``silu'``, which cancels to 0 near
  ``z = −1.28`` (held relative to ``silu'``, a correct bf16 kernel failed ``dz`` at 1.008 of
  its tolerance in 2 of 200 random configurations).

**Parameters** (``dw``, ``dbias``): terms ``g ∂y/∂γ`` (``g`` for β) as the forward makes
them, summed over the rows: RMSNorm's model, :func:`~.summation.dw_sigma` (applied by the
check to ``FDEstimate.terms``).

>>> round(forward_factor(255, EXTRA_OPS["layer_norm"]), 1)
32.7
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from gradcheck_bi.kernels.reduction import row_sum
from gradcheck_bi.ops import Op
from gradcheck_bi.ops.references import grouped
from gradcheck_bi.tolerance.noise import K_SIGMA
from gradcheck_bi.tolerance.summation import (
    OPS_DIRECT,
    OPS_TERM,
    OPS_VARIANCE,
    any_order_var,
    dx_magnitude,
    dx_sigma,
    forward_factor,
    rsigma_var,
)

Tensors = dict[str, torch.Tensor]
OPS_ADD = 2.0  # fused add: + the residual_out cotangent, and its share of the output cast
# silu(z) = z / (1 + exp(-z)) and silu'(z): exp (not always correctly rounded), an add, a
# division and the products around them.
OPS_GATE = 8.0
EXTRA_OPS = {"fused_add_rms_norm": 1.0, "layer_norm": 2.0, "rms_norm_gated": OPS_GATE + 1.0}


class Point(Protocol):
    """What the formulas read of a point (:class:`gradcheck_bi.checks.family.OpPoint`)."""

    @property
    def op(self) -> Op: ...
    @property
    def inputs(self) -> Tensors: ...
    @property
    def inputs64(self) -> Tensors: ...
    @property
    def effective(self) -> Tensors: ...
    @property
    def cotangents(self) -> Tensors: ...
    @property
    def options(self) -> dict[str, Any]: ...


def mean_var(x: torch.Tensor) -> torch.Tensor:
    """``V(x) / D² + μ²`` over the last axis: the variance, in ``u²``, of a layer norm's mean
    ``μ`` (its sum in any order and its division)."""
    d = x.shape[-1]
    mu = x.mean(-1)
    return any_order_var(x) / d**2 + mu * mu


def mean_error(point: Point) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row ``(ρ, sqrt(var μ))``, fp64: a layer norm's ``ρ`` and its mean's error in ``u``."""
    x = point.inputs64["x"].reshape(-1, point.inputs["x"].shape[-1])
    c = x - x.mean(-1)[:, None]
    rho = torch.rsqrt((c * c).mean(-1) + point.options["eps"])
    return rho, torch.sqrt(mean_var(x))


def shared_sigma(point: Point) -> torch.Tensor | None:
    """Per row, in ``u``: a rounding every output of the row shares beyond the relative one
    of a statistic ``r`` (which the noise model has). A layer norm's mean ``μ`` errs by
    ``δμ`` (:func:`mean_error`), shifting every ``x_i − μ`` alike, so ``Σ g y`` moves by
    ``ρ δμ Σ g γ``."""
    if point.op.name != "layer_norm":
        return None
    d = point.inputs["x"].shape[-1]
    rho, sigma_mu = mean_error(point)
    gg = (point.cotangents["y"].to(torch.float64).reshape(-1, d)
          * point.effective["weight"]).sum(-1)
    return rho * gg.abs() * sigma_mu


def forward_tolerances(point: Point, ref: Tensors, u_out: float, u_c: float
                       ) -> dict[str, float]:
    """The absolute tolerance of each output in ``ref`` (output dtype's ``u_out``, compute
    dtype's ``u_c``)."""
    out = {}
    for name, r in ref.items():
        scale = float(r.abs().max()) if r.numel() else 0.0
        if name == "residual_out":
            out[name] = scale * (u_out + u_c)
            continue
        n = point.options.get("group_size") or point.inputs["x"].shape[-1]
        out[name] = scale * (u_out + u_c * forward_factor(n, EXTRA_OPS[point.op.name]))
        if point.op.name == "layer_norm":
            rho, sigma_mu = mean_error(point)
            gamma = float(point.effective["weight"].abs().max())
            out[name] += K_SIGMA * u_c * gamma * float((rho * sigma_mu).max())
    return out


def compute_bound(point: Point, name: str, ref: torch.Tensor, u_c: float) -> torch.Tensor:
    """Per element of output ``name`` (fp64, absolute): how far a correct kernel's value in
    the compute dtype (``u_c``) may be from the exact one before its one rounding to the
    output dtype — :func:`forward_tolerances`'s model per element: ``u_c (factor |y − β| +
    |β|)`` (the statistic, the op's extra roundings; β added last, so an element where
    ``n γ`` and β nearly cancel is not held to the ulp of its tiny value), the layer norm's
    mean error, and for ``residual_out`` one addition ``u_c |s|``. The bf16/fp16 forward
    adds it to each element's ulp threshold."""
    if name == "residual_out":
        return u_c * ref.abs()
    beta = point.effective.get("bias", torch.zeros((), dtype=torch.float64))
    n = point.options.get("group_size") or point.inputs["x"].shape[-1]
    factor = forward_factor(n, EXTRA_OPS[point.op.name])
    bound = u_c * (factor * (ref - beta).abs() + beta.abs())
    if point.op.name == "layer_norm":
        rho, sigma_mu = mean_error(point)
        gamma = float(point.effective["weight"].abs().max())
        bound = bound + K_SIGMA * u_c * gamma * float((rho * sigma_mu).max())
    return bound


def _fused(point: Point, name: str, exact: Tensors) -> torch.Tensor:
    inputs, eff = point.inputs64, point.effective
    s = inputs["x"] + inputs["residual"]
    d_s = exact["x"]
    gy = point.cotangents["y"].to(torch.float64)
    return (dx_sigma(s, eff["weight"], gy, point.options["eps"]) ** 2
            + OPS_ADD * d_s * d_s).sqrt()


def _layer(point: Point, name: str, exact: Tensors) -> torch.Tensor:
    x, gamma = point.inputs64["x"], point.effective["weight"]
    gy, eps = point.cotangents["y"].to(torch.float64), point.options["eps"]
    d = x.shape[-1]
    c = x - x.mean(-1, keepdim=True)
    rho = torch.rsqrt(row_sum(c * c).unsqueeze(-1) / d + eps)
    n = c * rho
    gg, ggn = gy * gamma, gy * gamma * n
    m1, m2 = row_sum(gg).unsqueeze(-1), row_sum(ggn).unsqueeze(-1)
    a, b1, b2 = rho * gg, rho * m1 / d, rho * n * m2 / d
    var = ((a - b1 - 3 * b2) ** 2 * rsigma_var(c, eps) + OPS_DIRECT * (a * a + b1 * b1)
           + OPS_VARIANCE * b2 * b2
           + (rho / d) ** 2 * (any_order_var(gg) + OPS_TERM * row_sum(gg * gg)).unsqueeze(-1)
           + (rho * n / d) ** 2 * (any_order_var(ggn)
                                   + OPS_TERM * row_sum(ggn * ggn)).unsqueeze(-1)
           + (rho * rho * (m2 + n * m1) / d) ** 2 * mean_var(x).unsqueeze(-1))
    return var.sqrt()


def _silu_grad(z: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(z)
    return sig * (1 + z * (1 - sig))


def _silu_grad_size(z: torch.Tensor) -> torch.Tensor:
    """``σ(1 + |z| (1 − σ))``: the size of the terms of ``silu'(z) = σ(1 + z(1 − σ))``, which
    its rounding is relative to (``silu'`` itself cancels to 0 near ``z = −1.28``)."""
    sig = torch.sigmoid(z)
    return sig * (1 + z.abs() * (1 - sig))


def _normed(v: torch.Tensor, eps: float, group: int | None) -> torch.Tensor:
    vg = grouped(v, group)
    return (vg * torch.rsqrt((vg * vg).mean(-1, keepdim=True) + eps)).reshape(v.shape)


def _rms_grad(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
              group: int | None) -> torch.Tensor:
    """Exact ``d/dv Σ g·γ·rms(v)`` per group: ``gγr − v r³ mean(gγv)``."""
    vg, gg = grouped(v, group), grouped(g * gamma, group)
    r = torch.rsqrt((vg * vg).mean(-1, keepdim=True) + eps)
    return (gg * r - vg * r**3 * (gg * vg).mean(-1, keepdim=True)).reshape(v.shape)


def _grouped_dx_sigma(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
                      group: int | None) -> torch.Tensor:
    """The RMSNorm ``dx`` model with the statistic over each group of the last axis."""
    sig = dx_sigma(grouped(v, group), grouped(gamma, group), grouped(g, group), eps)
    return sig.reshape(v.shape)


def _gated(point: Point, name: str, exact: Tensors) -> torch.Tensor:
    inputs, gamma = point.inputs64, point.effective["weight"]
    x, z, gy = inputs["x"], inputs["z"], point.cotangents["y"].to(torch.float64)
    eps, group = point.options["eps"], point.options["group_size"]
    gate, dgate = torch.nn.functional.silu(z), _silu_grad(z)
    d = exact["x" if name == "x" else "z"]
    if point.options["norm_before_gate"]:
        if name == "x":
            a = gy * gate * gamma * torch.rsqrt(
                grouped(x * x, group).mean(-1, keepdim=True) + eps).expand(
                grouped(x, group).shape).reshape(x.shape)
            return (_grouped_dx_sigma(x, gamma, gy * gate, eps, group) ** 2
                    + OPS_GATE * a * a).sqrt()
        v_r = rsigma_var(grouped(x, group), eps).expand(grouped(x, group).shape)
        size = gy * _normed(x, eps, group) * gamma * _silu_grad_size(z)
        return (v_r.reshape(x.shape) * d * d + OPS_GATE * size * size).sqrt()
    u = x * gate
    sigma_du = _grouped_dx_sigma(u, gamma, gy, eps, group)
    carry = gate if name == "x" else x * dgate
    size = d if name == "x" else _rms_grad(u, gamma, gy, eps, group) * x * _silu_grad_size(z)
    return (sigma_du**2 * carry * carry + OPS_GATE * size * size).sqrt()


_INPUT_MODELS = {"fused_add_rms_norm": _fused, "layer_norm": _layer, "rms_norm_gated": _gated}


def kernel_sigma(point: Point, name: str, exact: Tensors) -> torch.Tensor:
    """Per element of ``d<name>`` (an input), the RMS of a correct kernel's own rounding, in
    ``u``; ``exact``: the point's exact fp64 gradients. A parameter's is RMSNorm's ``dw``
    model on the terms ``g·∂y/∂p`` the forward makes (:func:`~.summation.dw_sigma` of
    ``FDEstimate.terms``)."""
    return _INPUT_MODELS[point.op.name](point, name, exact)


def _magnitude(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
               group: int | None) -> torch.Tensor:
    """RMSNorm's ``dx`` magnitude with the statistic over each group of the last axis."""
    m = dx_magnitude(grouped(v, group), grouped(gamma, group), grouped(g, group), eps)
    return m.reshape(v.shape)


def kernel_magnitude(point: Point, name: str) -> torch.Tensor:
    """Per element of ``d<name>`` (an input), the magnitude of the terms that make it (fp64):
    what an error of a few ulps of rsqrt or division scales (the lifted tolerance's ``M``,
    :func:`.half.lifted_tolerance`). RMSNorm's ``|a| + 3|b|`` at ``x + residual`` plus
    ``|q|`` (fused add); ``|a| + |b1| + 3|b2|`` with every sum over ``|terms|`` (layer norm);
    RMSNorm's per group, carried through the gate (gated)."""
    inputs, gamma = point.inputs64, point.effective["weight"]
    g = {n: t.to(torch.float64) for n, t in point.cotangents.items()}
    x, gy, eps = inputs["x"], g["y"], point.options["eps"]
    if point.op.name == "fused_add_rms_norm":
        return dx_magnitude(x + inputs["residual"], gamma, gy, eps) + g["residual_out"].abs()
    if point.op.name == "layer_norm":
        d = x.shape[-1]
        c = x - x.mean(-1, keepdim=True)
        rho = torch.rsqrt(row_sum(c * c).unsqueeze(-1) / d + eps)
        gg, n = (gy * gamma).abs(), (c * rho).abs()
        return rho * (gg + row_sum(gg).unsqueeze(-1) / d
                      + 3 * n * row_sum(gg * n).unsqueeze(-1) / d)
    z, group = inputs["z"], point.options["group_size"]
    gate = torch.nn.functional.silu(z)
    if point.options["norm_before_gate"]:
        if name == "x":
            return _magnitude(x, gamma, gy * gate, eps, group)
        return (gy * _normed(x, eps, group) * gamma).abs() * _silu_grad_size(z)
    m_u = _magnitude(x * gate, gamma, gy, eps, group)
    return m_u * (gate.abs() if name == "x" else x.abs() * _silu_grad_size(z))
