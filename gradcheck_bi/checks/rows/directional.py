"""``--mode directional`` for an input gradient: projections on random directions per row.

The kernel's ``d<input>`` is projected on ``cfg.directions`` random unit directions per row
and compared with central differences of its own forward along each
(:func:`gradcheck_bi.fd.directional_input_grad`: ``stencil.points × directions`` rows of
forward calls instead of ``stencil.points × D``), every output the kernel returns against
its own cotangent, side by side in one row. The step is run's (the op's ``step_scale``);
each element's rounding (the op's model, :func:`gradcheck_bi.tolerance.rows.kernel_sigma`)
is added along the direction without cancellation (a bound). No single element is checked:
an error orthogonal to every direction drawn goes unseen, and the details say so.

The noise model is the row's: it holds where the input moves every element of every output
of its row (``Op.reach`` the whole row). An input that moves only part of a row (the gated
norm's ``z`` before the norm, the fused add's ``residual_out``, an elementwise op) is not
checked this way: ``unsupported``, with the full mode named.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks._measure import nonfinite_notes
from gradcheck_bi.checks.fd_judge import fd_verdict, rounding_scale
from gradcheck_bi.checks.rows.point import ExactGrads, OpPoint, input_forward
from gradcheck_bi.checks.rows.step_choice import step_rel_of
from gradcheck_bi.fd.step import input_step_rel, pow2
from gradcheck_bi.sums.reduction import row_sum
from gradcheck_bi.tolerance.rows import kernel_sigma
from gradcheck_bi.vocab import Config, Measurement, Unsupported


def _side_by_side(fn: Any, point: OpPoint, name: str, returned: list[str]) -> Any:
    """The op's outputs (:func:`.point.input_forward`) as one row each, side by side."""
    outputs = input_forward(fn, point, name, returned)
    return lambda t2: torch.cat(outputs(t2), -1)


def check_directional(fn: Any, cfg: Config, point: OpPoint, name: str, returned: list[str],
                      analytic: torch.Tensor) -> Measurement:
    """``⟨d<name>, v⟩`` vs central differences along ``cfg.directions`` random unit ``v`` per
    row; the worst index is ``[direction, *row]``."""
    t = point.inputs[name]
    widths = [point.cotangents[o].shape[-1] for o in returned]
    if [point.op.reach(point, name, o) for o in returned] != widths:
        raise Unsupported(f"--mode directional checks an input that moves its whole row; "
                          f"d{name} of {point.op.name} moves part of one: run --mode full")
    rel = input_step_rel(t.dtype, step_rel_of(cfg))
    h = pow2(rel * point.op.step_scale(point, name))
    g = torch.cat([point.cotangents[o] for o in returned], -1)
    try:
        est = fd.directional_input_grad(
            _side_by_side(fn, point, name, returned), t, g, point.options.get("eps", 0.0),
            cfg.directions, cfg.seed, fd.STENCILS[cfg.stencil], None, cfg.max_memory, h=h)
    except fd.MemoryBudgetError as exc:  # the budget, not the kernel: not run
        raise Unsupported(str(exc)) from None
    projected = row_sum(analytic.to(torch.float64).unsqueeze(0) * est.directions)
    err = (projected - est.projection).abs()
    sigma = (rounding_scale(est, t, cfg.working_precision)
             * kernel_sigma(point, name, ExactGrads(point)))
    rounding = row_sum(est.directions.abs() * sigma.unsqueeze(0))
    details = {
        "mode": "directional",
        "directions": cfg.directions,
        "projections_checked": int(est.projection.numel()),
        "coverage": f"d{name} projected on {cfg.directions} random unit direction(s) per "
                    f"row; individual d{name} elements were not checked",
    }
    notes = nonfinite_notes((f"analytic {cfg.check}", analytic),
                            ("finite-difference projection", est.projection))
    return fd_verdict(err, est, est.projection, rounding, cfg, notes, details)
