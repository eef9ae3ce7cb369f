"""The record of one op: what it takes and returns, and how each of its results is judged.

An :class:`Op` holds data and small functions, in the spirit of PyTorch's OpInfo; every
check, the finite differences, the tolerance, the sweep and the CLI are written once
against it (each op is one module, :mod:`gradcheck_bi.ops`). The functions read a
:class:`Point` (the tensors of one point, fp64 views included). The rounding models are
written with the summation primitives that the tolerance layer hands them (:class:`Sums`,
:mod:`gradcheck_bi.tolerance.summation`), so that an op's module stays below the kernels
that compute it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gradcheck_bi.ops.fields import Axis, PointAxis, all_of, boolean, chosen
from gradcheck_bi.vocab import CONTROLS

Tensors = dict[str, torch.Tensor]
# A point's exact fp64 gradients by name: computed when first read (a rounding model that
# does not read them costs no autograd pass through the reference).
Grads = Mapping[str, torch.Tensor]
BIAS_CONTROLS = ("randn", "zeros")


class Point(Protocol):
    """What an op's functions read of a point (:class:`gradcheck_bi.checks.rows.OpPoint`)."""

    @property
    def op(self) -> Op: ...
    @property
    def inputs(self) -> Tensors: ...
    @property
    def inputs64(self) -> Tensors: ...
    @property
    def effective(self) -> Tensors: ...
    @property
    def zcg(self) -> bool: ...
    @property
    def cotangents(self) -> Tensors: ...
    @property
    def options(self) -> dict[str, Any]: ...


class Sums(Protocol):
    """The summation primitives a rounding model is written with (the module
    :mod:`gradcheck_bi.tolerance.summation` is one)."""

    OPS_DIRECT: float
    OPS_TERM: float
    OPS_VARIANCE: float

    def row_sum(self, t: torch.Tensor, backend: str | None = None) -> torch.Tensor: ...
    def any_order_var(self, terms: torch.Tensor) -> torch.Tensor: ...
    def rsigma_var(self, x: torch.Tensor, eps: float) -> torch.Tensor: ...
    def dx_sigma(self, x: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor,
                 eps: float) -> torch.Tensor: ...
    def dx_magnitude(self, x: torch.Tensor, gamma: torch.Tensor, g: torch.Tensor,
                     eps: float) -> torch.Tensor: ...


@dataclass(frozen=True)
class Param:
    """A ``(D,)`` parameter: its name, the name of its gradient check and its controls.

    ``offset``: under zero_centered_gamma the stored parameter is ``effective − 1`` (γ: the
    parameter the point's own draw, control and zero-centred mode are for).
    ``added_last``: added to the output after every product (β), so the output moves with
    it one for one and its part of the output is itself. ``identity``: the control that a
    kernel without the parameter computes (γ = ones, β = zeros). ``optional``: absent
    unless the kernel takes it (a gated norm's bias): then neither swept nor noted.
    ``axes``: the point's fields that hold its control (the first) and γ's zero-centred
    mode, as the sweep crosses them and the reports spell them.
    """

    name: str
    check: str
    controls: tuple[str, ...]
    offset: bool = False
    added_last: bool = False
    identity: str = "zeros"
    optional: bool = False
    axes: tuple[PointAxis, ...] = ()

    @property
    def control(self) -> PointAxis:
        """The point's field that holds this parameter's control (the first of :attr:`axes`)."""
        return self.axes[0]


# γ's control and its zero-centred mode: in every result's JSON (the contract's ``weight`` and
# ``zero_centered_gamma``); β's control only in the JSON of an op that has a β.
CONTROL = chosen("control", CONTROLS, "weights", "γ controls", name="weight", cli="--weight",
                 label="γ")
ZCG = PointAxis("zero_centered_gamma", boolean, "zcg", "booleans", cli="--zcg", label="zcg")
GAMMA_AXES = (CONTROL, ZCG)
# A β left unset is drawn randn (checks.rows.point.make_point), as a plot's point draws it.
BETA_AXIS = chosen("bias", BIAS_CONTROLS, "biases", "β controls", json="op", cli="--bias",
                   label="β", swept=all_of(*BIAS_CONTROLS), unset="randn")
WEIGHT = Param("weight", "dw", CONTROLS, offset=True, identity="ones", axes=GAMMA_AXES)
BIAS = Param("bias", "dbias", BIAS_CONTROLS, added_last=True, axes=(BETA_AXIS,))
OPTIONAL_BIAS = Param("bias", "dbias", BIAS_CONTROLS, added_last=True, optional=True,
                      axes=(BETA_AXIS,))


@dataclass(frozen=True)
class Stored:
    """A second correct reference in low precision: the op's fp64 inputs as a kernel that
    stores an intermediate (rounded once to the output dtype) sees them. ``inputs`` maps the
    fp64 inputs to those to round; ``key`` names the detail that says which one passed."""

    inputs: Callable[[Tensors], Tensors]
    key: str
    computed: str  # the detail's value against the exact inputs
    label: str  # … against the stored ones, before " (rounded to DTYPE)"
    note: str = ""  # the clause the low-precision forward's tolerance note adds


