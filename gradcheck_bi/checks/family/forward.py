"""The forward of the family's other ops: every output against the op's fp64 reference.

Each output the kernel returns is compared with the reference (:mod:`gradcheck_bi.ops.
references`, effective γ and β) and held to ``max|ref| · (u_out + u_c · factor)``, the
RMSNorm bound (:func:`~gradcheck_bi.checks.summation.forward_factor`: the statistic's sum
over its ``n`` terms in any order) with the op's extra roundings per element added inside
the root (:func:`family_factor`): the fused add's ``x + residual`` (1), the layer norm's
centring and bias (2), the gate's silu and product (``OPS_GATE + 1``); the gated norm's
statistic runs over ``group_size`` terms. The layer norm adds the mean's own error
(``δμ`` shifts every centred element; σ ``sqrt(V(x)/D² + μ²)`` in ``u``, from the inputs)
times ``ρ |γ|``. ``residual_out`` is one addition: ``max|ref| · (u_out + u_c)``. The check
passes when every output is within its tolerance, and the forward with grad enabled gives
every output bitwise (as for RMSNorm: no untested training path).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.checks._measure import bitwise_diff, locate, nonfinite
from gradcheck_bi.checks.family.point import OpPoint, make_point, reference
from gradcheck_bi.checks.family.rounding import OPS_GATE
from gradcheck_bi.checks.summation import ONE_SIGN, OPS_RSQRT, OPS_SCALE, any_order_var
from gradcheck_bi.checks.tolerance import overridden
from gradcheck_bi.fd import K_SIGMA, unit_roundoff
from gradcheck_bi.kernels.opcall import op_forward
from gradcheck_bi.vocab import Config, Measurement

REFERENCE = "fp64 torch, effective γ and β"
EXTRA_OPS = {"fused_add_rms_norm": 1.0, "layer_norm": 2.0, "rms_norm_gated": OPS_GATE + 1.0}


def family_factor(n: int, extra: float) -> float:
    """RMSNorm's forward factor over ``n`` terms with ``extra`` roundings per element:
    ``min(n/2 + OPS_RSQRT + OPS_SCALE + extra, K_SIGMA·sqrt(ONE_SIGN (n+1)/8 + OPS_RSQRT +
    OPS_SCALE + extra))``."""
    worst = n / 2 + OPS_RSQRT + OPS_SCALE + extra
    return min(worst, K_SIGMA * math.sqrt(ONE_SIGN * (n + 1) / 8 + OPS_RSQRT + OPS_SCALE
                                          + extra))


def _terms(point: OpPoint) -> int:
    d = point.inputs["x"].shape[-1]
    return point.options.get("group_size") or d


def _mean_error(point: OpPoint, u_c: float) -> float:
    """The layer norm's mean: ``K_SIGMA u_c max|γ| max_rows ρ sqrt(V(x)/D² + μ²)``."""
    x = point.inputs64["x"].reshape(-1, point.inputs["x"].shape[-1])
    d = x.shape[-1]
    mu = x.mean(-1)
    c = x - mu[:, None]
    rho = torch.rsqrt((c * c).mean(-1) + point.options["eps"])
    sigma = rho * torch.sqrt(any_order_var(x) / d**2 + mu * mu)
    gamma = float(point.effective["weight"].abs().max())
    return K_SIGMA * u_c * gamma * float(sigma.max())


def tolerances(point: OpPoint, ref: dict[str, torch.Tensor], dtype: torch.dtype
               ) -> dict[str, float]:
    """The tolerance of each output (absolute)."""
    u_out = unit_roundoff(dtype)
    u_c = unit_roundoff(torch.promote_types(dtype, torch.float32))
    out = {}
    for name, r in ref.items():
        scale = float(r.abs().max()) if r.numel() else 0.0
        if name == "residual_out":
            out[name] = scale * (u_out + u_c)
            continue
        factor = family_factor(_terms(point), EXTRA_OPS[point.op.name])
        out[name] = scale * (u_out + u_c * factor)
        if point.op.name == "layer_norm":
            out[name] += _mean_error(point, u_c)
    return out


def _training_note(fn: Any, point: OpPoint, outs: dict[str, torch.Tensor]) -> str:
    leaves = {n: t.detach().clone().requires_grad_(True)
              for n, t in {**point.inputs, **point.params}.items()}
    with torch.enable_grad():
        train = op_forward(fn, {n: leaves[n] for n in point.inputs},
                           {n: leaves[n] for n in point.params}, point.options, point.zcg)
    for name, y in outs.items():
        n, delta, first = bitwise_diff(train[name].detach(), y)
        if n:
            at = ",".join(str(i) for i in first or [])
            return (f"forward with grad enabled differs from forward under no_grad in {n} of "
                    f"{y.numel()} elements of {name} (max |Δ| {delta:.3e}, first at [{at}])")
    return ""


def check_op_forward(fn: Any, cfg: Config) -> Measurement:
    """Every output the kernel returns vs the op's fp64 reference (see the module)."""
    point = make_point(cfg)
    with torch.no_grad():
        outs = op_forward(fn, point.inputs, point.params, point.options, point.zcg)
    ref = reference(point)
    tols = tolerances(point, {n: ref[n] for n in outs}, point.inputs["x"].dtype)
    details: dict[str, Any] = {"reference": REFERENCE, "outputs": list(outs)}
    worst_name, worst_ratio = "y", -1.0
    for name, y in outs.items():
        err = (y.to(torch.float64) - ref[name]).abs()
        tol = overridden(tols[name], float(ref[name].abs().max()), cfg)
        max_err, where = locate(err)
        ratio = max_err / tol if tol > 0 else (0.0 if max_err == 0 else math.inf)
        if math.isnan(max_err):
            ratio = math.inf
        details[f"max_abs_err_{name}"], details[f"tolerance_{name}"] = max_err, tol
        if ratio > worst_ratio:
            worst_name, worst_ratio, worst = name, ratio, (max_err, tol, where)
    if "residual_out" in point.op.outputs and "residual_out" not in outs:
        details["note"] = "the kernel returns y alone: no residual_out to check"
    details["worst_output"] = worst_name
    notes = [nonfinite(n, y) for n, y in outs.items()] + [_training_note(fn, point, outs)]
    problems = [n for n in notes if n]
    max_err, tol, where = worst
    passed = not problems and math.isfinite(max_err) and max_err <= tol
    return Measurement(max_err, tol, passed, where, "; ".join(problems), details)
