"""The ops a kernel can compute, each described once in its own module.

An op's module (``gradcheck_bi/ops/<name>.py``) holds everything that differs between ops —
the roles of its inputs, parameters, options and outputs, its fp64 reference, what each
output element depends on, its step scales, its rounding models, the marks that recognise
it — as one :class:`~gradcheck_bi.ops.record.Op` named ``OP``; :mod:`.record` says what each
field means. Every check, the sweep, the report and the CLI are written once against it. A
new op is a new module and its line in :data:`OPS`; ``gradcheck-bi ops`` prints the records.

Controls mean the same in every op: the γ control (randn | ones | zeros) is on the
*effective* weight (under zero_centered_gamma the stored parameter is γ − 1), so γ = ones is
blind to a defect multiplied by γ − 1, or by γ where no γ belongs; the β control is randn |
zeros. One engine checks every row op, ``rms_norm`` included (:mod:`gradcheck_bi.checks.rows`),
reading nothing about an op but its record.

>>> OPS["fused_add_rms_norm"].checks
('forward', 'dx', 'dresidual', 'dw', 'batch_invariance')
>>> OPS["layer_norm"].param("bias").controls
('randn', 'zeros')
"""

from __future__ import annotations

from gradcheck_bi.ops import (
    fused_add_rms_norm,
    layer_norm,
    rms_norm,
    rms_norm_gated,
)
from gradcheck_bi.ops.record import BIAS_CONTROLS, Op, Param
from gradcheck_bi.ops.shaped import ShapedOp

# The op a kernel computes when nothing in its signature marks another.
DEFAULT_OP = rms_norm.OP.name
OPS: dict[str, Op] = {m.OP.name: m.OP for m in (rms_norm, fused_add_rms_norm, layer_norm,
                                                 rms_norm_gated)}


def discover() -> dict[str, ShapedOp]:
    """Every op of any shape: each module of this package whose ``OP`` is a
    :class:`~gradcheck_bi.ops.shaped.ShapedOp` (a new op is its module, nothing else)."""
    import importlib
    import pkgutil

    found: dict[str, ShapedOp] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        op = getattr(module, "OP", None)
        if isinstance(op, ShapedOp):
            found[op.name] = op
    return found


SHAPED: dict[str, ShapedOp] = discover()
# Every check name any op has, in the order tables list them: the inputs', then the
# parameters'.
ALL_CHECKS = tuple(dict.fromkeys(("forward",
              *dict.fromkeys(f"d{i}" for op in OPS.values() for i in op.inputs),
              *dict.fromkeys(p.check for op in OPS.values() for p in op.params),
              *dict.fromkeys(c for op in SHAPED.values() for c in op.gradient_checks),
              "batch_invariance")))


def op_named(name: str) -> Op:
    """The op called ``name``; a ``KeyError`` naming the ops there are otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}: expected one of {', '.join(OPS)}") from None


__all__ = ["ALL_CHECKS", "BIAS_CONTROLS", "DEFAULT_OP", "OPS", "SHAPED", "Op", "Param", "ShapedOp",
           "discover", "op_named"]
