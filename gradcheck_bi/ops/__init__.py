"""The norm family, each op described once: what it takes, what it returns, how it is checked.

An :class:`Op` is data and a few small functions (no class hierarchy), in the spirit of
PyTorch's OpInfo: its **inputs** shaped like ``x`` (each gets a gradient check ``d<name>``),
its **parameters** shaped ``(D,)`` with their controls (each gets ``dw`` or ``dbias``),
its **options**, its **outputs** (each gets a random cotangent), its **fp64 reference**
(:mod:`.references`) and the **roles** a kernel's parameters must fill for it
(:mod:`.names` says which parameter names fill which role).

======================  ==========================================  =====================
op                      call                                        outputs
======================  ==========================================  =====================
rms_norm                (x, weight, eps[, zcg])                     y
fused_add_rms_norm      (x, residual, weight, eps[, zcg])           (y, residual_out)
layer_norm              (x, weight, bias, eps[, zcg])               y
rms_norm_gated          (x, z, weight, eps, group_size,             y
                        norm_before_gate[, zcg])
======================  ==========================================  =====================

Controls mean the same in every op: the γ control (randn | ones | zeros) is on the
*effective* weight (under zero_centered_gamma the stored parameter is γ − 1), so γ = ones is
blind to a defect multiplied by γ − 1, or by γ where no γ belongs; the β control is randn |
zeros. ``rms_norm`` is checked by the RMSNorm engine (:mod:`gradcheck_bi.checks`), the
others by the family engine (:mod:`gradcheck_bi.checks.family`); both read this record.

>>> OPS["fused_add_rms_norm"].checks
('forward', 'dx', 'dresidual', 'dw', 'batch_invariance')
>>> OPS["layer_norm"].param("bias").controls
('randn', 'zeros')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi.ops import references
from gradcheck_bi.vocab import CONTROLS

BIAS_CONTROLS = ("randn", "zeros")


@dataclass(frozen=True)
class Param:
    """A ``(D,)`` parameter: its name, the name of its gradient check and its controls.

    ``offset``: under zero_centered_gamma the stored parameter is ``effective − 1``.
    """

    name: str
    check: str
    controls: tuple[str, ...]
    offset: bool = False


@dataclass(frozen=True)
class Op:
    """One op of the family. ``reference(inputs, params, options)`` maps fp64 tensors by
    name (params effective: γ, not γ − 1) to the fp64 outputs by name."""

    name: str
    summary: str
    inputs: tuple[str, ...]
    params: tuple[Param, ...]
    options: tuple[str, ...]
    outputs: tuple[str, ...]
    reference: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]],
                        dict[str, torch.Tensor]]
    # Roles a kernel must have for this op, and roles whose presence selects it
    # (kernels/recognise.py): a required ``residual`` means fused add, and so on.
    needs: tuple[str, ...]
    marks: tuple[str, ...] = ()
    # Marks that select the op even when the parameter has a default (group_size).
    optional_marks: tuple[str, ...] = ()
    # Inputs not scaled by a point's input_scale (a gate is not a signal).
    unscaled: tuple[str, ...] = ()

    @property
    def checks(self) -> tuple[str, ...]:
        """``forward``, ``d<input>`` per input, the parameters' checks, ``batch_invariance``."""
        return ("forward", *(f"d{i}" for i in self.inputs),
                *(p.check for p in self.params), "batch_invariance")

    @property
    def gradient_checks(self) -> dict[str, str]:
        """``{check: tensor name}`` for every gradient check (``dx`` → ``x``, ``dw`` →
        ``weight``)."""
        out = {f"d{i}": i for i in self.inputs}
        out.update({p.check: p.name for p in self.params})
        return out

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def has(self, name: str) -> bool:
        """Whether the op takes a parameter or option of this name (``bias``,
        ``group_size``)."""
        return name in self.options or any(p.name == name for p in self.params)


WEIGHT = Param("weight", "dw", CONTROLS, offset=True)
BIAS = Param("bias", "dbias", BIAS_CONTROLS)

RMS_NORM = Op(
    "rms_norm", "y = x · rsqrt(mean(x²) + eps) · γ",
    inputs=("x",), params=(WEIGHT,), options=("eps",), outputs=("y",),
    reference=references.rms_norm, needs=("x", "weight", "eps"))
FUSED_ADD_RMS_NORM = Op(
    "fused_add_rms_norm",
    "residual_out = x + residual; y = rms_norm(residual_out) · γ (a kernel may return y "
    "alone)",
    inputs=("x", "residual"), params=(WEIGHT,), options=("eps",),
    outputs=("y", "residual_out"), reference=references.fused_add_rms_norm,
    needs=("x", "residual", "weight", "eps"), marks=("residual",))
LAYER_NORM = Op(
    "layer_norm", "y = (x − mean(x)) · rsqrt(var(x) + eps) · γ + β",
    inputs=("x",), params=(WEIGHT, BIAS), options=("eps",), outputs=("y",),
    reference=references.layer_norm, needs=("x", "weight", "bias", "eps"), marks=("bias",))
RMS_NORM_GATED = Op(
    "rms_norm_gated",
    "statistic over groups of group_size features; norm_before_gate: y = norm(x)·γ·silu(z), "
    "else y = norm(x·silu(z))·γ",
    inputs=("x", "z"), params=(WEIGHT,), options=("eps", "group_size", "norm_before_gate"),
    outputs=("y",), reference=references.rms_norm_gated, needs=("x", "z", "weight", "eps"),
    marks=("z",), optional_marks=("group_size", "norm_before_gate"), unscaled=("z",))

OPS: dict[str, Op] = {op.name: op for op in (RMS_NORM, FUSED_ADD_RMS_NORM, LAYER_NORM,
                                             RMS_NORM_GATED)}
# Every check name any op has, in the order tables list them.
ALL_CHECKS = ("forward", "dx", "dresidual", "dz", "dw", "dbias", "batch_invariance")
assert all(set(op.checks) <= set(ALL_CHECKS) for op in OPS.values())


def op_named(name: str) -> Op:
    """The op called ``name``; a ``KeyError`` naming the ops there are otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}: expected one of {', '.join(OPS)}") from None


__all__ = ["ALL_CHECKS", "BIAS_CONTROLS", "OPS", "Op", "Param", "op_named"]
