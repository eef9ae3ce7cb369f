"""The kernel's working precision: measured once per (kernel, device, dtype) from its forward.

A kernel called in fp64 may compute in fp32 inside (Hugging Face's ``hidden_states.to(
torch.float32)``): its forward then errs by fp32 rounding against the fp64 reference, and
every check held to fp64's rounding fails on rounding, not on a defect. One forward at a fresh
random point (the run's first shape and seed, γ = randn, β = randn: never zeros) against the
op's fp64 reference decides. The forward's error is **rounding at precision p** (fp32, fp16,
bf16, the finest first, each coarser than the dtype) when

* per element: ``|y_i - ref_i| ≤ u_p |ref_i| + compute_bound_i(u_p)`` — one rounding of the
  output plus the forward check's model of a correct kernel's arithmetic in ``p``
  (:func:`~gradcheck_bi.tolerance.rows.compute_bound`);
* unbiased: the mean of the rows' mean relative errors is within ``BIAS_SE`` standard errors
  of 0 (the rows' spread: a rounding of the row statistic is shared by a row) plus
  ``BIAS_U · u_p`` — a scaled output, a wrong eps, a wrong mean are systematic and stay out;
* for fp16/bf16, element-wise: the relative errors spread within each row (RMS) between
  ``SPREAD_U`` of ``u_p`` and ``SPREAD_MAX`` ``u_p`` — an output that rounds at ``p`` rounds
  every element a few times at ``u_p`` (RMS ``u_p/√3`` each); a smooth error far below
  ``p``'s rounding (a wrong eps) does not, and is no licence for ``p``'s tolerance; a
  coarser rounding (bf16 tried as fp16) spreads wider.

A forward within its dtype's own tolerance, one that matches no precision (a defect: it fails
as before), half-precision dtypes (audited in ulps) and ``--precision exact`` are judged at
the dtype: :func:`working_precision` returns ``None``. Where the forward errs beyond the
dtype's rounding yet matches no precision, :func:`measure` says why in one line
(``Working.fallback``): every check then falls back to the dtype's rounding, and the user is
told so rather than left with failures that may be arithmetic the model does not know.

>>> [u_name for u_name, _ in CANDIDATES]
['fp32', 'fp16', 'bf16']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from gradcheck_bi.checks.rows.point import make_point, reference
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.kernels.calling.opcall import op_forward
from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.ops.record import ZCG
from gradcheck_bi.tolerance.noise import unit_roundoff
from gradcheck_bi.tolerance.rows import compute_bound, forward_tolerances
from gradcheck_bi.vocab import DTYPES, HALF_DTYPES, Config, KernelSpec

CANDIDATES = [(name, unit_roundoff(DTYPES[name])) for name in ("fp32", "fp16", "bf16")]
BIAS_SE = 4.0  # standard errors of the rows' mean relative error
BIAS_U = 0.5  # of u_p: a rounding's bias is far below half a unit
SPREAD_U = 1 / 8  # of u_p: one rounding at p spreads relative errors by ~u_p/√3
SPREAD_MAX = 2.0  # of u_p: a few roundings per element (x, γ, the product, the output)

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Working:
    """The measured working precision (``None``: judged at the dtype) and, where the forward
    errs beyond the dtype's rounding yet as no precision rounds, why (one line)."""

    precision: str | None
    fallback: str = ""


def working_precision(spec: KernelSpec, at: Config) -> str | None:
    """The precision the kernel computes at, where its forward shows rounding coarser than
    ``at.dtype``'s (``"fp32"``, ``"fp16"``, ``"bf16"``), else ``None`` (:func:`measure`)."""
    return measure(spec, at).precision


def measure(spec: KernelSpec, at: Config) -> Working:
    """:func:`working_precision` with the reason it fell back to the dtype, if it did. Runs
    one forward at ``at``'s shape and seed with γ (and β) = randn; a forward that raises
    propagates (the caller decides)."""
    if at.precision == "exact" or at.dtype in HALF_DTYPES or at.op in SHAPED:
        return Working(None)  # an op of any shape measures its own (gradcheck_bi.checks.shaped)
    mode: dict[str, Any] = {ZCG.field: min(spec.zcg)}  # γ's mode: off, unless only on is run
    cfg = replace(at, check="forward", working_precision=None, **_controls(spec, at), **mode)
    outs, refs, own_tol, bound = _forward(spec, cfg)
    if all(float((y - refs[n]).abs().max()) <= own_tol[n] for n, y in outs.items()):
        return Working(None)  # within the dtype's own rounding
    u_dtype = unit_roundoff(at.torch_dtype)
    tried = []
    for name, u in CANDIDATES:
        if u <= u_dtype:
            continue
        why = next((w for n, y in outs.items()
                    if (w := _unexplained(y, refs[n], bound(n, u), u,
                                          spread=name in HALF_DTYPES))), "")
        if not why:
            return Working(name)
        tried.append((name, why))
    return Working(None, _fallback(at.dtype, outs, refs, own_tol, tried))


