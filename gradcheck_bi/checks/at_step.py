"""One gradient of one point, as ``run`` measures it, with its finite-difference step free.

``gradcheck-bi plot`` (:mod:`gradcheck_bi.stepsweep`) sweeps the step of the estimate that a
gradient check compares the kernel's analytic gradient with. Each op is measured by its
engine, as :func:`gradcheck_bi.checks.run_check` dispatches it: RMSNorm's
(:mod:`.gradients`: :func:`gradcheck_bi.fd.input_grad` for dx, ``fd.weight_grad`` for dw)
and the family's (:mod:`.family.gradients`: every output against its cotangent). Both read
the point the family builds (:func:`.family.point.make_point`: for RMSNorm the ``x``, ``γ``
and ``g`` of :func:`gradcheck_bi.inputs.make_inputs`), so at run's step the estimate is
run's, bit for bit. (RMSNorm keeps its own estimator: the family's rescales each level by
the step it took, and its bits differ.)

>>> from gradcheck_bi.kernels.registry import resolve
>>> from gradcheck_bi.vocab import Config
>>> g = gradient(resolve("after"), Config(check="dw", shape=(2, 16)))
>>> float((g.analytic - g.fd_at(0.5)).abs().max()) < 1e-12
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks.family.gradients import estimate
from gradcheck_bi.checks.family.point import OpPoint, make_point
from gradcheck_bi.kernels.call import analytic_grads, forward_in_w, forward_in_x
from gradcheck_bi.kernels.opcall import op_grads
from gradcheck_bi.vocab import Config, KernelSpec


@dataclass(frozen=True)
class Gradient:
    """One gradient of one point as ``run`` measures it: the kernel's analytic value (fp64),
    and the finite-difference estimate of its own forward at a relative step."""

    analytic: torch.Tensor
    fd_at: Callable[[float], torch.Tensor]


def gradient(spec: KernelSpec, cfg: Config) -> Gradient:
    """The gradient ``cfg.check`` of ``spec`` at the point ``cfg``, by run's engine for the op."""
    point = make_point(cfg)  # an RMSNorm point too: the x, γ and g of make_inputs
    name = point.op.gradient_checks[cfg.check]
    stencil = fd.STENCILS[cfg.stencil]
    if not spec.family:  # RMSNorm's engine: its estimator, bit for bit as run's
        return _rms_norm_gradient(spec.fn, point, name, cfg, stencil)
    outs, grads = op_grads(spec.fn, point.inputs, point.params, point.cotangents,
                           point.options, point.zcg)
    returned = list(outs)
    return Gradient(grads[name].to(torch.float64),
                    lambda step: estimate(spec.fn, point, name, returned, cfg, step).grad)


def _rms_norm_gradient(fn: Any, point: OpPoint, name: str, cfg: Config, stencil: fd.Stencil
                       ) -> Gradient:
    """As :func:`gradcheck_bi.checks.check_dx` and ``check_dw`` measure it."""
    x, w, g = point.inputs["x"], point.params["weight"], point.cotangents["y"]
    _, dx, dw = analytic_grads(fn, x, w, g, cfg.eps, cfg.zero_centered_gamma)
    if name == "x":
        fwd = forward_in_x(fn, w, cfg.eps, cfg.zero_centered_gamma)
        return Gradient(dx.to(torch.float64), lambda step: fd.input_grad(
            fwd, x, g, cfg.eps, stencil, step, cfg.max_memory).grad)
    fwd_w = forward_in_w(fn, x, cfg.eps, cfg.zero_centered_gamma)
    return Gradient(dw.to(torch.float64),
                    lambda step: fd.weight_grad(fwd_w, w, x, g, stencil, step).grad)
