"""The record of an op of any shape: named axes, roles, options, controls, a fp64 reference.

A :class:`ShapedOp` describes an op by **named axes** (``n``, ``k``, ``o``, ``v``, …), the
way an einsum does: every tensor the kernel takes or returns is a list of axis names (its
*canonical* view, which the op builds from what the kernel really receives: A transposed
under layout ``NN``, a 3-D B flattened to its rows). From the axes alone the engine knows
what each output element depends on — an input element reaches the output elements that
agree with it on the axes they share; along an axis the input has and the output lacks (a
contracted axis: GEMM's ``k``, cross-entropy's class axis) or one the op declares
``coupled`` (a statistic over a row), its effect spreads — and from that it plans the
finite differences (:mod:`gradcheck_bi.fd.plan`): one perturbation per *colour*, a colour
being one index on the spreading axes per index of the shared ones.

Nothing else is written per op: its sweep comes from its :class:`Axis` values (a new
option is one entry here), its rounding model is derived from its fp64 reference
(:mod:`gradcheck_bi.errors`), its table columns from its ``column`` axis. A new op is one
module under ``gradcheck_bi/ops`` that defines ``OP``, a :class:`ShapedOp`; the package
finds it (:func:`gradcheck_bi.ops.discover`).

>>> from gradcheck_bi.ops.gemm import OP
>>> OP.checks
('forward', 'dA', 'dB', 'dbias', 'batch_invariance')
>>> [a.name for a in OP.axes]
['layout', 'bias', 'b_rank', 'cotangent']
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gradcheck_bi.ops.fields import Axis

if TYPE_CHECKING:
    from gradcheck_bi.ops.record import Op

Tensors = dict[str, torch.Tensor]
Sizes = dict[str, int]


@dataclass(frozen=True)
class Role:
    """A tensor the kernel takes: its canonical axes, kind, and the names that bind it.

    ``kind``: ``float`` (differentiable unless ``grad`` is False) or ``index`` (integer
    targets). ``optional``: the kernel may be given ``None`` (a bias), an axis of the op
    (``present``) says when. ``names``: parameter names that bind a kernel's argument to
    this role, lower case (``a``, ``x``, ``input``, ``hidden``).
    """

    name: str
    axes: tuple[str, ...]
    kind: str = "float"
    grad: bool = True
    optional: bool = False
    names: tuple[str, ...] = ()
    check_name: str = ""  # its gradient check's name, where not ``d<name>`` (a norm's ``dw``)

    @property
    def differentiable(self) -> bool:
        return self.kind == "float" and self.grad

    @property
    def check(self) -> str:
        return self.check_name or f"d{self.name}"


@dataclass(frozen=True)
class Output:
    """An output: its canonical axes (``()``: a scalar)."""

    name: str
    axes: tuple[str, ...]


@dataclass(frozen=True)
class Variant:
    """The values of every axis at one point of the op's sweep."""

    values: tuple[tuple[str, Any], ...]

    def __getitem__(self, key: str) -> Any:
        return dict(self.values)[key]

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.values).get(key, default)

    def label(self) -> str:
        return " ".join(f"{k}={_word(v)}" for k, v in self.values)


