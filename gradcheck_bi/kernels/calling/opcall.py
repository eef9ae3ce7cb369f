"""Calling a kernel of any op: its forward, and its backward through autograd.

A kernel (an :class:`~gradcheck_bi.kernels.adapting.opadapt.OpAdapted`) returns a tensor or a tuple;
:func:`op_forward` names what it returned by the op's outputs, in order (a fused add that
returns ``y`` alone has no ``residual_out``), and refuses anything outside the contract
(not a tensor, not x's shape, not x's dtype). :func:`op_grads` runs the hand-written backward
with a cotangent on **every** output the kernel returned, and returns the gradient of every
input and parameter; a ``None`` or a wrongly shaped gradient, or a write into a tensor the
kernel does not own, is a :class:`~gradcheck_bi.vocab.ContractViolation` (a ``fail``).

Inside :func:`laid_out` (a check of a point with a layout, :mod:`.layout`), every call hands
the kernel its tensors in that layout: ``x-…`` applies to every input shaped like x (x,
residual, z), ``weight-…`` to every parameter (weight, bias), ``grad-…`` to the cotangent of
every output; the finite differences call the forward on inputs laid out the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi.kernels.calling import phase
from gradcheck_bi.kernels.calling.layout import lay_out
from gradcheck_bi.kernels.calling.watch import first_call
from gradcheck_bi.kernels.calling.writes import allowed_mutations, unchanged
from gradcheck_bi.ops import ROWS
from gradcheck_bi.vocab import ContractViolation, first_line

Tensors = dict[str, torch.Tensor]
_LAYOUT: ContextVar[str] = ContextVar("op_layout", default="contiguous")


@contextlib.contextmanager
def laid_out(layout: str) -> Iterator[None]:
    """Every :func:`op_forward` and :func:`op_grads` inside hands the kernel ``layout``."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def _lay(tensors: Tensors, role: str) -> Tensors:
    layout = _LAYOUT.get()
    return {n: lay_out(t, layout, role) for n, t in tensors.items()}


def outputs_of(op: str, raw: Any, x: torch.Tensor) -> Tensors:
    """``{output name: tensor}`` for what the kernel returned, checked against the contract."""
    names = ROWS[op].outputs
    shape = x.shape
    items = list(raw) if isinstance(raw, (tuple, list)) else [raw]
    if isinstance(raw, (tuple, list)) and len(names) == 1:
        raise TypeError(f"forward returned {type(raw).__name__}, expected a tensor")
    if len(items) > len(names):
        raise TypeError(f"forward returned {len(items)} values, expected at most "
                        f"{len(names)} ({', '.join(names)})")
    if not items:
        raise TypeError("forward returned an empty tuple, expected y")
    out: Tensors = {}
    for name, t in zip(names, items, strict=False):
        if t is None and name != "y":
            break  # e.g. (y, None): no residual_out
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"forward returned {type(t).__name__} for {name}, expected a tensor")
        if t.shape != shape:
            raise ValueError(f"forward returned {name} of shape {tuple(t.shape)} for x of "
                             f"{tuple(x.shape)}, expected {shape}")
        if t.dtype != x.dtype:
            raise TypeError(f"forward returned {name} in {t.dtype} for x of {x.dtype}; "
                            f"expected {name} in x.dtype")
        out[name] = t
    return out


def op_forward(fn: Any, inputs: Tensors, params: Tensors, options: dict[str, Any],
               zcg: bool) -> Tensors:
    """The kernel's outputs by name (its tensors in the layout of :func:`laid_out`). A
    kernel declared to write into its tensors (:func:`~gradcheck_bi.kernels.calling.writes.
    declared_mutations`) gets copies: the caller's stay as they were (the finite
    differences reuse theirs from call to call)."""
    if allowed_mutations():
        inputs = {n: t.clone() for n, t in inputs.items()}
        params = {n: t.clone() for n, t in params.items()}
    return _called(fn, _lay(inputs, "x"), _lay(params, "weight"), options, zcg)


def _called(fn: Any, inputs: Tensors, params: Tensors, options: dict[str, Any],
            zcg: bool) -> Tensors:
    phase.now("forward")
    lead = inputs[ROWS[fn.op].inputs[0]]
    with first_call(fn, tuple(lead.shape), str(lead.dtype), lead.device.type):
        raw = fn.call(inputs, params, options, zcg)
    return outputs_of(fn.op, raw, lead)


