"""Calling a kernel under test: its forward, and its hand-written backward through autograd.

Every stage that runs a kernel goes through these two functions, so a kernel that breaks
the contract (``y`` not a tensor, not in ``x.dtype`` or ``x``'s shape; a backward that
returns no gradient or one of the wrong shape) is reported the same way everywhere.

>>> import torch
>>> from gradcheck_bi.kernels.rmsnorm import After
>>> x = torch.randn(2, 8, dtype=torch.float64); w = torch.randn(8, dtype=torch.float64)
>>> y, dx, dw = analytic_grads(After, x, w, torch.randn(2, 8, dtype=torch.float64), 1e-6, False)
>>> y.shape, dx.shape, dw.shape
(torch.Size([2, 8]), torch.Size([2, 8]), torch.Size([8]))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi.kernels import phase
from gradcheck_bi.kernels.layout import lay_out
from gradcheck_bi.kernels.watch import first_call
from gradcheck_bi.vocab import ContractViolation, first_line


def call_forward(fn: Any, x: torch.Tensor, w: torch.Tensor, eps: float,
                 zero_centered_gamma: bool) -> torch.Tensor:
    """``fn.apply(x, w, eps, zero_centered_gamma)``, refusing a result outside the contract
    (a first call at a shape that is slow — a compile, an autotune — is announced:
    :mod:`.watch`)."""
    phase.now("forward")
    with first_call(fn, tuple(x.shape), str(x.dtype), x.device.type):
        y = fn.apply(x, w, eps, zero_centered_gamma)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"forward returned {type(y).__name__}, expected a tensor")
    if y.shape != x.shape:
        raise ValueError(f"forward returned shape {tuple(y.shape)} for x of {tuple(x.shape)}")
    # The contract is y in x.dtype. A y in another dtype would be measured against a noise
    # floor computed for x.dtype: half the points fail, half pass, and no message says why.
    if y.dtype != x.dtype:
        raise TypeError(f"forward returned {y.dtype} for x of {x.dtype}; expected y in x.dtype")
    return y


@dataclass(frozen=True)
class ForwardInX:
    """The kernel's forward as a function of ``x`` alone (``w`` held): what FD in x
    differences. An object, not a closure, so a fresh process can receive it (pickled, the
    kernel by reference) and run the same forward."""

    fn: Any
    w: torch.Tensor
    eps: float
    zero_centered_gamma: bool
    layout: str = "contiguous"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return call_forward(self.fn, lay_out(x, self.layout, "x"),
                            lay_out(self.w, self.layout, "weight"), self.eps,
                            self.zero_centered_gamma)


def forward_in_x(fn: Any, w: torch.Tensor, eps: float, zero_centered_gamma: bool,
                 layout: str = "contiguous") -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel's forward as a function of ``x`` alone (:class:`ForwardInX`), its inputs
    laid out as ``layout`` says (the perturbed x too: FD sees what the backward saw)."""
    return ForwardInX(fn, w, eps, zero_centered_gamma, layout)


def forward_in_w(fn: Any, x: torch.Tensor, eps: float, zero_centered_gamma: bool,
                 layout: str = "contiguous") -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel's forward as a function of the weight alone (``x`` held), laid out as
    ``layout`` says."""
    xl = lay_out(x, layout, "x")
    return lambda w: call_forward(fn, xl, lay_out(w, layout, "weight"), eps,
                                  zero_centered_gamma)


def analytic_grads(
    fn: Any, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, eps: float,
    zero_centered_gamma: bool, layout: str = "contiguous",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, dx, dw)`` from the kernel's own forward and hand-written backward.

    The kernel gets copies of ``x`` and ``w`` and a cotangent of its own; each is compared
    bitwise with what it held before, after the forward (x, weight) and after the backward
    (x, weight, grad_output). A write into one of them is a :class:`ContractViolation`
    (``backward overwrote grad_output (37 % of elements)``) unless the kernel declares it
    (:func:`declared_mutations`); the gradients are measured on the copies either way.
    ``layout`` (:mod:`.layout`) hands the kernel x, the weight or its grad_output as a
    strided, transposed or offset view of the same values.
    """
    xr = lay_out(x.detach().clone(), layout, "x").requires_grad_(True)
    wr = lay_out(w.detach().clone(), layout, "weight").requires_grad_(True)
    owned = {"x": (xr, x), "weight": (wr, w)}
    y = call_forward(fn, xr, wr, eps, zero_centered_gamma)
    unchanged("forward", owned)

    def keep(grad: torch.Tensor) -> torch.Tensor:  # the tensor the kernel's backward gets
        grad = lay_out(grad.detach(), layout, "grad")
        owned["grad_output"] = (grad, grad.clone())
        return grad

    if y.requires_grad:
        y.register_hook(keep)
    # Σ(y·g) backpropagates exactly g into the kernel's backward (1·g is exact) and, unlike
    # y.backward(g), does not make torch import sympy to check shapes (~0.3 s per process).
    phase.now("backward")
    try:
        (y * g).sum().backward()
    except RuntimeError as exc:  # autograd's own check of what the backward returned
        if "returned an invalid gradient" not in str(exc):
            raise
        raise ContractViolation(f"backward: {first_line(exc)}") from None
    unchanged("backward", owned)
    for name, grad, ref in (("dx", xr.grad, xr), ("dw", wr.grad, wr)):
        if grad is None:
            raise ContractViolation(f"backward returned None for {name} (its input requires "
                                    "grad)")
        if grad.shape != ref.shape:
            raise ContractViolation(
                f"backward returned {name} of shape {tuple(grad.shape)}, "
                f"expected {tuple(ref.shape)}"
            )
    assert xr.grad is not None and wr.grad is not None
    return y.detach(), xr.grad.detach(), wr.grad.detach()


