"""What the norm ops share: the fp64 normalisation, groups of the last axis, the gate.

Over the last axis of size D (or each group of G consecutive features): ``rms(v) = v ·
(mean v² + eps)^(-1/2)``; the gate's activation ``silu(z) = z · σ(z)``, ``silu'(z) = σ(1 +
z(1 − σ))``, or ``σ(z)``, ``σ'(z) = σ(1 − σ)`` (:data:`GATES`).

>>> import torch
>>> rms(torch.tensor([[3.0, 4.0]], dtype=torch.float64), 0.0)
tensor([[0.8485, 1.1314]], dtype=torch.float64)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi.ops.names import ROLE_NAMES
from gradcheck_bi.ops.record import Op
from gradcheck_bi.ops.shaped import (
    Axis,
    Drawn,
    Output,
    Role,
    ShapedOp,
    Sizes,
    Variant,
    cotangent,
    cotangent_axis,
    rows_back,
    rows_sizes,
    rows_view,
)
from gradcheck_bi.vocab import Config


def rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    """``v · (mean v² + eps)^(-1/2)`` over the last axis."""
    return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)


def grouped(v: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``v`` with its last axis cut into groups: ``(..., D / G, G)``."""
    d = v.shape[-1]
    g = d if group_size is None else int(group_size)
    if g <= 0 or d % g:
        raise ValueError(f"group_size {group_size} does not divide the last dim {d}")
    return v.reshape(*v.shape[:-1], d // g, g)


def normed(v: torch.Tensor, eps: float, group: int | None) -> torch.Tensor:
    """:func:`rms` over each group of the last axis."""
    vg = grouped(v, group)
    return (vg * torch.rsqrt((vg * vg).mean(-1, keepdim=True) + eps)).reshape(v.shape)


def row_length(v: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(Σ v² + n·eps)`` over the last axis: the length over which ``rms(v)`` bends."""
    return torch.sqrt((v * v).sum(-1) + v.shape[-1] * eps)


def silu_grad(z: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(z)
    return sig * (1 + z * (1 - sig))


def silu_grad_size(z: torch.Tensor) -> torch.Tensor:
    """``σ(1 + |z| (1 − σ))``: the size of the terms of ``silu'(z) = σ(1 + z(1 − σ))``, which
    its rounding is relative to (``silu'`` itself cancels to 0 near ``z = −1.28``)."""
    sig = torch.sigmoid(z)
    return sig * (1 + z.abs() * (1 - sig))


def sigmoid_grad(z: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(z)
    return sig * (1 - sig)


def sigmoid_grad_size(z: torch.Tensor) -> torch.Tensor:
    """``σ``: the size of the terms of ``σ' = σ(1 − σ)`` (``1 − σ`` cancels where σ → 1)."""
    return torch.sigmoid(z)


@dataclass(frozen=True)
class Gate:
    """A gate's activation: its value, its derivative and the size of that derivative's
    terms (what its rounding is relative to)."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    grad: Callable[[torch.Tensor], torch.Tensor]
    grad_size: Callable[[torch.Tensor], torch.Tensor]


# By the name a kernel is given (fla's ``activation='swish'`` is silu: the sweep passes
# "silu", which fla takes too).
GATES = {"silu": Gate(torch.nn.functional.silu, silu_grad, silu_grad_size),
         "sigmoid": Gate(torch.sigmoid, sigmoid_grad, sigmoid_grad_size)}


# --- a norm as an op of any shape --------------------------------------------------------
# Every norm's record is a ShapedOp like any other op's (rows of ``(n, d)``, parameters of
# ``(d,)``, the ``d`` axis coupled by the statistic), carrying its hand-written row plan
# (``ShapedOp.rows``): the row engine checks it with that plan, tighter than the derived
# model; the description below is what the shaped engine reads, and what tests hold the plan
# to (tests/test_norms_any_shape.py, tests/test_norm_models.py).

EPS = Config.eps  # a point's default eps
GROUPS = ("D", "D/4")  # the group sizes a gated norm's description sweeps: the row, a quarter


def _axes(plan: Op) -> tuple[Axis, ...]:
    """The sweep of a norm's description: γ's control on the effective weight and its
    zero-centred mode, β (a control, or its presence where optional), the plan's own options
    (as data: a gate's activation, the group size, the order), and the cotangent."""
    out: list[Axis] = []
    if plan.offset_param is not None:
        out += [Axis("gamma", tuple(plan.offset_param.controls), blind="ones",
                     words="γ's control on the effective weight (ones: blind to a defect "
                           "times γ − 1)"),
                Axis("zero_centered_gamma", (False, True), passed=True,
                     names=("zero_centered_gamma", "zcg"),
                     words="the stored weight is γ − 1 (the kernel adds the 1)")]
    for p in plan.params:
        if p.added_last and p.optional:
            out.append(Axis(p.name, (False, True), words=f"a {p.name} given (on) or None"))
        elif p.added_last:
            out.append(Axis("beta", tuple(p.controls), blind="zeros", words="β's control"))
    out += list(plan.axes)
    for o in plan.point_options:
        if o.field == "group_size":
            out.append(Axis("group_size", GROUPS, passed=True, names=("group_size",),
                            words="the statistic's group: the row, or a quarter of it"))
        else:
            out.append(Axis(o.field, (True, False), passed=True, names=(o.field,),
                            words=o.field.replace("_", " ")))
    return (*out, cotangent_axis("the cotangent of every output: random, or all ones"))


def _split(plan: Op, t: dict[str, torch.Tensor | None], options: dict[str, Any]
           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The plan's inputs and effective parameters from a call's tensors (γ = stored + 1 under
    zero_centered_gamma, as the kernel computes it)."""
    inputs = {i: v for i in plan.inputs if (v := t.get(i)) is not None}
    params: dict[str, torch.Tensor] = {}
    for p in plan.params:
        v = t.get(p.name)
        if v is not None:
            params[p.name] = v + 1 if p.offset and options.get("zero_centered_gamma") else v
    return inputs, params


def _group(word: Any, d: int) -> int | None:
    return None if word in (None, "D") or d % 4 or d < 8 else d // 4


def norm_op(plan: Op, words: str = "(…rows, D)") -> ShapedOp:
    """The record of a norm: its rows, parameters, outputs and sweep as an op of any shape,
    its fp64 reference the plan's, and the plan itself for the row engine."""
    roles = [Role(i, ("n", "d"), names=ROLE_NAMES.get(i, (i,))) for i in plan.inputs]
    roles += [Role(p.name, ("d",), optional=p.optional, names=ROLE_NAMES.get(p.name, (p.name,)),
                   check_name=p.check) for p in plan.params]

    def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                  ) -> dict[str, torch.Tensor]:
        inputs, params = _split(plan, t, options)
        return plan.reference(inputs, params, options)

    def canonical(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                  ) -> dict[str, torch.Tensor | None]:
        return {k: (v.reshape(-1, v.shape[-1]) if k in plan.inputs and v is not None else v)
                for k, v in t.items()}

    def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
             gen: torch.Generator) -> Drawn:
        lead, d = tuple(s[f"lead{i}"] for i in range(s["lead"])), s["d"]
        tensors: dict[str, torch.Tensor | None] = {
            i: torch.randn(*lead, d, generator=gen, dtype=torch.float64) for i in plan.inputs}
        cot = {o: cotangent(variant, s["n"], d, gen).to(dtype).to(device) for o in plan.outputs}
        zcg = bool(variant.get("zero_centered_gamma", False))
        for p in plan.params:
            if p.offset:  # γ's control on the effective weight; stored γ − 1 under zcg
                control = variant["gamma"]
                v = torch.randn(d, generator=gen, dtype=torch.float64) if control == "randn" \
                    else torch.full((d,), 1.0 if control == "ones" else 0.0, dtype=torch.float64)
                tensors[p.name] = v - 1 if zcg else v
            elif p.optional and not variant[p.name]:
                tensors[p.name] = None
            else:
                v = torch.randn(d, generator=gen, dtype=torch.float64)
                tensors[p.name] = v if p.optional or variant["beta"] == "randn" \
                    else torch.zeros_like(v)
        options: dict[str, Any] = {"eps": EPS, "zero_centered_gamma": zcg}
        options.update({a.name: variant[a.name] for a in plan.axes})
        for o in plan.point_options:
            value = variant[o.field]
            options[o.field] = _group(value, d) if o.field == "group_size" else value
        placed = {k: (v.to(dtype).to(device) if v is not None else None)
                  for k, v in tensors.items()}
        return Drawn(placed, options, cot, s)

    return ShapedOp(
        plan.name, plan.summary, roles=tuple(roles),
        outputs=tuple(Output(o, ("n", "d")) for o in plan.outputs), axes=_axes(plan),
        reference=reference, canonical=canonical, draw=draw,
        sizes=lambda shape: rows_sizes(shape, plan.name), default_shape=(2, 8, 256),
        shape_words=words, coupled=("d",), batch_axis=lambda options: "n",
        column="gamma" if plan.offset_param is not None else "", fills={"eps": EPS},
        crossed=(("gamma", "zero_centered_gamma"),) if plan.offset_param is not None else (),
        scaled=("x",), output_view=rows_view, restore=rows_back, rows=plan)
