"""The checks of the family's other ops (fused add, layer norm, gated norm), driven by the
op's record (:mod:`gradcheck_bi.ops`): ``forward`` (every output vs the fp64 reference),
``d<input>`` and ``d<parameter>`` (every gradient vs finite differences of the kernel's own
forward, random cotangents on every output), ``batch_invariance`` (every output and input
gradient, bitwise). RMSNorm keeps its own engine (:mod:`gradcheck_bi.checks`).

fp64 and fp32, on CPU or CUDA. The bf16/fp16 audit and lifted gradients are not built for
these ops yet: the sweep does not schedule those points (:func:`gradcheck_bi.sweep.grid`)
and says so in a note.
"""

from __future__ import annotations

from typing import Any

from gradcheck_bi.checks.family.batch import check_op_batch_invariance
from gradcheck_bi.checks.family.forward import check_op_forward
from gradcheck_bi.checks.family.gradients import check_op_gradient
from gradcheck_bi.checks.family.point import exact_grads, make_point, reference
from gradcheck_bi.vocab import Config, Measurement


def run_op_check(fn: Any, cfg: Config) -> Measurement:
    """The check ``cfg.check`` of ``cfg.op`` on ``fn`` (an ``OpAdapted``)."""
    if cfg.check == "forward":
        return check_op_forward(fn, cfg)
    if cfg.check == "batch_invariance":
        return check_op_batch_invariance(fn, cfg)
    return check_op_gradient(fn, cfg)


__all__ = ["check_op_batch_invariance", "check_op_forward", "check_op_gradient",
           "exact_grads", "make_point", "reference", "run_op_check"]