# The tensors a kernel may write into during the current check, and the declared writes seen.
_DECLARED: ContextVar[tuple[frozenset[str], list[str]]] = ContextVar(
    "declared_mutations", default=(frozenset(), []))
MUTABLE = ("x", "weight", "grad_output")  # what a kernel can declare it writes into


@contextmanager
def declared_mutations(allowed: frozenset[str] = frozenset()) -> Iterator[list[str]]:
    """Within the block, writes into the tensors named in ``allowed`` (a named adapter's
    declaration, a case file's ``allow_mutation``, ``--allow-mutation``) are not failures;
    the list collects one line per such write, for the report's note."""
    seen: list[str] = []
    token = _DECLARED.set((frozenset(allowed), seen))
    try:
        yield seen
    finally:
        _DECLARED.reset(token)


def allowed_mutations() -> frozenset[str]:
    """The writes declared for the current check (see :func:`declared_mutations`)."""
    return _DECLARED.get()[0]


def _fraction_changed(now: torch.Tensor, before: torch.Tensor) -> float:
    """The fraction of elements whose bits differ (NaN-safe: compared as integers)."""
    if now.shape != before.shape:
        return 1.0
    if now.dtype.is_floating_point:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[now.element_size()]
        a, b = now.detach().contiguous().view(ints), before.contiguous().view(ints)
    else:
        a, b = now.detach(), before
    if torch.equal(a, b):  # the usual case: one pass, no temporaries, no count
        return 0.0
    return float((a != b).double().mean())


def _bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' bits end to end, as one flat uint8 tensor (one op: the cat)."""
    return torch.cat([t.detach().contiguous().view(-1).view(torch.uint8) for t in tensors])


def all_bits_equal(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool | None:
    """Whether every pair ``(a, b)`` holds the same bits, told with one comparison (one host
    sync, where a ``torch.equal`` per pair is one each); ``None`` when that cannot be told
    at once — fewer than two pairs, or a pair differing in shape or dtype: compare each.

    >>> a = torch.tensor([1.0, float("nan")]); b = torch.arange(3, dtype=torch.int16)
    >>> all_bits_equal([(a, a.clone()), (b, b.clone())]), all_bits_equal([(a, a), (b, b + 1)])
    (True, False)
    """
    if len(pairs) < 2 or any(a.shape != b.shape or a.dtype != b.dtype for a, b in pairs):
        return None
    return torch.equal(_bytes([a for a, _ in pairs]), _bytes([b for _, b in pairs]))


def unchanged(phase: str, owned: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Compare each ``name: (tensor the kernel held, copy from before)`` bitwise after
    ``phase``: a write is a :class:`ContractViolation`, or, where declared
    (:func:`declared_mutations`), a note. Used by RMSNorm's calls and the family's."""
    if all_bits_equal(list(owned.values())):  # the usual case: one comparison for all
        return
    allowed, seen = _DECLARED.get()
    for name, (now, before) in owned.items():
        changed = _fraction_changed(now, before)
        if not changed:
            continue
        line = f"{phase} overwrote {name} ({changed:.0%} of elements)"
        if name not in allowed:
            raise ContractViolation(line + "; declare it with --allow-mutation "
                                    f"{name} if it is by design")
        if line not in seen:
            seen.append(line)
