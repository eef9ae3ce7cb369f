"""Every gradient of every op against finite differences of the kernel's own forward.

``d<input>`` (dx, dresidual, dz): the input perturbed one column of every row at once
(:func:`gradcheck_bi.fd.coloured.input_grad_outputs`), the other inputs and the
parameters held, differencing **every output the kernel returns** against its own random
cotangent (a backward that drops ``residual_out``'s cotangent is invisible when that
cotangent is zero). ``d<parameter>`` (dw, dbias): every element of the parameter perturbed
at once (:func:`gradcheck_bi.fd.weight_grad`): output column j depends on parameter element
j alone, and ``y`` is linear in γ and β, so one large step costs no truncation.

Steps, per row: ``h_rel`` (as RMSNorm's, by dtype) times the length over which the output
bends as one element moves (the op's ``step_scale``: the statistic's row length ``sqrt(Σ v²
+ n·eps)`` of what is normalised, the scale of silu for a gate). A power of two.
Tolerance per element as for RMSNorm: the finite difference's measured noise floor and
Richardson truncation, with the kernel's own rounding (:mod:`gradcheck_bi.tolerance.rows`)
in quadrature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks._measure import nonfinite_notes
from gradcheck_bi.checks.fd_judge import Judge, kink_verdict, weight_verdict
from gradcheck_bi.checks.rows.directional import check_directional
from gradcheck_bi.checks.rows.point import (
    ExactGrads,
    OpPoint,
    input_forward,
    make_point,
    returns_y_alone,
)
from gradcheck_bi.checks.rows.step_choice import step_rel_of
from gradcheck_bi.fd.coloured import input_grad_outputs
from gradcheck_bi.fd.refine import refine_elements
from gradcheck_bi.fd.step import WEIGHT_STEP_REL, input_step_rel, pow2
from gradcheck_bi.kernels.calling.opcall import op_forward, op_grads_later
from gradcheck_bi.tolerance.rows import kernel_sigma, shared_sigma
from gradcheck_bi.tolerance.summation import dw_sigma
from gradcheck_bi.vocab import Config, Measurement, Unsupported


def reach(point: OpPoint, name: str, returned: list[str]) -> list[int]:
    """Per returned output, the group of elements one element of ``name`` moves
    (``Op.reach``: the row, the statistic's group, or itself alone)."""
    return [point.op.reach(point, name, o) for o in returned]


def _param_forward(fn: Any, point: OpPoint, name: str
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(p: torch.Tensor) -> torch.Tensor:
        outs = op_forward(fn, point.inputs, {**point.params, name: p}, point.options,
                          point.zcg)
        # the op's first output: the others add inputs (Op.added), which no parameter moves
        return outs[point.op.outputs[0]]

    return forward


def estimate(fn: Any, point: OpPoint, name: str, returned: list[str], cfg: Config,
             step_rel: float | None = None, meanwhile: Callable[[], None] | None = None
             ) -> fd.FDEstimate:
    """Central differences of the kernel's forward at ``point`` (in its dtype) in the input
    or parameter ``name``, every output in ``returned`` against its cotangent.

    ``step_rel``: the relative step (``gradcheck-bi plot`` sweeps it); by default run's,
    ``cfg.step_rel`` or the dtype's for an input, ``WEIGHT_STEP_REL`` for a parameter.
    ``meanwhile``: the caller's host work, run while an input's calls do
    (:func:`~gradcheck_bi.fd.coloured.input_grad_outputs`); after them for a parameter."""
    stencil = fd.STENCILS[cfg.stencil]
    x, first = point.lead, point.op.outputs[0]
    if name in point.op.inputs:
        rel = input_step_rel(x.dtype, step_rel_of(cfg) if step_rel is None else step_rel)
        h = pow2(rel * point.op.step_scale(point, name))
        try:
            return input_grad_outputs(
                input_forward(fn, point, name, returned), point.inputs[name],
                [point.cotangents[o] for o in returned], h, stencil,
                reach(point, name, returned), shared_sigma(point),
                # β, added to the first output last: a part the statistic does not scale
                [point.op.added_last(point.params) if o == first else None for o in returned],
                cfg.max_memory, meanwhile)
        except fd.MemoryBudgetError as exc:  # the budget, not the kernel: not run
            raise Unsupported(str(exc)) from None
    est = fd.weight_grad(_param_forward(fn, point, name), point.params[name], x,
                         point.cotangents[first], stencil,
                         WEIGHT_STEP_REL if step_rel is None else step_rel)
    if meanwhile is not None:
        meanwhile()
    return est


def check_op_gradient(fn: Any, cfg: Config) -> Measurement:
    """``cfg.check`` (``dx``, ``dresidual``, ``dz``, ``dw``, ``dbias``) of ``cfg.op``, fp64
    or fp32 (bf16/fp16: :mod:`.lifted`); an input's with ``--mode directional``:
    :mod:`.directional`."""
    point = make_point(cfg)
    name = point.op.gradient_checks[cfg.check]
    # the outputs' names now (what the finite differences difference), the backward and
    # an input's rounding model while the finite differences' calls run (on a GPU, their
    # host work is no longer the GPU's idle time)
    outs, backward = op_grads_later(fn, point.inputs, point.params, point.cotangents,
                                    point.options, point.zcg)
    returned = list(outs)
    x = point.lead
    if cfg.mode not in ("full", "directional"):
        raise ValueError(f"unknown mode {cfg.mode!r}; expected 'full' or 'directional'")
    if cfg.mode == "directional" and name in point.op.inputs:
        return check_directional(fn, cfg, point, name, returned, backward()[name])
    later: dict[str, Any] = {}

    def meanwhile() -> None:  # no host sync: the backward's write check waits for the calls
        if name in point.op.inputs:
            later["sigma"] = kernel_sigma(point, name, ExactGrads(point))
        later["grads"] = backward.run()

    est = estimate(fn, point, name, returned, cfg, meanwhile=meanwhile)
    backward.check_writes()
    analytic = later["grads"][name]
    notes = nonfinite_notes((f"analytic {cfg.check}", analytic),
                            (f"finite-difference {cfg.check}", est.grad))
    extra: dict[str, Any] = {"outputs": returned, **returns_y_alone(point, returned)}
    if name in point.op.inputs:
        judge = Judge(analytic, later["sigma"], x, cfg, notes, extra)
        return kink_verdict(judge, est, lambda mask: refine_elements(
            input_forward(fn, point, name, returned), point.inputs[name],
            [point.cotangents[o] for o in returned], est.step, mask, est.stencil))
    # the forward's own terms g·∂y/∂p, summed over the rows (RMSNorm's dw model)
    assert est.terms is not None
    return weight_verdict(Judge(analytic, dw_sigma(est.terms), x, cfg, notes, extra),
                          _param_forward(fn, point, name), point.params[name],
                          point.cotangents[point.op.outputs[0]], est,
                          point.op.added_last(point.params))
