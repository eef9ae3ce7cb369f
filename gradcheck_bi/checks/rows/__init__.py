"""The checks of a row op — inputs that share rows, an output that is a statistic over each
row, hand-written rounding models (RMSNorm, fused add, layer norm, gated norm) — driven by
the op's record (:class:`gradcheck_bi.ops.record.Op`): ``forward`` (every output vs
the fp64 reference, the training forward bitwise, the precision delivered), ``d<input>``
and ``d<parameter>`` (every gradient vs finite differences of the kernel's own forward,
random cotangents on every output; an input's with ``--mode directional``: random
projections, :mod:`.directional`), ``batch_invariance`` (every output and input gradient,
bitwise).

fp64 and fp32 hold each output and gradient to its own dtype's floor. bf16/fp16: the
forward audits every output in ulps against the exact fp64 reference
(:mod:`gradcheck_bi.lowp`), each element allowed ``MAX_ULP_THRESHOLD`` ulps plus its fp32
arithmetic (:func:`gradcheck_bi.tolerance.rows.compute_bound`: the statistic, the add of
``residual_out``, the layer norm's mean and β, the gate's silu); every gradient is *lifted*
(:mod:`.lift`, :mod:`.lifted`): the kernel's half-precision backward against finite
differences of its own forward in fp64 at the same inputs, within ½ ulp plus the op's fp32
rounding model. The fused add has two correct references in low precision — ``s = x +
residual`` as computed, or as stored (rounded once, what Liger and vLLM normalise) — and
passes against either. Batch invariance is bitwise in every dtype. The other checks run in
every memory layout (:func:`gradcheck_bi.kernels.calling.opcall.laid_out`); batch invariance on
contiguous tensors.
"""

from __future__ import annotations

from typing import Any

from gradcheck_bi.checks.rows.batch import check_op_batch_invariance
from gradcheck_bi.checks.rows.forward import check_op_forward
from gradcheck_bi.checks.rows.gradients import check_op_gradient
from gradcheck_bi.checks.rows.lifted import check_op_gradient_lifted
from gradcheck_bi.checks.rows.point import exact_grads, make_point, reference
from gradcheck_bi.kernels.calling.opcall import laid_out
from gradcheck_bi.vocab import HALF_DTYPES, Config, Measurement


def run_op_check(fn: Any, cfg: Config) -> Measurement:
    """The check ``cfg.check`` of ``cfg.op`` on ``fn`` (an ``OpAdapted``)."""
    if cfg.check == "batch_invariance":  # builds batches of its own: contiguous
        return check_op_batch_invariance(fn, cfg)
    with laid_out(cfg.layout):
        if cfg.check == "forward":
            return check_op_forward(fn, cfg)
        if cfg.dtype in HALF_DTYPES:
            return check_op_gradient_lifted(fn, cfg)
        return check_op_gradient(fn, cfg)


__all__ = ["check_op_batch_invariance", "check_op_forward", "check_op_gradient",
           "check_op_gradient_lifted", "exact_grads", "make_point", "reference", "run_op_check"]
