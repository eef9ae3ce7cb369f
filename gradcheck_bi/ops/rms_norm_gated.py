"""``rms_norm_gated``: the mean square over each group of ``group_size`` consecutive features
(``None`` = D), a gate ``act(z)`` (``activation``: silu, or sigmoid) and an optional bias
β, which is added before the gate — Mamba-2's ``rmsnorm_fn`` and fla's ``rms_norm_gated``
both compute it so: with ``norm_before_gate`` ``y = (rms(x) · γ + β) · act(z)``, else
``y = rms(x · act(z)) · γ + β``.

**Forward**: RMSNorm's bound over the group's terms with the gate's activation and product
(``OPS_GATE + 1``) per element.

**Rounding of d<input>** (``s = act(z)``): before the gate, ``dx`` is the RMSNorm model per
group with cotangent ``g s`` (+ ``OPS_GATE`` roundings of that product), ``dz = g (n γ + β)
act'(z)`` is elementwise (``v_r (g n γ act')² + OPS_GATE (g (|n γ| + |β|) S)²``); after
the gate (``u = x s``), ``du`` is the RMSNorm model per group at ``u``, ``dx = du s`` and
``dz = du x act'(z)`` carry it, plus ``OPS_GATE`` roundings of each (``dz``'s of ``du x
S``). ``S`` is the size of the terms of ``act'`` (:data:`~gradcheck_bi.ops.norms.GATES`):
its rounding is relative to them, not to ``silu'``, which cancels to 0 near ``z = −1.28``
(held relative to ``silu'``, a correct bf16 kernel failed ``dz`` at 1.008 of its tolerance
in 2 of 200 random configurations).

>>> import torch
>>> x, z = torch.tensor([[3.0, 4.0]], dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
>>> p = {"weight": torch.ones(2, dtype=torch.float64), "bias": torch.ones(2, dtype=torch.float64)}
>>> ROWS.reference({"x": x, "z": z}, p, {"eps": 0.0, "activation": "sigmoid"})["y"]
tensor([[0.9243, 1.0657]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.fields import BadValue, PointAxis, all_of, boolean
from gradcheck_bi.ops.norms import (
    GATES,
    Gate,
    grouped,
    norm_op,
    normed,
    rms,
    row_length,
)
from gradcheck_bi.ops.record import OPTIONAL_BIAS, WEIGHT, Grads, Op, Point, Sums, Tensors
from gradcheck_bi.ops.shaped import Axis

# silu(z) = z / (1 + exp(-z)) and silu'(z): exp (not always correctly rounded), an add, a
# division and the products around them (sigmoid's are fewer).
OPS_GATE = 8.0
ACTIVATION = Axis("activation", ("silu", "sigmoid"), passed=True,
                  names=("activation", "act", "gate_act"),
                  words="the gate's activation: silu (fla's 'swish') or sigmoid")


def group_size(v: Any) -> int | None:
    """A group size as a case or the command line gives it: an integer, or ``"D"``."""
    if v == "D":
        return None  # one group per row
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BadValue("an integer >= 1, or D (one group per row)")
    return v


def group_sizes(asked: list[Any] | None, d: int) -> list[Any]:
    """The group sizes swept at row length ``d`` (asked ``None``: D/4 where it divides D,
    and D; a size of ``None`` is D); a size that does not divide D is left out."""
    wanted = asked if asked is not None else ([d // 4, None] if d % 4 == 0 and d >= 8
                                              else [None])
    sizes = [d if g is None else int(g) for g in wanted]
    return list(dict.fromkeys(g for g in sizes if 0 < g <= d and d % g == 0))


# The point's fields for the two options (top-level keys of the JSON): the group size, and
# whether the norm comes before the gate (both orders swept; a point without one: before).
POINT_OPTIONS = (
    PointAxis("group_size", group_size, "group_sizes", "group sizes (integers >= 1, or \"D\")",
              json="op", cli="--group-size", word=lambda w: int(w) if w.isdigit() else w,
              swept=group_sizes, option=True, key_word="group"),
    PointAxis("norm_before_gate", boolean, "norm_before_gate", "booleans", json="op",
              cli="--norm-before-gate", swept=all_of(True, False), unset=True, option=True),
)


def gate_of(options: dict[str, Any]) -> Gate:
    return GATES[options.get("activation", "silu")]


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    x, z = inputs["x"], inputs["z"]
    gate = gate_of(options).fn(z)
    g = options.get("group_size")
    beta = params.get("bias", 0.0)
    if options.get("norm_before_gate", True):
        n = rms(grouped(x, g), options["eps"]).reshape(x.shape)
        return {"y": (n * params["weight"] + beta) * gate}
    n = rms(grouped(x * gate, g), options["eps"]).reshape(x.shape)
    return {"y": n * params["weight"] + beta}


def bias_term(point: Point) -> torch.Tensor | None:
    """β's part of ``y`` before the gate, ``β · act(z)``, rounded by the gate too; after it
    ``None``: β itself, added last."""
    if not point.options["norm_before_gate"]:
        return None
    beta = point.effective.get("bias", torch.zeros((), dtype=torch.float64))
    return beta * gate_of(point.options).fn(point.inputs64["z"])


def step_scale(point: Point, name: str) -> torch.Tensor:
    """The shortest group's length of what is normalised (``x`` or ``x·silu(z)``); for the
    gate ``z`` the scale of silu, 1, or less where ``x`` is long."""
    ins = {n: t.reshape(-1, t.shape[-1]) for n, t in point.inputs64.items()}
    eps, x = point.options["eps"], ins["x"]
    gate = gate_of(point.options).fn(ins["z"])
    before = point.options["norm_before_gate"]
    v = x if before else x * gate
    shortest = row_length(grouped(v, point.options["group_size"]), eps).min(-1).values
    if name == "x":
        return shortest if before else shortest / gate.abs().amax(-1).clamp(min=1.0)
    ones = torch.ones_like(shortest)
    return ones if before else torch.minimum(ones, shortest / x.abs().amax(-1).clamp(
        min=1e-300))


def reach(point: Point, name: str, output: str) -> int:
    """The statistic's group; the gate ``z`` applied after the norm is elementwise."""
    if name == "z" and point.options.get("norm_before_gate"):
        return 1
    return int(point.options.get("group_size") or point.inputs["x"].shape[-1])


