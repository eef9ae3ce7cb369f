"""Finite-difference error against step size: the measurement behind ``gradcheck-bi plot``.

For ``L = Σ_outputs Σ g·y`` (random cotangents on every output) and one of the kernel's
analytic gradients — ``dx`` by default, or any other its op has (``dresidual``, ``dz``,
``dw``, ``dbias``: :attr:`gradcheck_bi.ops.Op.gradient_checks`) — sweep the
finite-difference step and record ``max |analytic − FD|``. With a stencil of order ``p`` (2
or 4) and unit roundoff ``u``:

    error(h) ≈ C_round · u / h  +  C_trunc · h^p

so a correct backward traces a V on log-log axes — slope −1 where rounding dominates (small
``h``), slope ``p`` where truncation does (large ``h``), the bottom near ``h* ~ u^(1/(p+1))``,
which is where ``run`` puts its step (:data:`gradcheck_bi.fd.STEP_REL`). A defective backward
sits on a plateau: the error is the defect, and no step moves it.

The abscissa is the *relative* step ``h/ℓ``, the ``step_rel`` that run's estimator takes:
for RMSNorm's ``dx`` ``ℓ = sqrt(Σx² + D·eps)`` per row (:func:`gradcheck_bi.fd.row_steps`),
for another op's input the length over which that input moves before the output bends
(the op's ``step_scale``, :mod:`gradcheck_bi.ops`), for a parameter ``max(1,
max|p|)`` (:func:`gradcheck_bi.fd.weight_grad`; ``y`` is linear in it: no truncation side).
Steps go by powers of two: each row's step is rounded to one anyway, so finer sampling
would only repeat points.

Each gradient is measured by the engine ``run`` measures it with
(:func:`gradcheck_bi.checks.at_step.gradient`, :mod:`gradcheck_bi.checks.rows.gradients`),
on the same point, so a curve's point at ``run_step_rel`` is the error ``run`` reports.

Numbers only here; :mod:`gradcheck_bi.report.plot` draws them (PNG or plain text).

>>> from gradcheck_bi.kernels.registry import resolve
>>> sw = step_sweep([resolve("after")], weights=["randn"], shape=(2, 32),
...                 steps=[2.0**e for e in range(-24, -1)])
>>> c = sw.curves[0]
>>> round(c.truncation.slope), round(c.rounding.slope)
(4, -1)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from gradcheck_bi import fd
from gradcheck_bi._version import __version__
from gradcheck_bi.checks.at_step import gradient
from gradcheck_bi.checks.probe import probe
from gradcheck_bi.fd.step import WEIGHT_STEP_REL, input_step_rel
from gradcheck_bi.ops import ROWS, Op
from gradcheck_bi.tolerance.noise import unit_roundoff
from gradcheck_bi.vocab import HALF_DTYPES, Config, KernelSpec, Unsupported

# Smallest step exponent per dtype: at 2^lo the rounding error u/h is still well below |dx|
# (fp64 ~1e-7, fp32 ~6e-2). Below that, x + h rounds back to x for most elements and the
# curve leaves the slope −1 line.
STEP_EXPONENTS = {"fp64": (-30, 0), "fp32": (-20, 0)}
# A point belongs to a side of the V when it is this far above the bottom: the other error
# term then contributes about a tenth or less.
DOMINANCE = 10.0
# Truncation follows h^p only while h/ℓ is small: the Taylor series of r(x) in h/ℓ has ratio
# ~25 (h/ℓ)² between consecutive error terms (see fd.py), small for h ≤ ℓ/16.
TRUNCATION_MAX_STEP = 2.0**-4
MIN_FIT_POINTS = 3
# What ℓ is, for the axis label: RMSNorm's dx (fd.row_steps), another op's input
# (the op's step_scale), a parameter (fd.weight_step).
ROW_LENGTH = "√(Σx² + D·eps) per row"


@dataclass(frozen=True)
class Fit:
    """A least-squares slope of log10(error) against log10(h/ℓ) over one side of the V."""

    slope: float
    theory: float
    step_lo: float
    step_hi: float
    points: int

    def to_dict(self) -> dict[str, Any]:
        return {"slope": round(self.slope, 4), "theory": self.theory, "step_lo": self.step_lo,
                "step_hi": self.step_hi, "points": self.points}


@dataclass
class Curve:
    """One kernel × γ control × zcg: the error at every step, and the fitted slopes."""

    kernel: str
    control: str
    zero_centered_gamma: bool
    step_rel: list[float]
    max_abs_err: list[float]
    max_abs_dx: float
    rounding: Fit | None = None
    truncation: Fit | None = None
    weighted: bool = True  # the op has a weight (else no γ control or zcg to name)

    @property
    def controls(self) -> tuple[str, bool]:
        """γ's control and mode: what a plot's line style tells apart."""
        return (self.control, self.zero_centered_gamma)

    @property
    def label(self) -> str:
        if not self.weighted:
            return self.kernel
        blind = " (blind control)" if self.control == "ones" else ""
        zcg = " zcg" if self.zero_centered_gamma else ""
        return f"{self.kernel} γ={self.control}{blind}{zcg}"

    @property
    def argmin(self) -> int:
        return min(range(len(self.max_abs_err)), key=lambda i: _finite(self.max_abs_err[i]))

    @property
    def min_step(self) -> float:
        return self.step_rel[self.argmin]

    @property
    def min_err(self) -> float:
        return self.max_abs_err[self.argmin]

    @property
    def plateau(self) -> float:
        """The median error: for a flat curve, the level it sits on."""
        s = sorted(_finite(e) for e in self.max_abs_err)
        return s[len(s) // 2]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "weight": self.control,
            "zero_centered_gamma": self.zero_centered_gamma,
            "step_rel": self.step_rel,
            "max_abs_err": self.max_abs_err,
            "max_abs_dx": self.max_abs_dx,
            "min_step_rel": self.min_step,
            "min_err": self.min_err,
            "plateau": self.plateau,
            "slope_rounding": self.rounding.to_dict() if self.rounding else None,
            "slope_truncation": self.truncation.to_dict() if self.truncation else None,
        }


@dataclass
class StepSweep:
    """Every curve of one plot, with what produced it."""

    device: str
    dtype: str
    shape: tuple[int, ...]
    eps: float
    seed: int
    stencil: fd.Stencil
    run_step_rel: float
    unit_roundoff: float
    curves: list[Curve] = field(default_factory=list)
    # The gradient swept, the op of every kernel (one op a plot: ℓ is the op's) and what ℓ is.
    check: str = "dx"
    op: str = "rms_norm"
    scale: str = ROW_LENGTH

    @property
    def reference_floor(self) -> float:
        """``u^(2/3)``: the best a central-2 difference can do at unit scale."""
        return self.unit_roundoff ** (2 / 3)

    @property
    def title(self) -> str:
        shape = "×".join(str(d) for d in self.shape)
        kernels = ", ".join(dict.fromkeys(c.kernel for c in self.curves)) + self.op_note
        return (f"{self.check} finite-difference error vs step — {kernels} · "
                f"{self.device}/{self.dtype} · shape {shape} · {self.stencil.name}")

    @property
    def op_note(self) -> str:
        """`` (layer_norm)`` after the kernels; nothing for RMSNorm, whose plot reads as it
        always has (as :meth:`gradcheck_bi.vocab.Result.to_dict` leaves its op out)."""
        return "" if self.op == "rms_norm" else f" ({self.op})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "gradcheck-bi",
            "version": __version__,
            "plot": f"{self.check} error against relative step h/ℓ",
            **({} if self.op == "rms_norm" else {"op": self.op, "step_scale": self.scale}),
            "device": self.device,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "eps": self.eps,
            "seed": self.seed,
            "stencil": self.stencil.name,
            "order": self.stencil.order,
            "run_step_rel": self.run_step_rel,
            "unit_roundoff": self.unit_roundoff,
            "reference_floor": self.reference_floor,
            "curves": [c.to_dict() for c in self.curves],
        }


def _finite(v: float) -> float:
    return v if math.isfinite(v) else math.inf


def default_steps(dtype: str) -> list[float]:
    """Powers of two ``2^lo … 2^hi`` of the relative step for ``dtype``."""
    lo, hi = STEP_EXPONENTS.get(dtype, (-20, 0))
    return [2.0**e for e in range(lo, hi + 1)]


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log10(ys) against log10(xs)."""
    return float(np.polyfit(np.log10(xs), np.log10(ys), 1)[0])


