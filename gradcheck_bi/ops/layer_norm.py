"""``layer_norm``: ``μ = mean x``, ``y = (x − μ) · (mean (x − μ)² + eps)^(-1/2) · γ + β``.

**Forward**: RMSNorm's bound over D terms with 2 further roundings per element (the
centring and β), plus the mean's own error (:func:`mean_error`) times ``K_SIGMA u_c max|γ|
ρ``: an error ``δμ`` shifts every ``x_i − μ`` alike.

**Rounding of dx** (``c = x − μ``, ``ρ = (mean c² + eps)^(-1/2)``, ``n = c ρ``, ``a = ρ g γ``,
``m1 = Σ g γ``, ``m2 = Σ g γ n``, ``dx = a − ρ m1 / D − ρ n m2 / D``)::

    var dx = (a − b1 − 3 b2)² v_ρ + OPS_DIRECT (a² + b1²) + OPS_VARIANCE b2²
             + (ρ/D)² (V(gγ) + OPS_TERM Σ(gγ)²) + (ρ n/D)² (V(gγn) + OPS_TERM Σ(gγn)²)
             + (ρ² (m2 + n m1) / D)² var μ

with ``b1 = ρ m1 / D``, ``b2 = ρ n m2 / D`` (``b2 ∝ ρ³``, hence the 3), ``v_ρ`` the mean
square's model over ``c`` and ``var μ = V(x) / D² + μ²`` (:func:`mean_var`: the mean's sum
and its division; ``δμ`` moves ``n_k`` by ``−ρ δμ`` and ``m2`` by ``−ρ δμ m1``).
**Magnitude**: ``|a| + |b1| + 3|b2|`` with every sum over ``|terms|``.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.norms import norm_op, rms, row_length
from gradcheck_bi.ops.record import BIAS, WEIGHT, Grads, Op, Point, Sums, Tensors


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    x = inputs["x"]
    c = x - x.mean(dim=-1, keepdim=True)
    return {"y": rms(c, options["eps"]) * params["weight"] + params["bias"]}


def step_scale(point: Point, name: str) -> torch.Tensor:
    """The length of the centred row."""
    x = point.inputs64["x"].reshape(-1, point.inputs64["x"].shape[-1])
    return row_length(x - x.mean(-1, keepdim=True), point.options["eps"])


def mean_var(x: torch.Tensor, sums: Sums) -> torch.Tensor:
    """``V(x) / D² + μ²`` over the last axis: the variance, in ``u²``, of the mean ``μ`` (its
    sum in any order and its division)."""
    d = x.shape[-1]
    mu = x.mean(-1)
    return sums.any_order_var(x) / d**2 + mu * mu


def mean_error(point: Point, sums: Sums) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row ``(ρ, sqrt(var μ))``, fp64: ``ρ`` and the mean's error in ``u``."""
    x = point.inputs64["x"].reshape(-1, point.inputs["x"].shape[-1])
    c = x - x.mean(-1)[:, None]
    rho = torch.rsqrt((c * c).mean(-1) + point.options["eps"])
    return rho, torch.sqrt(mean_var(x, sums))


def shift(point: Point, k: float, sums: Sums) -> float:
    """``k · max|γ| · max(ρ sqrt(var μ))``: the forward's share of the mean's error."""
    rho, sigma_mu = mean_error(point, sums)
    gamma = float(point.effective["weight"].abs().max())
    return k * gamma * float((rho * sigma_mu).max())


def shared(point: Point, sums: Sums) -> torch.Tensor:
    """Per row, in ``u``: ``δμ`` moves ``Σ g y`` by ``ρ δμ Σ g γ``."""
    d = point.inputs["x"].shape[-1]
    rho, sigma_mu = mean_error(point, sums)
    gg = (point.cotangents["y"].to(torch.float64).reshape(-1, d)
          * point.effective["weight"]).sum(-1)
    return rho * gg.abs() * sigma_mu


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    x, gamma = point.inputs64["x"], point.effective["weight"]
    gy, eps = point.cotangents["y"].to(torch.float64), point.options["eps"]
    d, row_sum, var_of = x.shape[-1], sums.row_sum, sums.any_order_var
    c = x - x.mean(-1, keepdim=True)
    rho = torch.rsqrt(row_sum(c * c).unsqueeze(-1) / d + eps)
    n = c * rho
    gg, ggn = gy * gamma, gy * gamma * n
    m1, m2 = row_sum(gg).unsqueeze(-1), row_sum(ggn).unsqueeze(-1)
    a, b1, b2 = rho * gg, rho * m1 / d, rho * n * m2 / d
    var = ((a - b1 - 3 * b2) ** 2 * sums.rsigma_var(c, eps)
           + sums.OPS_DIRECT * (a * a + b1 * b1) + sums.OPS_VARIANCE * b2 * b2
           + (rho / d) ** 2 * (var_of(gg) + sums.OPS_TERM * row_sum(gg * gg)).unsqueeze(-1)
           + (rho * n / d) ** 2 * (var_of(ggn)
                                   + sums.OPS_TERM * row_sum(ggn * ggn)).unsqueeze(-1)
           + (rho * rho * (m2 + n * m1) / d) ** 2 * mean_var(x, sums).unsqueeze(-1))
    return var.sqrt()


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    x, gamma = point.inputs64["x"], point.effective["weight"]
    gy, eps, row_sum = point.cotangents["y"].to(torch.float64), point.options["eps"], sums.row_sum
    d = x.shape[-1]
    c = x - x.mean(-1, keepdim=True)
    rho = torch.rsqrt(row_sum(c * c).unsqueeze(-1) / d + eps)
    gg, n = (gy * gamma).abs(), (c * rho).abs()
    return rho * (gg + row_sum(gg).unsqueeze(-1) / d
                  + 3 * n * row_sum(gg * n).unsqueeze(-1) / d)


ROWS = Op(
    "layer_norm", "y = (x − mean(x)) · rsqrt(var(x) + eps) · γ + β",
    inputs=("x",), params=(WEIGHT, BIAS), options=("eps",), outputs=("y",),
    reference=reference, step_scale=step_scale, input_rounding=input_rounding,
    input_magnitude=input_magnitude, needs=("x", "weight", "bias", "eps"), marks=("bias",),
    forward_extra=2.0, statistic="the mean and the variance", shift=shift, shared=shared)
OP = norm_op(ROWS)