def forward_terms(point: Point) -> int:
    return int(point.options.get("group_size") or point.inputs["x"].shape[-1])


def _rms_grad(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
              group: int | None) -> torch.Tensor:
    """Exact ``d/dv Σ g·γ·rms(v)`` per group: ``gγr − v r³ mean(gγv)``."""
    vg, gg = grouped(v, group), grouped(g * gamma, group)
    r = torch.rsqrt((vg * vg).mean(-1, keepdim=True) + eps)
    return (gg * r - vg * r**3 * (gg * vg).mean(-1, keepdim=True)).reshape(v.shape)


def _grouped_dx_sigma(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
                      group: int | None, sums: Sums) -> torch.Tensor:
    """The RMSNorm ``dx`` model with the statistic over each group of the last axis."""
    sig = sums.dx_sigma(grouped(v, group), grouped(gamma, group), grouped(g, group), eps)
    return sig.reshape(v.shape)


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    inputs, gamma = point.inputs64, point.effective["weight"]
    x, z, gy = inputs["x"], inputs["z"], point.cotangents["y"].to(torch.float64)
    eps, group = point.options["eps"], point.options["group_size"]
    act = gate_of(point.options)
    gate, dgate = act.fn(z), act.grad(z)
    d = exact["x" if name == "x" else "z"]
    if point.options["norm_before_gate"]:
        if name == "x":
            a = gy * gate * gamma * torch.rsqrt(
                grouped(x * x, group).mean(-1, keepdim=True) + eps).expand(
                grouped(x, group).shape).reshape(x.shape)
            return (_grouped_dx_sigma(x, gamma, gy * gate, eps, group, sums) ** 2
                    + OPS_GATE * a * a).sqrt()
        v_r = sums.rsigma_var(grouped(x, group), eps).expand(grouped(x, group).shape)
        n_gamma = normed(x, eps, group) * gamma
        d_norm = gy * n_gamma * dgate  # the part of dz the statistic's rounding moves
        size = gy * (n_gamma.abs() + _beta(point).abs()) * act.grad_size(z)
        return (v_r.reshape(x.shape) * d_norm * d_norm + OPS_GATE * size * size).sqrt()
    u = x * gate
    sigma_du = _grouped_dx_sigma(u, gamma, gy, eps, group, sums)
    carry = gate if name == "x" else x * dgate
    size = d if name == "x" else _rms_grad(u, gamma, gy, eps, group) * x * act.grad_size(z)
    return (sigma_du**2 * carry * carry + OPS_GATE * size * size).sqrt()


def _beta(point: Point) -> torch.Tensor:
    return point.effective.get("bias", torch.zeros((), dtype=torch.float64))


def _magnitude(v: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor, eps: float,
               group: int | None, sums: Sums) -> torch.Tensor:
    """RMSNorm's ``dx`` magnitude with the statistic over each group of the last axis."""
    m = sums.dx_magnitude(grouped(v, group), grouped(gamma, group), grouped(g, group), eps)
    return m.reshape(v.shape)


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    """RMSNorm's per group, carried through the gate."""
    inputs, gamma = point.inputs64, point.effective["weight"]
    x, z, eps = inputs["x"], inputs["z"], point.options["eps"]
    gy, group = point.cotangents["y"].to(torch.float64), point.options["group_size"]
    act = gate_of(point.options)
    gate = act.fn(z)
    if point.options["norm_before_gate"]:
        if name == "x":
            return _magnitude(x, gamma, gy * gate, eps, group, sums)
        n_gamma = normed(x, eps, group) * gamma
        return gy.abs() * (n_gamma.abs() + _beta(point).abs()) * act.grad_size(z)
    m_u = _magnitude(x * gate, gamma, gy, eps, group, sums)
    return m_u * (gate.abs() if name == "x" else x.abs() * act.grad_size(z))


ROWS = Op(
    "rms_norm_gated",
    "statistic over groups of group_size features; norm_before_gate: y = (norm(x)·γ + β)·"
    "act(z), else y = norm(x·act(z))·γ + β; act silu or sigmoid (activation)",
    inputs=("x", "z"), params=(WEIGHT, OPTIONAL_BIAS),
    options=("eps", "group_size", "norm_before_gate"),
    outputs=("y",), reference=reference, step_scale=step_scale,
    input_rounding=input_rounding, input_magnitude=input_magnitude,
    needs=("x", "z", "weight", "eps"), marks=("z",),
    optional_marks=("group_size", "norm_before_gate"), unscaled=("z",), stream={"z": 1},
    reach=reach,
    forward_terms=forward_terms, forward_extra=OPS_GATE + 1.0,
    statistic="the mean square over each group and the gate",
    fixable={"group_size": (None,), "norm_before_gate": (True, False),
             "activation": ACTIVATION.values},
    axes=(ACTIVATION,), bias_term=bias_term, point_options=POINT_OPTIONS)
OP = norm_op(ROWS)