def fit_slopes(steps: Sequence[float], errs: Sequence[float], order: int
               ) -> tuple[Fit | None, Fit | None]:
    """(rounding, truncation) least-squares slopes on either side of the minimum.

    A side keeps the points at least ``DOMINANCE`` × the minimum error (one term dominates
    there); the truncation side also stops at ``h/ℓ = TRUNCATION_MAX_STEP``. A side with
    fewer than ``MIN_FIT_POINTS`` such points — a flat curve has none — gives ``None``.

    >>> hs = [2.0**e for e in range(-20, -3)]
    >>> r, t = fit_slopes(hs, [1e-16 / h + h**4 for h in hs], order=4)
    >>> round(r.slope, 2), round(t.slope, 2)
    (-1.0, 4.0)
    """
    good = [i for i, e in enumerate(errs) if math.isfinite(e) and e > 0]
    if not good:
        return None, None
    i_min = min(good, key=lambda i: errs[i])
    level = DOMINANCE * errs[i_min]
    left = [i for i in good if i < i_min and errs[i] >= level]
    right = [i for i in good
             if i > i_min and errs[i] >= level and steps[i] <= TRUNCATION_MAX_STEP]

    def fit(idx: list[int], theory: float) -> Fit | None:
        if len(idx) < MIN_FIT_POINTS:
            return None
        xs, ys = [steps[i] for i in idx], [errs[i] for i in idx]
        return Fit(_slope(xs, ys), theory, min(xs), max(xs), len(idx))

    return fit(left, -1.0), fit(right, float(order))