def _whole_row(point: Point, name: str, output: str) -> int:
    return int(point.inputs[name].shape[-1])


def _row_terms(point: Point) -> int:
    return int(point.inputs[point.op.inputs[0]].shape[-1])


@dataclass(frozen=True)
class Op:
    """One op. ``reference(inputs, params, options)`` maps fp64 tensors by name (params
    effective: γ, not γ − 1) to the fp64 outputs by name."""

    name: str
    summary: str
    inputs: tuple[str, ...]
    params: tuple[Param, ...]
    options: tuple[str, ...]
    outputs: tuple[str, ...]
    reference: Callable[[Tensors, Tensors, dict[str, Any]], Tensors]
    # Per row (R,), fp64: how far input ``name`` may move before the output bends (the
    # finite difference's step is a fraction of it).
    step_scale: Callable[[Point, str], torch.Tensor]
    # Per element of d<input>, in u: the RMS of a correct kernel's own rounding
    # (``exact``: the point's exact fp64 gradients), and the magnitude of the terms that
    # make it (what a few ulps of rsqrt or division scale).
    input_rounding: Callable[[Point, str, Grads, Sums], torch.Tensor]
    input_magnitude: Callable[[Point, str, Sums], torch.Tensor]
    # Roles a kernel must have for this op, and roles whose presence selects it
    # (kernels/adapting/recognise.py): a required ``residual`` means fused add, and so on.
    needs: tuple[str, ...]
    marks: tuple[str, ...] = ()
    # Marks that select the op even when the parameter has a default (group_size).
    optional_marks: tuple[str, ...] = ()
    # Inputs not scaled by a point's input_scale (a gate is not a signal).
    unscaled: tuple[str, ...] = ()
    # Which of a point's two further draws an input other than the first takes (0 or 1);
    # one not named takes the first left (gradcheck_bi.checks.rows.point.make_point).
    stream: dict[str, int] = field(default_factory=dict)
    # Per input and output: how many elements of the output one element of the input
    # moves (the row's statistic: D; a group; 1 for an elementwise path).
    reach: Callable[[Point, str, str], int] = _whole_row
    # The forward: the statistic's number of terms, the op's further roundings per
    # element, outputs that are one addition of inputs, and a rounding every element of
    # a row shares (``shift(point, k, sums)``: its bound times ``k``; per row in u for the
    # finite differences' noise, ``shared``).
    forward_terms: Callable[[Point], int] = _row_terms
    forward_extra: float = 0.0
    # What the forward's statistic is, for its tolerance's note (gradcheck_bi.tolerance.notes).
    statistic: str = "the mean square"
    added: tuple[str, ...] = ()
    shift: Callable[[Point, float, Sums], float] | None = None
    shared: Callable[[Point, Sums], torch.Tensor | None] | None = None
    stored: Stored | None = None
    # A kernel returns its extra outputs when asked by a ``prenorm`` flag.
    prenorm: bool = False
    # Options a kernel may fix instead of taking them (the gated norm's group_size: the
    # whole row; norm_before_gate: whichever order its forward matches), each with the
    # values it may be fixed at (one forward probe picks among several).
    fixable: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # Options of the op's own beyond the norms' (a gate's activation, swiglu's multipliers):
    # passed to the kernel under their names, swept (the default, then each other value
    # alone; the values ride in ``Config.variant``), each with its blind value. One the
    # kernel does not take is fixed at the value its forward matches (``fixable``).
    axes: tuple[Axis, ...] = ()
    # β's part of the output, fp64, where the op rounds it further after adding it (a gated
    # norm's β·act(z) before the gate); ``None`` (or returning it): β itself, added last.
    bias_term: Callable[[Point], torch.Tensor | None] | None = None
    # Options that are fields of the point (Config, top-level keys of the JSON: the gated
    # norm's group size and order), each with how a sweep crosses it (PointAxis.swept).
    point_options: tuple[PointAxis, ...] = ()

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

    @property
    def offset_param(self) -> Param | None:
        """The parameter stored as ``effective − 1`` under zero_centered_gamma (γ: the one the
        point's control and zcg fields act on), or ``None`` where the op has none."""
        return next((p for p in self.params if p.offset), None)

    def added_last(self, params: Tensors) -> torch.Tensor | None:
        """Of ``params`` (by name), the one the op adds to its output last
        (:attr:`Param.added_last`: β), or ``None`` where the op or the point has none."""
        return next((params[p.name] for p in self.params
                     if p.added_last and p.name in params), None)

    def has(self, name: str) -> bool:
        """Whether the op takes a parameter or option of this name (``bias``,
        ``group_size``)."""
        return (name in self.options or any(p.name == name for p in self.params)
                or any(a.name == name for a in self.axes))

    @property
    def point_axes(self) -> tuple[PointAxis, ...]:
        """The point's fields this op has beyond the engine's: its parameters' controls,
        then its :attr:`point_options`."""
        return (*(a for p in self.params for a in p.axes), *self.point_options)

    def defaults(self) -> dict[str, Any]:
        """Its own options (:attr:`axes`) at their defaults."""
        return {a.name: a.default for a in self.axes}
