"""The ops a kernel can compute, each described once in its own module.

An op's module (``gradcheck_bi/ops/<name>.py``) defines ``OP``, one
:class:`~gradcheck_bi.ops.shaped.ShapedOp` whatever the op's shape: its tensors by named
axes (inputs, parameters, integer targets, outputs, scalars included), its options and
controls as sweep axes, how it draws a point, its fp64 reference, and what each output
element depends on. The package finds every module (:func:`discover`): a new op is its
module, nothing else. ``gradcheck-bi ops`` prints the records.

A norm's record carries its hand-written row plan too (``OP.rows``, an
:class:`~gradcheck_bi.ops.record.Op`): the row engine (:mod:`gradcheck_bi.checks.rows`)
checks those ops with it — a step and a measured noise per row, rounding models tighter than
the derived one and cross-checked against it. Every other op is checked by the shaped engine
(:mod:`gradcheck_bi.checks.shaped`) from its record alone.

Controls mean the same in every norm: the γ control (randn | ones | zeros) is on the
*effective* weight (under zero_centered_gamma the stored parameter is γ − 1), so γ = ones is
blind to a defect multiplied by γ − 1, or by γ where no γ belongs; the β control is randn |
zeros. Each other op names its own blind controls (its axes' ``blind`` values).

>>> ROWS["fused_add_rms_norm"].checks
('forward', 'dx', 'dresidual', 'dw', 'batch_invariance')
>>> ROWS["layer_norm"].param("bias").controls
('randn', 'zeros')
>>> OPS["layer_norm"].rows is ROWS["layer_norm"], OPS["gemm"].rows is None
(True, True)
"""

from __future__ import annotations

from gradcheck_bi.ops.record import BIAS_CONTROLS, Op, Param
from gradcheck_bi.ops.shaped import ShapedOp

# The op a kernel computes when nothing in its signature marks another.
DEFAULT_OP = "rms_norm"


def discover() -> dict[str, ShapedOp]:
    """Every op: each module of this package whose ``OP`` is a
    :class:`~gradcheck_bi.ops.shaped.ShapedOp` (a new op is its module, nothing else); the
    row engine's first (the default op, then by name), then the others by name."""
    import importlib
    import pkgutil

    found = [op for info in pkgutil.iter_modules(__path__)
             if isinstance(op := getattr(importlib.import_module(f"{__name__}.{info.name}"),
                                         "OP", None), ShapedOp)]
    found.sort(key=lambda op: (op.rows is None, op.name != DEFAULT_OP, op.name))
    return {op.name: op for op in found}


# Every op's one record.
OPS: dict[str, ShapedOp] = discover()
# The row plans of the ops the row engine checks (the norms), by name.
ROWS: dict[str, Op] = {name: op.rows for name, op in OPS.items() if op.rows is not None}
# The ops the shaped engine checks: every other, and a generic check's op once a run
# registers it (gradcheck_bi.generic).
SHAPED: dict[str, ShapedOp] = {name: op for name, op in OPS.items() if op.rows is None}
# Every check name any op has, in the order tables list them: the row ops' inputs', then
# their parameters', then the other ops'.
ALL_CHECKS = tuple(dict.fromkeys(("forward",
              *dict.fromkeys(f"d{i}" for op in ROWS.values() for i in op.inputs),
              *dict.fromkeys(p.check for op in ROWS.values() for p in op.params),
              *dict.fromkeys(c for op in SHAPED.values() for c in op.gradient_checks),
              "batch_invariance")))


def op_named(name: str) -> Op:
    """The row plan of the op called ``name``; a ``KeyError`` naming the row ops otherwise."""
    try:
        return ROWS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}: expected one of {', '.join(ROWS)}") from None


__all__ = ["ALL_CHECKS", "BIAS_CONTROLS", "DEFAULT_OP", "OPS", "ROWS", "SHAPED", "Op", "Param",
           "ShapedOp", "discover", "op_named"]
