"""The forward of the family's other ops: every output against the op's fp64 reference.

Each output the kernel returns is compared with the reference (:mod:`gradcheck_bi.ops.
references`, effective γ and β) and held to its tolerance
(:func:`gradcheck_bi.tolerance.family.forward_tolerances`: RMSNorm's bound over the
statistic's terms with the op's extra roundings, the layer norm's mean, ``residual_out``'s
one addition). The check passes when every output is within its tolerance, and the forward
with grad enabled gives every output bitwise (as for RMSNorm: no untested training path).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.checks._measure import bitwise_diff, locate, nonfinite
from gradcheck_bi.checks.family.point import OpPoint, make_point, reference
from gradcheck_bi.kernels.opcall import op_forward
from gradcheck_bi.tolerance.family import forward_tolerances
from gradcheck_bi.tolerance.noise import unit_roundoff
from gradcheck_bi.tolerance.rules import overridden
from gradcheck_bi.vocab import Config, Measurement

REFERENCE = "fp64 torch, effective γ and β"


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
    dtype = point.inputs["x"].dtype
    tols = forward_tolerances(point, {n: ref[n] for n in outs}, unit_roundoff(dtype),
                              unit_roundoff(torch.promote_types(dtype, torch.float32)))
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