def _controls(spec: KernelSpec, at: Config) -> dict[str, Any]:
    """The point's control field of each parameter of ``at``'s op: randn, never zeros; a
    parameter the kernel lacks (``spec.fixed``: absent) at its identity; an optional one the
    point leaves out (unset) left out."""
    absent = dict(spec.fixed)
    out: dict[str, Any] = {}
    for p in ROWS[at.op].params:
        field = p.control.field
        if getattr(at, field) is not None:
            out[field] = p.identity if p.name in absent else "randn"
    return out


def _fallback(dtype: str, outs: Tensors, refs: Tensors, own_tol: dict[str, float],
              tried: list[tuple[str, str]]) -> str:
    """One line: how far the forward errs, and why it is rounding at no coarser precision
    (the closest one's reason: the first that only its bias or spread ruled out)."""
    name, err = max(((n, float((y - refs[n]).abs().max())) for n, y in outs.items()),
                    key=lambda t: t[1] / max(own_tol[t[0]], 1e-300))
    closest = next(((n, w) for n, w in tried if not w.startswith("elements")), None)
    closest = closest or (tried[0] if tried else None)
    line = (f"the working precision was not found: the forward's {name} errs by up to "
            f"{err:.3e}, past {dtype} rounding (tol {own_tol[name]:.3e})")
    if closest:
        others = [n for n, _ in tried if n != closest[0]]
        line += (f", yet not as rounding at {closest[0]} ({closest[1]})"
                 + (f" nor at {' or '.join(others)}" if others else ""))
    return (f"{line}; every check falls back to {dtype} rounding (a failure may come from "
            "the forward's error, not the backward)")


def _forward(spec: KernelSpec, cfg: Config) -> tuple[Tensors, Tensors, dict[str, float], Any]:
    """(the kernel's outputs in fp64, the references, the dtype's own forward tolerance of
    each, and ``bound(name, u)``: the per-element bound of a correct kernel at ``u``)."""
    u_out = unit_roundoff(cfg.torch_dtype)
    # what a kernel called in this dtype computes in at the least: half types in fp32
    u_c = unit_roundoff(torch.promote_types(cfg.torch_dtype, torch.float32))
    with torch.no_grad():
        point = make_point(cfg)
        outs = op_forward(as_op_kernel(spec.fn), point.inputs, point.params, point.options,
                          point.zcg)
        refs = reference(point)
    refs = {n: refs[n] for n in outs}
    own = forward_tolerances(point, refs, u_out, u_c)
    return ({n: t.to(torch.float64) for n, t in outs.items()}, refs, own,
            lambda n, u: u * refs[n].abs() + compute_bound(point, n, refs[n], u))


def _unexplained(y: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, u: float,
                 spread: bool) -> str:
    """Why ``y - ref`` is not rounding at unit roundoff ``u`` (see the module); "" if it is."""
    err = y - ref
    past = err.abs() > bound
    if bool(past.any()):
        worst = float((err.abs() / bound.clamp(min=1e-300)).max())
        return f"elements past its bound: {int(past.sum())}, the worst {worst:.3g}×"
    flat_err, flat_ref = err.reshape(-1, ref.shape[-1]), ref.reshape(-1, ref.shape[-1])
    nonzero = flat_ref != 0
    rel = torch.where(nonzero, flat_err / torch.where(nonzero, flat_ref, 1.0), 0.0)
    counts = nonzero.sum(-1)
    rows = counts > 0
    if not bool(rows.any()):
        return ""  # an all-zero reference: nothing shows a bias
    means = rel.sum(-1)[rows] / counts[rows]
    n_rows = int(means.numel())
    se = float(means.std()) / math.sqrt(n_rows) if n_rows > 1 else 0.0
    bias, limit = abs(float(means.mean())), BIAS_SE * se + BIAS_U * u
    if bias > limit:
        return f"a systematic relative error of {bias / u:.3g} u, limit {limit / u:.3g} u"
    if spread:
        centred = torch.where(nonzero, rel - (rel.sum(-1, keepdim=True)
                                              / counts.clamp(min=1).unsqueeze(-1)), 0.0)
        rms = math.sqrt(float((centred * centred).sum()) / max(int(counts.sum()), 1))
        if not SPREAD_U * u <= rms <= SPREAD_MAX * u:
            return (f"relative errors spread by {rms / u:.3g} u, rounding spreads "
                    f"{SPREAD_U:g}–{SPREAD_MAX:g} u")
    return ""