def measure_curve(spec: KernelSpec, cfg: Config, steps: Sequence[float],
                  stencil: fd.Stencil) -> Curve:
    """The error of the gradient ``cfg.check`` of one kernel at one config for every relative
    step in ``steps``."""
    grad = gradient(spec, cfg)
    errs = []
    for step in steps:
        err = (grad.analytic - grad.fd_at(step)).abs().max()
        errs.append(float(torch.nan_to_num(err, nan=math.inf)))
    rounding, truncation = fit_slopes(steps, errs, stencil.order)
    op = ROWS[cfg.op]
    if op.gradient_checks[cfg.check] not in op.inputs:  # y is linear in γ and β: no truncation
        truncation = None
    return Curve(spec.name, cfg.control, cfg.zero_centered_gamma, list(steps), errs,
                 float(grad.analytic.abs().max()), rounding, truncation,
                 op.offset_param is not None)


def plot_op(kernels: Sequence[KernelSpec], check: str = "dx") -> Op:
    """The one op every kernel computes, if it has the gradient ``check``; else a
    ``ValueError`` that says why (``h/ℓ`` means another ``ℓ`` for each op)."""
    ops = list(dict.fromkeys(spec.op for spec in kernels)) or ["rms_norm"]
    if len(ops) > 1:
        raise ValueError("plot one op at a time (h/ℓ means another ℓ for each): "
                         + ", ".join(f"{s.name} is {s.op}" for s in kernels))
    if ops[0] not in ROWS:
        raise ValueError(f"plot draws the norm family's ops; {ops[0]} is an op of any shape, "
                         "whose steps are planned per colour: `gradcheck-bi run` checks it")
    op = ROWS[ops[0]]
    if check not in op.gradient_checks:
        raise ValueError(f"{op.name} has no {check}: its gradients are "
                         f"{', '.join(op.gradient_checks)}")
    return op


