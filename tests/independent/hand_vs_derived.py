"""The norms' hand-written rounding models beside the one derived from their fp64 references.

At one point of a norm op (:func:`gradcheck_bi.checks.rows.make_point`), per element of
every output and every gradient, two numbers in units of the compute dtype's ``u``:

* **hand**: what the old engine holds a correct kernel's own rounding to, from its own
  functions. Forward (``y``, ``residual_out``): the per-element tolerance ``|y| + compute_bound
  / u`` (:func:`gradcheck_bi.tolerance.rows.compute_bound`: the output's own rounding plus
  the compute dtype's, ``K_SIGMA`` already inside ``forward_factor``), and ``judged``: the
  one number the fp32/fp64 forward check holds every element to
  (:func:`~gradcheck_bi.tolerance.rows.forward_tolerances`, scaled by ``max(|y − β| +
  |β|)``). A
  gradient: the σ of the kernel's rounding, ``kernel_sigma`` for an input, ``dw_sigma`` of
  the terms ``g·∂y/∂p`` for a parameter (the check's ``FDEstimate.terms``, here exact).
* **derived**: :func:`gradcheck_bi.errors.derived` on the op's own fp64 reference
  (``Op.reference``) at the same inputs and cotangents, γ formed from the stored weight
  inside it (``1 + w`` under zero_centered_gamma, as a kernel does). Forward: ``K_SIGMA·σ``
  plus ``α / u`` (what an ops-of-any-shape forward check holds the element to, less its
  2^-60 floor); a gradient: ``σ`` (both gradient models are multiplied by ``K_SIGMA`` in
  their checks, so σ against σ is like against like).

``ratio = hand / derived`` per element (:meth:`Pair.ratio`).

>>> from gradcheck_bi.vocab import Config
>>> got = compare(Config("forward", shape=(3, 16), op="rms_norm"))
>>> sorted(got)
['dw', 'dx', 'y', 'y (judged)']
>>> bool((got["dx"].ratio() > 0).all())
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradcheck_bi.checks.rows import make_point, reference
from gradcheck_bi.checks.rows.point import ExactGrads, OpPoint
from gradcheck_bi.errors import Derived, derived
from gradcheck_bi.tolerance.noise import K_SIGMA, unit_roundoff
from gradcheck_bi.tolerance.rows import compute_bound, forward_tolerances, kernel_sigma
from gradcheck_bi.tolerance.summation import dw_sigma
from gradcheck_bi.vocab import Config


@dataclass
class Pair:
    """Per element, in ``u``: the hand-written model and the derived one."""

    hand: torch.Tensor
    derived: torch.Tensor

    def ratio(self) -> torch.Tensor:
        """``hand / derived`` per element, in the quantity's shape: ``inf`` where only the
        derived is 0, ``nan`` where both are (nothing to compare)."""
        h, d = self.hand, self.derived
        r = torch.where(d > 0, h / torch.where(d > 0, d, 1.0), torch.inf)
        return torch.where((h == 0) & (d == 0), torch.nan, r)


def _derive(point: OpPoint) -> Derived:
    op = point.op
    stored = {n: p.to(torch.float64) for n, p in point.params.items()}

    def fn(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        params = {n: t[n] for n in stored}
        if point.zcg and "weight" in params:
            params["weight"] = params["weight"] + 1.0  # as the kernel forms γ
        return op.reference({n: t[n] for n in op.inputs}, params, point.options)

    dtype = point.lead.dtype
    cots = {k: v.to(torch.float64) for k, v in point.cotangents.items()}
    return derived(fn, {**point.inputs64, **stored}, cots, [*op.inputs, *stored],
                   None if dtype == torch.float64 else dtype)


def _param_terms(point: OpPoint, name: str) -> torch.Tensor:
    """``(rows, D)``: ``g·∂y/∂p`` for parameter ``name`` — what the dw check's forward
    differences measure (``FDEstimate.terms``), exact: ``y``'s column j moves with ``p_j``
    alone, so the derivative along all ones is each column's own."""
    eff = point.effective

    def y_of(p: torch.Tensor) -> torch.Tensor:
        return point.op.reference(point.inputs64, {**eff, name: p}, point.options)[
            point.op.outputs[0]]

    _, dy = torch.func.jvp(y_of, (eff[name],), (torch.ones_like(eff[name]),))
    g = point.cotangents[point.op.outputs[0]].to(torch.float64)
    d = eff[name].shape[-1]
    return (g * dy).reshape(-1, d)


def compare(cfg: Config) -> dict[str, Pair]:
    """Per quantity (output name, ``y (judged)``, ``d<input>``, ``dw``, ``dbias``) at the
    point ``cfg`` (fp64 or fp32): the hand-written and the derived model (module doc)."""
    return compare_at(make_point(cfg))


def compare_at(point: OpPoint) -> dict[str, Pair]:
    """:func:`compare` at a point given by its tensors."""
    op, u = point.op, unit_roundoff(point.lead.dtype)
    ref = reference(point)
    m = _derive(point)
    out: dict[str, Pair] = {}
    judged = forward_tolerances(point, ref, u, u)
    for name, r in ref.items():
        derived_tol = K_SIGMA * m.output_sigma[name] + m.output_absolute[name] / u
        out[name] = Pair(r.abs() + compute_bound(point, name, r, u) / u, derived_tol)
        if name == op.outputs[0]:
            out[f"{name} (judged)"] = Pair(torch.full_like(r, judged[name] / u), derived_tol)
    exact = ExactGrads(point)
    for check, name in op.gradient_checks.items():
        if name in op.inputs:
            hand = kernel_sigma(point, name, exact)
        elif name in point.params:
            hand = dw_sigma(_param_terms(point, name))
        else:
            continue
        out[check] = Pair(hand, m.grad_sigma[name])
    return out
