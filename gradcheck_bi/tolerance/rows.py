"""The tolerances of the row ops (inputs that share rows, hand-written rounding models),
written once against the op's record.

The template is RMSNorm's (:mod:`.summation`); everything is computed from the point's inputs,
cotangents and *exact* fp64 gradients (autograd through the reference), never from the
backward under test. What differs between ops — the statistic's terms, the further roundings
per element, a rounding every element of a row shares, the rounding of each gradient — is
the op's (:mod:`gradcheck_bi.ops`), written with the primitives of :mod:`.summation`.

**Forward** (:func:`forward_tolerances`): each output is held to ``max(|ref − β| + |β|) ·
(u_out + u_c · factor)`` (β: its part of the output; ``max|ref|`` without β), RMSNorm's
:func:`~.summation.forward_factor` over the statistic's ``n`` terms with the op's extra
roundings per element inside the root (``Op.forward_extra``), plus the op's shared rounding
(``Op.shift``: a layer norm's mean). An output that is one addition of
inputs (``Op.added``: ``residual_out``) is ``max|ref| · (u_out + u_c)``.

**The kernel's own rounding** (:func:`kernel_sigma`): per element of a gradient, the RMS of
the rounding a correct kernel may make in any summation order, in units of ``u`` (the checks
scale it by ``max(λ, 1)·u`` and add it in quadrature to the finite difference's noise). An
error ``ε`` of the row statistic is common to every term of a row, each sum over D adds
``V(terms) + OPS_TERM Σ terms²`` (any order, one accumulator), and each product rounds a few
times: the op's ``input_rounding``.

**Parameters** (``dw``, ``dbias``): terms ``g ∂y/∂γ`` (``g`` for β) as the forward makes
them, summed over the rows: RMSNorm's model, :func:`~.summation.dw_sigma` (applied by the
check to ``FDEstimate.terms``).

>>> round(forward_factor(255, 2.0), 1)
32.7
"""

from __future__ import annotations

import torch

from gradcheck_bi.ops.record import Grads, Point
from gradcheck_bi.tolerance import summation
from gradcheck_bi.tolerance.noise import K_SIGMA, unit_roundoff
from gradcheck_bi.tolerance.summation import forward_factor

Tensors = dict[str, torch.Tensor]


def shared_sigma(point: Point) -> torch.Tensor | None:
    """Per row, in ``u``: a rounding every output of the row shares beyond the relative one
    of a statistic ``r`` (which the noise model has), or ``None`` (``Op.shared``)."""
    shared = point.op.shared
    return None if shared is None else shared(point, summation)


def bias_part(point: Point) -> tuple[torch.Tensor, bool]:
    """β's part of the outputs (fp64; 0 without β: the parameter added last,
    ``Param.added_last``) and whether the op rounds it further after adding it
    (``Op.bias_term``: a gated norm's ``β·act(z)`` before the gate)."""
    rounded = None if point.op.bias_term is None else point.op.bias_term(point)
    if rounded is not None:
        return rounded, True
    beta = point.op.added_last(point.effective)
    return (torch.zeros((), dtype=torch.float64) if beta is None else beta), False


