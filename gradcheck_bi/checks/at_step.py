"""One gradient of one point, as ``run`` measures it, with its finite-difference step free.

``gradcheck-bi plot`` (:mod:`gradcheck_bi.stepsweep`) sweeps the step of the estimate that a
gradient check compares the kernel's analytic gradient with. Every op, RMSNorm too, is
measured as :func:`gradcheck_bi.checks.run_check` measures it (:mod:`.rows.gradients`: every
output against its cotangent, at the point :func:`.rows.point.make_point` builds), so at
run's step the estimate is run's, bit for bit.

>>> from gradcheck_bi.kernels.registry import resolve
>>> from gradcheck_bi.vocab import Config
>>> g = gradient(resolve("after"), Config(check="dw", shape=(2, 16)))
>>> float((g.analytic - g.fd_at(0.5)).abs().max()) < 1e-12
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradcheck_bi.checks.rows.gradients import estimate
from gradcheck_bi.checks.rows.point import make_point
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.kernels.calling.opcall import op_grads
from gradcheck_bi.vocab import Config, KernelSpec


@dataclass(frozen=True)
class Gradient:
    """One gradient of one point as ``run`` measures it: the kernel's analytic value (fp64),
    and the finite-difference estimate of its own forward at a relative step."""

    analytic: torch.Tensor
    fd_at: Callable[[float], torch.Tensor]


def gradient(spec: KernelSpec, cfg: Config) -> Gradient:
    """The gradient ``cfg.check`` of ``spec`` at the point ``cfg``, as run measures it."""
    point = make_point(cfg)  # an RMSNorm point too: the x, γ and g of make_inputs
    name = point.op.gradient_checks[cfg.check]
    fn = as_op_kernel(spec.fn)
    outs, grads = op_grads(fn, point.inputs, point.params, point.cotangents,
                           point.options, point.zcg)
    returned = list(outs)
    return Gradient(grads[name].to(torch.float64),
                    lambda step: estimate(fn, point, name, returned, cfg, step).grad)