def point_config(spec: KernelSpec, check: str, **fields: Any) -> Config:
    """The point of ``spec``'s op where the plot measures ``check``: each field only some
    ops have at the value a point that leaves it unset takes (:meth:`~gradcheck_bi.ops.
    fields.PointAxis.unset_at`: a gated norm's group the whole row, normalised before the
    gate; a β randn), and none of a parameter the kernel does not take (``spec.fixed``)."""
    op, cfg = ROWS[spec.op], Config(check=check, op=spec.op, **fields)
    absent = {a.field for p in op.params if p.name in dict(spec.fixed) for a in p.axes}
    own: dict[str, Any] = {a.field: None if a.field in absent else a.unset_at(cfg.shape[-1])
                           for a in op.point_axes if a.json == "op"}
    return replace(cfg, **own)


def step_sweep(
    kernels: Sequence[KernelSpec],
    weights: Sequence[str] = ("randn", "ones"),
    zcg: Sequence[bool] = (False,),
    device: str = "cpu",
    dtype: str = "fp64",
    shape: tuple[int, ...] = (2, 8, 256),
    eps: float = 1e-6,
    seed: int = 0,
    stencil: str = "central-4",
    steps: Sequence[float] | None = None,
    max_memory: int | None = None,
    check: str = "dx",
) -> StepSweep:
    """Sweep the step for every kernel × zcg × γ control; raises ``Unsupported`` where it can't.

    ``check`` is the gradient plotted (``dx``, or any other the kernels' op has); every
    kernel must compute the same op (a ``ValueError`` otherwise). Data are drawn exactly as
    ``run`` draws them (:func:`gradcheck_bi.checks.rows.point.make_point`), so a curve's
    point at ``run_step_rel`` is the error ``run`` reports for the same options.
    """
    if dtype in HALF_DTYPES:
        raise Unsupported(f"finite differences of a {dtype} forward sit on a noise floor near "
                          "1e-1; plot fp32 or fp64")
    if stencil not in fd.STENCILS:
        raise ValueError(f"unknown stencil {stencil!r}: expected one of {', '.join(fd.STENCILS)}")
    op = plot_op(kernels, check)
    st = fd.STENCILS[stencil]
    steps = list(steps) if steps is not None else default_steps(dtype)
    if not steps or any(not (math.isfinite(s) and s > 0) for s in steps):
        raise ValueError("steps must be finite numbers > 0")
    points = [(spec, point_config(spec, check, device=device, dtype=dtype, shape=tuple(shape),
                                  eps=eps, seed=seed, control=weight, zero_centered_gamma=z,
                                  stencil=stencil, max_memory=max_memory))
              for z in zcg for spec in kernels for weight in weights]
    name = op.gradient_checks[check]
    torch_dtype = Config(check=check, dtype=dtype).torch_dtype
    out = StepSweep(device, dtype, tuple(shape), eps, seed, st,
                    input_step_rel(torch_dtype) if name in op.inputs else WEIGHT_STEP_REL,
                    unit_roundoff(torch_dtype), check=check, op=op.name,
                    scale=step_scale_text(op, name))
    for spec in kernels:
        at = point_config(spec, "dx", shape=tuple(shape))
        refused = probe(spec, device, dtype, replace(at, check="forward"))
        if refused is not None:
            raise Unsupported(f"{spec.name}: {refused}")
    for spec, cfg in points:
        out.curves.append(measure_curve(spec, cfg, steps, st))
    return out


def step_scale_text(op: Op, name: str) -> str:
    """What ``ℓ`` is when ``name`` is perturbed (the axis label says it)."""
    if name not in op.inputs:
        return f"max(1, max|{name}|)"  # fd.weight_step
    return ROW_LENGTH if op.name == "rms_norm" else f"run's step scale for {name}, per row"


def to_json(sweep: StepSweep) -> str:
    """The numbers behind the plot; byte-identical for the same arguments."""
    return json.dumps(sweep.to_dict(), indent=2) + "\n"