def _word(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


@dataclass(frozen=True)
class Drawn:
    """One point's tensors, as the kernel gets them (``tensors``, ``None`` for an absent
    optional role), their canonical views (the same storage), the kernel's options, and the
    cotangents of every output (canonical axes)."""

    tensors: dict[str, torch.Tensor | None]
    options: dict[str, Any]
    cotangents: Tensors
    sizes: Sizes


@dataclass(frozen=True)
class ShapedOp:
    """One op. ``reference(tensors, options)`` maps the fp64 tensors in their canonical
    views (``None`` for an absent optional role) to the fp64 outputs, canonical.

    ``canonical(tensors, options)`` views the kernel's tensors as the op's axes (the same
    storage); ``draw(sizes, variant, dtype, device, generator)`` makes a point's tensors as
    the kernel takes them and the options; ``sizes(shape)`` reads the sizes of the axes
    from the CLI's ``--shape``; ``risky(drawn, role)`` the colours a sampled check must hold
    (a class index per row: the target, the largest logit, block edges).
    """

    name: str
    summary: str
    roles: tuple[Role, ...]
    outputs: tuple[Output, ...]
    axes: tuple[Axis, ...]
    reference: Callable[[dict[str, torch.Tensor | None], dict[str, Any]], Tensors]
    canonical: Callable[[dict[str, torch.Tensor | None], dict[str, Any]],
                        dict[str, torch.Tensor | None]]
    draw: Callable[..., Drawn]
    sizes: Callable[[tuple[int, ...]], Sizes]
    default_shape: tuple[int, ...]
    shape_words: str
    # The axes along which an input element's effect spreads to every output element
    # (a row statistic); none for a GEMM or a loss.
    coupled: tuple[str, ...] = ()
    # The axis whose indices are independent problems (a batch's rows): batch invariance
    # compares a row alone and inside batches; None: not defined (a mean over rows).
    batch_axis: Callable[[dict[str, Any]], str | None] = lambda options: None
    # The axis whose values are the table's columns (its blind value marked "(control)").
    column: str = ""
    # Kernel argument names that the op fills itself (out_dtype: None), with the value.
    fills: dict[str, Any] = field(default_factory=dict)
    risky: Callable[[Drawn, str], list[torch.Tensor]] | None = None
    # Words and signatures: a function/class name containing one of these marks the op.
    marks: tuple[str, ...] = ()
    # The kernel's output ``name`` viewed in its canonical axes (GEMM: leading dims
    # flattened); the cotangent the kernel gets is the canonical one reshaped back.
    output_view: Callable[[str, torch.Tensor], torch.Tensor] = lambda name, y: y
    # A canonical slice of rows of role ``name`` back in the kernel's layout (``like``: the
    # point's own tensor of that role): batch invariance calls the kernel on a few rows.
    restore: Callable[[str, torch.Tensor, torch.Tensor, dict[str, Any]], torch.Tensor] = (
        lambda name, part, like, options: part.contiguous())
    # The outputs' axes where they depend on an option (a loss: (n,) under
    # reduction="none", () otherwise); ``None``: always ``outputs``' own.
    output_axes: Callable[[dict[str, Any]], dict[str, tuple[str, ...]]] | None = None
    # How a Variant's axes are crossed: the default point, each axis's other values one at
    # a time, and the pairs named here crossed in full (the cotangent with the reduction).
    crossed: tuple[tuple[str, str], ...] = ()
    # Roles drawn at a point's input scale (``Config.input_scale``, a case's
    # ``input_scales``; 1 by default) times the op's own draw: an op whose risky region
    # lies at large inputs (silu's tail). Other roles, and every role of an op naming none,
    # keep the op's draw whatever the scale.
    scaled: tuple[str, ...] = ()
    # ``bend(role, options)``: the length over which the outputs bend along a role (silu's
    # 1 / m_g), which caps its finite differences' step (else the tensor's RMS sets it:
    # :func:`gradcheck_bi.fd.plan.step`); None where the RMS serves (a linear role, a
    # function whose bends scale with its input).
    bend: Callable[[str, dict[str, Any]], float | None] = lambda role, options: None
    # False for an op built from a kernel's own forward (:mod:`gradcheck_bi.generic`): its
    # reference is that forward, so there is no forward to check, and recognition never
    # offers it for another kernel.
    independent: bool = True
    # Parameter names that take the size of one of the op's axes, by axis: a loss's
    # ``vocab_size`` (the logits' last dim), a linear layer's ``in_features`` and
    # ``out_features``. The kernel is given the size of the tensors of each call.
    size_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # A norm's hand-written row plan (:class:`~gradcheck_bi.ops.record.Op`): its step per
    # row, its rounding models and its controls as the row engine (:mod:`gradcheck_bi.checks.
    # rows`) reads them — tighter than the derived model, and cross-checked against it
    # (tests/test_norm_models.py). An op with one is checked by the row engine; ``None``: by
    # the shaped engine, from this record alone.
    rows: Op | None = None

    @property
    def checks(self) -> tuple[str, ...]:
        return (*(("forward",) if self.independent else ()),
                *(r.check for r in self.roles if r.differentiable), "batch_invariance")

    @property
    def gradient_checks(self) -> dict[str, str]:
        return {r.check: r.name for r in self.roles if r.differentiable}

    def outputs_at(self, values: dict[str, Any]) -> tuple[Output, ...]:
        """The outputs with their axes at a point's axis values."""
        if self.output_axes is None:
            return self.outputs
        axes = self.output_axes(values)
        return tuple(Output(o.name, axes.get(o.name, o.axes)) for o in self.outputs)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def axis(self, name: str) -> Axis:
        return next(a for a in self.axes if a.name == name)

    def variants(self, only: Mapping[str, Sequence[Any]] | None = None) -> list[Variant]:
        """The default point, every other value of each axis alone, and the ``crossed``
        pairs in full — each variant once, in a fixed order. ``only`` restricts axes to the
        values given (a case file's or the command line's choice)."""
        values = {a.name: list(a.values) for a in self.axes}
        for k, vs in (only or {}).items():
            if k in values:
                values[k] = [v for v in vs]
        base = {k: vs[0] for k, vs in values.items()}
        out: list[dict[str, Any]] = [dict(base)]
        for k, vs in values.items():
            out += [{**base, k: v} for v in vs[1:]]
        for a, b in self.crossed:
            out += [{**base, a: va, b: vb} for va, vb in itertools.product(values[a], values[b])]
        seen: dict[tuple[tuple[str, Any], ...], None] = {}
        for v in out:
            seen.setdefault(tuple((a.name, v[a.name]) for a in self.axes), None)
        return [Variant(key) for key in seen]


def sizes_of(op: ShapedOp, tensors: dict[str, Any], options: dict[str, Any]) -> Sizes:
    """The size of each axis of the op, read from the canonical views of a call's tensors."""
    views = op.canonical({r.name: tensors.get(r.name) for r in op.roles}, options)
    out: Sizes = {}
    for r in op.roles:  # the first role with an axis says its size
        t = views.get(r.name)
        for axis, n in zip(r.axes, t.shape if t is not None else (), strict=False):
            out.setdefault(axis, int(n))
    return out


def canonical_of(op: ShapedOp, drawn: Drawn) -> dict[str, torch.Tensor | None]:
    """The drawn tensors in the op's canonical axes (views of the same storage)."""
    return op.canonical(drawn.tensors, drawn.options)


def normal(shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """fp64 standard normals of ``shape`` for a point on ``device``: from the point's own
    (host) generator for a CPU point; drawn on the device itself for any other, from a
    generator of that device seeded by the point's (a host's serial fp64 draw of a real
    vocabulary's logits, (4096, 128256), took ~18 s a point; the device's, milliseconds).
    A device point's values thus differ from the same point's on CPU; each is reproducible.
    """
    if device == "cpu":
        return torch.randn(shape, generator=gen, dtype=torch.float64)
    seed = int(torch.randint(0, 2**62, (), generator=gen))
    on = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=on, dtype=torch.float64, device=device)


def cotangent_axis(words: str) -> Axis:
    """The ``cotangent`` axis every op sweeps: drawn, or all ones — the blind control of a
    backward that ignores its cotangent (``words``: what it is the cotangent of)."""
    return Axis("cotangent", ("random", "ones"), blind="ones", words=words)


def cotangent(variant: Variant, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """An output's cotangent (fp64, ``(rows, cols)``) under a ``cotangent`` axis: all ones
    (the blind control), else drawn from ``gen``."""
    if variant["cotangent"] == "ones":
        return torch.ones(rows, cols, dtype=torch.float64)
    return torch.randn(rows, cols, generator=gen, dtype=torch.float64)


def rows_sizes(shape: tuple[int, ...], op: str) -> Sizes:
    """The sizes of an op of ``(…rows, D)`` tensors: ``n`` rows, ``d``, and the leading
    dims one by one (``lead``, ``lead0``…), for drawing in the kernel's own rank."""
    if len(shape) < 2:
        raise ValueError(f"{op} takes --shape as (…rows, D)")
    return {"n": math.prod(shape[:-1]), "d": shape[-1], "lead": len(shape) - 1,
            **{f"lead{i}": s for i, s in enumerate(shape[:-1])}}


def last_axis_rows(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                   ) -> dict[str, torch.Tensor | None]:
    """``canonical`` for an elementwise op of ``(…rows, D)`` tensors: every tensor as
    ``(rows, D)``, the leading dims flattened."""
    return {k: (v.reshape(-1, v.shape[-1]) if v is not None else None) for k, v in t.items()}


def rows_view(name: str, y: torch.Tensor) -> torch.Tensor:
    """``output_view`` for an output of ``(…rows, D)``: ``(rows, D)``, the leading dims
    flattened."""
    return y.reshape(-1, y.shape[-1])


def rows_back(name: str, part: torch.Tensor, like: torch.Tensor, options: dict[str, Any]
              ) -> torch.Tensor:
    """``restore`` for :func:`last_axis_rows`: a few ``(k, D)`` rows with the kernel's
    leading rank (ones before them)."""
    return part.reshape(*([1] * (like.dim() - 2)), *part.shape).contiguous()


def halves_sizes(shape: tuple[int, ...], op: str) -> Sizes:
    """The sizes of an op of one ``(…rows, 2D)`` input split into two halves: ``n`` rows,
    ``two``, ``d`` (a half's width), and the leading dims one by one (``lead``, ``lead0``…)."""
    if len(shape) < 2 or shape[-1] % 2:
        raise ValueError(f"{op} takes --shape as (…rows, 2D), an even last dim")
    rows = rows_sizes(shape, op)
    return {"n": rows["n"], "two": 2, **rows, "d": shape[-1] // 2}


def halves_rows(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                ) -> dict[str, torch.Tensor | None]:
    """``canonical`` for an op of one ``(…, 2D)`` input ``x``: ``(n, 2, D)``, its halves on
    the middle axis (a view of the same storage)."""
    x = t["x"]
    assert x is not None
    return {"x": x.reshape(-1, 2, x.shape[-1] // 2)}


def halves_back(name: str, part: torch.Tensor, like: torch.Tensor, options: dict[str, Any]
                ) -> torch.Tensor:
    """``restore`` for :func:`halves_rows`: a few ``(k, 2, D)`` rows as ``(k, 2D)`` with
    the kernel's leading rank (ones before them)."""
    return rows_back(name, part.reshape(part.shape[0], -1), like, options)
