"""The forward of every op: every output against the op's fp64 reference.

Each output the kernel returns is compared with the reference (:mod:`gradcheck_bi.ops.
references`, effective γ and β) and held to its tolerance
(:func:`gradcheck_bi.tolerance.rows.forward_tolerances`: RMSNorm's bound over the
statistic's terms with the op's extra roundings, the layer norm's mean, ``residual_out``'s
one addition). The check passes when every output is within its tolerance, and the forward
with grad enabled gives every output bitwise (as for RMSNorm: no untested training path).
bf16/fp16: :func:`check_op_forward_ulp`, every output audited in ulps.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi import lowp
from gradcheck_bi.checks._measure import (
    bitwise_diff,
    locate,
    measured_per_element,
    nonfinite_notes,
)
from gradcheck_bi.checks.rows.lift import LIFT_NAMES
from gradcheck_bi.checks.rows.point import (
    OpPoint,
    lifted_point,
    make_point,
    reference,
    returns_y_alone,
    stored,
)
from gradcheck_bi.kernels.calling.opcall import op_forward
from gradcheck_bi.tolerance.half import (
    FRAC_THRESHOLD,
    MAX_ULP_THRESHOLD,
    MIN_COUNT,
    higher_margin,
)
from gradcheck_bi.tolerance.noise import judged_roundoff, unit_roundoff
from gradcheck_bi.tolerance.rows import compute_bound, forward_tolerances
from gradcheck_bi.tolerance.rules import fd_tolerance, overridden
from gradcheck_bi.vocab import HALF_DTYPES, Config, Measurement

REFERENCE = "fp64 torch, effective γ and β"
U_C = unit_roundoff(torch.float32)  # where a correct half-precision kernel computes


def inaccuracy(fn: Any, point: OpPoint, margin: float = 0.0) -> str | None:
    """How the kernel's forward at ``point`` (fp64 or fp32) falls short of that dtype's
    accuracy (the fp32/fp64 forward check's tolerance, plus ``margin`` × max |output|),
    ``None`` if it does not."""
    with torch.no_grad():
        outs = op_forward(fn, point.inputs, point.params, point.options, point.zcg)
    ref = reference(point)
    dtype = point.lead.dtype
    tols = forward_tolerances(point, {n: ref[n] for n in outs}, unit_roundoff(dtype),
                              unit_roundoff(torch.promote_types(dtype, torch.float32)))
    for name, y in outs.items():
        err = float((y.to(torch.float64) - ref[name]).abs().max()) if y.numel() else 0.0
        scale = float(ref[name].abs().max()) if y.numel() else 0.0
        if not err <= tols[name] + margin * scale:
            return (f"runs, but its forward is off by {err:.2e} in {name} (max |{name}| "
                    f"{scale:.2e}): less than {LIFT_NAMES[dtype]} accuracy inside")
    return None


def delivered_precision(errs: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                        dtype: torch.dtype) -> dict[str, float]:
    """The precision the forward delivers beside its output dtype's ``u_dtype``: per output
    ``u_eff_<name> = ‖y - ref‖₂ / ‖ref‖₂`` (0 for an all-zero reference) — a correctly
    rounded output gives about ``u/√3``; a kernel computing in a narrower type than its
    dtype (fp32 inside an fp64 kernel) shows that type's ``u`` — and the largest of them as
    ``u_eff``, with ``u_eff_ratio = u_eff / u_dtype``."""
    u = unit_roundoff(dtype)
    out: dict[str, float] = {"u_dtype": u}
    for name, err in errs.items():
        norm = float(torch.linalg.vector_norm(ref[name]))
        out[f"u_eff_{name}"] = float(torch.linalg.vector_norm(err)) / norm if norm > 0 else 0.0
    out["u_eff"] = max(out[f"u_eff_{n}"] for n in errs)
    out["u_eff_ratio"] = out["u_eff"] / u
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
    if cfg.dtype in HALF_DTYPES:
        return check_op_forward_ulp(fn, cfg, point, outs)
    ref = reference(point)
    dtype, working = point.lead.dtype, cfg.working_precision
    tols = forward_tolerances(point, {n: ref[n] for n in outs}, judged_roundoff(dtype, working),
                              judged_roundoff(torch.promote_types(dtype, torch.float32),
                                              working))
    details: dict[str, Any] = {"reference": REFERENCE, "outputs": list(outs)}
    worst_name, worst_ratio = point.op.outputs[0], -1.0
    errs = {n: (y.to(torch.float64) - ref[n]).abs() for n, y in outs.items()}
    for name, err in errs.items():
        tol = overridden(tols[name], float(ref[name].abs().max()), cfg)
        max_err, where = locate(err)
        ratio = max_err / tol if tol > 0 else (0.0 if max_err == 0 else math.inf)
        if math.isnan(max_err):
            ratio = math.inf
        details[f"max_abs_err_{name}"], details[f"tolerance_{name}"] = max_err, tol
        if ratio > worst_ratio:
            worst_name, worst_ratio, worst = name, ratio, (max_err, tol, where)
    details.update(returns_y_alone(point, list(outs)))
    details.update(delivered_precision(errs, ref, dtype))
    details["worst_output"] = worst_name
    notes = [*nonfinite_notes(*outs.items()), _training_note(fn, point, outs)]
    problems = [n for n in notes if n]
    max_err, tol, where = worst
    passed = not problems and math.isfinite(max_err) and max_err <= tol
    return Measurement(max_err, tol, passed, where, "; ".join(problems), details)


def _audit(y: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, cfg: Config
           ) -> tuple[Measurement, lowp.AuditResult]:
    """One output against one exact reference: every element within ``MAX_ULP_THRESHOLD``
    ulps plus its ``bound``; at most ``max(MIN_COUNT, FRAC_THRESHOLD·n)`` elements not
    correctly rounded (a miss within ``bound`` of a tie is not counted: correct fp32
    arithmetic cannot resolve it); none overflowing."""
    audit = lowp.audit(y, ref, tie_bound=bound)
    ulp = lowp.error_ulp(ref, y)
    err = torch.nan_to_num((y.to(torch.float64) - ref).abs(), nan=math.inf)
    tol = fd_tolerance(MAX_ULP_THRESHOLD * ulp + bound,
                       float(ref.abs().max()) if ref.numel() else 0.0, cfg)
    m = measured_per_element(err, tol, [], {})
    if m.worst is not None and err.numel():
        m.details["ulp"] = float(ulp[tuple(m.worst)])
    allowed = max(MIN_COUNT, FRAC_THRESHOLD * audit.n_compared)
    m.passed = (m.passed and audit.n_overflow == 0
                and (audit.n_not_correctly_rounded <= allowed or cfg.atol is not None
                     or cfg.rtol is not None))
    return m, audit


def check_op_forward_ulp(fn: Any, cfg: Config, point: OpPoint, outs: dict[str, torch.Tensor]
                         ) -> Measurement:
    """bf16/fp16: every output audited in ulps against its exact fp64 reference (the
    inputs upcast exactly), RMSNorm's rule (:func:`gradcheck_bi.lowp.passes`) with each
    element's fp32 arithmetic (:func:`gradcheck_bi.tolerance.rows.compute_bound`) added
    to its ulp threshold. An op with a stored intermediate (``Op.stored``: the fused add's
    ``residual_out``, rounded once, what Liger and vLLM normalise) passes ``y`` against either."""
    ref = reference(point)
    refs = {n: [("exact", ref[n])] for n in outs}
    if point.op.stored is not None:  # the fused add's y: s as stored
        first = point.op.outputs[0]
        refs[first].append((f"{point.op.stored.label} (rounded to {cfg.dtype})",
                            reference(stored(point))[first]))
    details: dict[str, Any] = {"method": "ulp audit", "reference": f"{REFERENCE}, exact",
                               "outputs": list(outs), **returns_y_alone(point, list(outs))}
    worst: Measurement | None = None
    failing: list[str] = []
    audits: dict[str, lowp.AuditResult] = {}
    for name, y in outs.items():
        label = refs[name][0][0]
        m, audit = _audit(y, ref[name], compute_bound(point, name, ref[name], U_C), cfg)
        for other, r in refs[name][1:]:
            if m.passed:
                break
            label = other
            m, audit = _audit(y, r, compute_bound(point, name, r, U_C), cfg)
        details[f"max_ulp_{name}"] = audit.max_ulp
        details[f"mean_signed_ulp_{name}"] = audit.mean_signed_ulp
        details[f"not_correctly_rounded_{name}"] = audit.frac_not_correctly_rounded
        details[f"diagnosis_{name}"] = lowp.classify(audit)
        audits[name] = audit
        if audit.n_ties:
            details[f"ties_within_fp32_{name}"] = audit.n_ties
        if len(refs[name]) > 1:
            details[f"reference_{name}"] = label if m.passed else "exact, and as stored"
        if not m.passed:
            failing.append(name)
        ratio = m.details.get("ratio", 0.0)
        if worst is None or ratio > worst.details.get("ratio", 0.0):
            worst, details["worst_output"] = m, name
    assert worst is not None
    notes = [*nonfinite_notes(*outs.items()), _training_note(fn, point, outs)]
    problems = [n for n in notes if n]
    if failing:  # the fp64 run decides whether a large error can be the formula
        why, right = _in_fp64(fn, point, unit_roundoff(cfg.torch_dtype))
        problems += [f"{n}: {lowp.classify(audits[n], formula_ruled_out=right)}"
                     for n in failing]
        problems.append(why)
        for n in failing:
            details[f"diagnosis_{n}"] = lowp.classify(audits[n], formula_ruled_out=right)
        # Rounding only (right in fp64, nothing non-finite): ranked below a formula's failure.
        details["cause"] = "precision" if right and len(problems) == len(failing) + 1 \
            else "formula"
    return Measurement(worst.max_abs_err, worst.tolerance, not problems, worst.worst,
                       "; ".join(p for p in problems if p), {**details, **worst.details})


def _in_fp64(fn: Any, point: OpPoint, u_half: float) -> tuple[str, bool]:
    """Whether the same kernel's forward is right in fp64 at the same inputs: a formula error
    shows in every precision, a precision error vanishes there. Right: within fp64's
    tolerance plus a margin far below the half-precision ulp, as RMSNorm's diagnosis (a
    kernel computing in fp32 whatever its dtype is right here). Returns the line and
    whether fp64 was right (then no error at this dtype is called the formula's)."""
    try:
        short = inaccuracy(fn, lifted_point(point, torch.float64), higher_margin(u_half))
    except Exception:  # only a diagnosis: the verdict stands without it
        return "", False
    if short is None:
        return "in fp64 the same forward is right: a precision choice, not the formula", True
    return "its fp64 forward is wrong too: the formula, not precision", False