def op_grads(fn: Any, inputs: Tensors, params: Tensors, cotangents: Tensors,
             options: dict[str, Any], zcg: bool) -> tuple[Tensors, Tensors]:
    """``(outputs, gradients)``: every output the kernel returned, and the gradient of every
    input and parameter for ``L = Σ_outputs Σ cotangent · output``.

    The kernel gets copies of its inputs, parameters and cotangents; each is compared
    bitwise after the forward and after the backward (see
    :func:`gradcheck_bi.kernels.calling.writes.unchanged`).
    """
    outs, backward = op_grads_later(fn, inputs, params, cotangents, options, zcg)
    return outs, backward()


@dataclass
class Backward:
    """The second step of :func:`op_grads_later`. Called: the kernel's backward, what it
    held compared bitwise, the gradients returned (as :func:`op_grads`). Or in two parts:
    ``run()`` the backward and its gradients, ``check_writes()`` the comparison later — a
    host sync, which on a GPU waits for every call queued before it."""

    call: Callable[[bool], Tensors]  # the backward; with True, its writes checked first
    check_writes: Callable[[], None]

    def __call__(self) -> Tensors:
        return self.call(True)

    def run(self) -> Tensors:
        try:
            return self.call(False)
        except ContractViolation:  # a write, where there is one, is told first (as called)
            self.check_writes()
            raise


def op_grads_later(fn: Any, inputs: Tensors, params: Tensors, cotangents: Tensors,
                   options: dict[str, Any], zcg: bool) -> tuple[Tensors, Backward]:
    """:func:`op_grads` in two steps: the forward now (its outputs returned), the backward
    when asked (:class:`Backward`). A check that needs the outputs' names first can queue
    GPU work between the two, and the backward's host work then runs while that work does
    (the finite differences' calls: ``fd.coloured``'s ``meanwhile``), its write check
    after them."""
    layout = _LAYOUT.get()
    absent: frozenset[str] = getattr(fn, "absent", frozenset())  # params it does not take
    leaves = {n: lay_out(t.detach().clone(), layout, "x" if n in inputs else "weight"
                         ).requires_grad_(n not in absent)
              for n, t in {**inputs, **params}.items()}
    owned = {n: (leaves[n], t) for n, t in {**inputs, **params}.items()}
    outs = _called(fn, {n: leaves[n] for n in inputs}, {n: leaves[n] for n in params},
                   options, zcg)
    unchanged("forward", owned)
    loss = None
    for name, y in outs.items():
        # the kernel's backward gets Σ(y·g)'s gradient, a fresh tensor, never g itself
        g = cotangents[name].detach()

        def keep(grad: torch.Tensor, name: str = name) -> torch.Tensor:
            key = "grad_output" if name == "y" else f"grad_{name}"
            grad = lay_out(grad.detach(), layout, "grad")
            owned[key] = (grad, grad.clone())
            return grad

        if y.requires_grad:
            y.register_hook(keep)
        term = (y * g).sum()
        loss = term if loss is None else loss + term
    assert loss is not None

    def writes() -> None:
        unchanged("backward", owned)

    def backward(check: bool) -> Tensors:
        phase.now("backward")
        try:
            loss.backward()
        except RuntimeError as exc:
            if ("returned an invalid gradient" not in str(exc)
                    and "does not require grad" not in str(exc)):
                raise
            raise ContractViolation(f"backward: {first_line(exc)}") from None
        if check:
            writes()
        grads: Tensors = {}
        for name, leaf in leaves.items():
            if name in absent:
                continue
            if leaf.grad is None:
                raise ContractViolation(f"backward returned None for d{_short(name)} (its "
                                        "input requires grad)")
            if leaf.grad.shape != leaf.shape:
                raise ContractViolation(f"backward returned d{_short(name)} of shape "
                                        f"{tuple(leaf.grad.shape)}, expected "
                                        f"{tuple(leaf.shape)}")
            grads[name] = leaf.grad.detach()
        return grads

    return ({n: y.detach() for n, y in outs.items()},
            Backward(backward, writes))


def _short(name: str) -> str:
    return "w" if name == "weight" else name
