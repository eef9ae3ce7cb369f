"""Finite-difference error against step size: the measurement behind ``gradcheck-bi plot``.

For ``L = Σ g·y`` and the kernel's analytic ``dx``, sweep the finite-difference step and record
``max |analytic dx − FD dx|``. With a stencil of order ``p`` (2 or 4) and unit roundoff ``u``:

    error(h) ≈ C_round · u / h  +  C_trunc · h^p

so a correct backward traces a V on log-log axes — slope −1 where rounding dominates (small
``h``), slope ``p`` where truncation does (large ``h``), the bottom near ``h* ~ u^(1/(p+1))``,
which is where ``run`` puts its step (:data:`gradcheck_bi.fd.STEP_REL`). A defective backward
sits on a plateau: the error is the defect, and no step moves it.

The abscissa is the *relative* step ``h/ℓ`` with ``ℓ = sqrt(Σx² + D·eps)`` per row, the same
``step_rel`` that :func:`gradcheck_bi.fd.input_grad` takes. Steps go by powers of two: each
row's step is rounded to one anyway, so finer sampling would only repeat points.

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
from gradcheck_bi.checks.probe import probe
from gradcheck_bi.fd.step import input_step_rel
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import analytic_grads, forward_in_x
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

    @property
    def label(self) -> str:
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

    @property
    def reference_floor(self) -> float:
        """``u^(2/3)``: the best a central-2 difference can do at unit scale."""
        return self.unit_roundoff ** (2 / 3)

    @property
    def title(self) -> str:
        shape = "×".join(str(d) for d in self.shape)
        kernels = ", ".join(dict.fromkeys(c.kernel for c in self.curves))
        return (f"dx finite-difference error vs step — {kernels} · {self.device}/{self.dtype}"
                f" · shape {shape} · {self.stencil.name}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "gradcheck-bi",
            "version": __version__,
            "plot": "dx error against relative step h/ℓ",
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
    """The dx error of one kernel at one config for every relative step in ``steps``."""
    x, w, g = make_inputs(cfg)
    _, dx, _ = analytic_grads(spec.fn, x, w, g, cfg.eps, cfg.zero_centered_gamma)
    dx64 = dx.to(torch.float64)
    errs = []
    for step in steps:
        est = fd.input_grad(
            forward_in_x(spec.fn, w, cfg.eps, cfg.zero_centered_gamma), x, g,
            cfg.eps, stencil, step, cfg.max_memory)
        err = (dx64 - est.grad).abs().max()
        errs.append(float(torch.nan_to_num(err, nan=math.inf)))
    rounding, truncation = fit_slopes(steps, errs, stencil.order)
    return Curve(spec.name, cfg.control, cfg.zero_centered_gamma, list(steps), errs,
                 float(dx64.abs().max()), rounding, truncation)


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
) -> StepSweep:
    """Sweep the step for every kernel × zcg × γ control; raises ``Unsupported`` where it can't.

    Data are drawn exactly as ``run`` draws them (:func:`gradcheck_bi.inputs.make_inputs`), so
    a curve's point at ``run_step_rel`` is the error ``run`` reports for the same options.
    """
    if dtype in HALF_DTYPES:
        raise Unsupported(f"finite differences of a {dtype} forward sit on a noise floor near "
                          "1e-1; plot fp32 or fp64")
    if stencil not in fd.STENCILS:
        raise ValueError(f"unknown stencil {stencil!r}: expected one of {', '.join(fd.STENCILS)}")
    st = fd.STENCILS[stencil]
    steps = list(steps) if steps is not None else default_steps(dtype)
    if not steps or any(not (math.isfinite(s) and s > 0) for s in steps):
        raise ValueError("steps must be finite numbers > 0")
    torch_dtype = Config(check="dx", dtype=dtype).torch_dtype
    out = StepSweep(device, dtype, tuple(shape), eps, seed, st,
                    input_step_rel(torch_dtype), unit_roundoff(torch_dtype))
    for spec in kernels:
        refused = probe(spec, device, dtype, Config(check="forward", shape=tuple(shape)))
        if refused is not None:
            raise Unsupported(f"{spec.name}: {refused}")
    for z in zcg:
        for spec in kernels:
            for weight in weights:
                cfg = Config(check="dx", device=device, dtype=dtype, shape=tuple(shape), eps=eps,
                             seed=seed, control=weight, zero_centered_gamma=z, stencil=stencil)
                if max_memory is not None:  # else run's default budget
                    cfg = replace(cfg, max_memory=max_memory)
                out.curves.append(measure_curve(spec, cfg, steps, st))
    return out


def to_json(sweep: StepSweep) -> str:
    """The numbers behind the plot; byte-identical for the same arguments."""
    return json.dumps(sweep.to_dict(), indent=2) + "\n"