def _largest(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def _shift(point: Point, k: float) -> float:
    return 0.0 if point.op.shift is None else point.op.shift(point, k, summation)


def forward_tolerances(point: Point, ref: Tensors, u_out: float, u_c: float
                       ) -> dict[str, float]:
    """The absolute tolerance of each output in ``ref`` (output dtype's ``u_out``, compute
    dtype's ``u_c``)."""
    op, out = point.op, {}
    beta, _ = bias_part(point)
    for name, r in ref.items():
        if name in op.added:
            out[name] = _largest(r.abs()) * (u_out + u_c)
            continue
        # The size of the terms y is made of, |y − β| + |β|: where β cancels n γ, a correct
        # kernel still rounds n γ and the add relative to them, not to the tiny y.
        out[name] = _largest((r - beta).abs() + beta.abs()) * (
            u_out + u_c * forward_factor(op.forward_terms(point), op.forward_extra))
        if op.shift is not None:
            out[name] += _shift(point, K_SIGMA * u_c)
    return out


def compute_bound(point: Point, name: str, ref: torch.Tensor, u_c: float) -> torch.Tensor:
    """Per element of output ``name`` (fp64, absolute): how far a correct kernel's value in
    the compute dtype (``u_c``) may be from the exact one before its one rounding to the
    output dtype — :func:`forward_tolerances`'s model per element: ``u_c (factor |y − β| +
    |β|)`` (β: its part of ``y``, :func:`bias_part`; the statistic, the op's extra
    roundings; β added last, so an element where ``n γ`` and β nearly cancel is not held to
    the ulp of its tiny value; where β's part is rounded after the add too, a gate after it,
    ``|β|`` counts the op's roundings per element, ``forward_factor(0, extra)``), the op's
    shared rounding, and for an added output
    one addition ``u_c |s|``. The bf16/fp16 forward adds it to each element's ulp
    threshold."""
    op = point.op
    if name in op.added:
        return u_c * ref.abs()
    beta, rounded_after = bias_part(point)
    factor = forward_factor(op.forward_terms(point), op.forward_extra)
    # β added last: its add's one rounding; β's part rounded further (a gate after it): the
    # op's roundings per element (its own, OPS_RSQRT and OPS_SCALE covering the add), not
    # the statistic's
    beta_factor = forward_factor(0, op.forward_extra) if rounded_after else 1.0
    bound = u_c * (factor * (ref - beta).abs() + beta_factor * beta.abs()
                   + _offset_moves(point, name, u_c))
    if op.shift is not None:
        bound = bound + _shift(point, K_SIGMA * u_c)
    return bound


def _offset_moves(point: Point, name: str, u_c: float) -> torch.Tensor | float:
    """Per element of output ``name``, per unit ``u``: how far the rounding of the stored
    weight moves it. In γ's zero-centred mode a kernel forms ``γ = 1 + w`` from the stored
    ``w``, off by up to ``u |w|``; where γ is near 0 (``w`` near −1) that is many times the
    ``u |γ|`` of the product by γ that ``factor`` counts (Gemma's fp32 ``1 + w`` at γ = 0.008
    moves y by ~120 u |y|). Every row op is affine in γ column by column, so the
    output moves by ``|y(γ + |w|) − y(γ)|``. Only where ``w`` is rounded on its way in: the
    compute precision ``u_c`` coarser than the stored dtype's (a bf16 ``w`` is exact in fp32)."""
    offset = point.op.offset_param  # γ, stored as w = γ − 1
    if not point.zcg or offset is None or offset.name not in point.effective:
        return 0.0
    stored = next(iter(point.inputs.values())).dtype
    if u_c <= unit_roundoff(stored):
        return 0.0
    params, gamma = point.effective, point.effective[offset.name]
    moved = {**params, offset.name: gamma + (gamma - 1.0).abs()}
    reference = point.op.reference
    return (reference(point.inputs64, moved, point.options)[name]
            - reference(point.inputs64, params, point.options)[name]).abs()


def kernel_sigma(point: Point, name: str, exact: Grads) -> torch.Tensor:
    """Per element of ``d<name>`` (an input), the RMS of a correct kernel's own rounding, in
    ``u``; ``exact``: the point's exact fp64 gradients. A parameter's is RMSNorm's ``dw``
    model on the terms ``g·∂y/∂p`` the forward makes (:func:`~.summation.dw_sigma` of
    ``FDEstimate.terms``)."""
    return point.op.input_rounding(point, name, exact, summation)


def kernel_magnitude(point: Point, name: str) -> torch.Tensor:
    """Per element of ``d<name>`` (an input), the magnitude of the terms that make it (fp64):
    what an error of a few ulps of rsqrt or division scales (the lifted tolerance's ``M``,
    :func:`.half.lifted_tolerance`)."""
    return point.op.input_magnitude(point, name, summation)
