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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def call_forward(fn: Any, x: torch.Tensor, w: torch.Tensor, eps: float,
                 zero_centered_gamma: bool) -> torch.Tensor:
    """``fn.apply(x, w, eps, zero_centered_gamma)``, refusing a result outside the contract."""
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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return call_forward(self.fn, x, self.w, self.eps, self.zero_centered_gamma)


def forward_in_x(fn: Any, w: torch.Tensor, eps: float,
                 zero_centered_gamma: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel's forward as a function of ``x`` alone (:class:`ForwardInX`)."""
    return ForwardInX(fn, w, eps, zero_centered_gamma)


def forward_in_w(fn: Any, x: torch.Tensor, eps: float,
                 zero_centered_gamma: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel's forward as a function of the weight alone (``x`` held)."""
    return lambda w: call_forward(fn, x, w, eps, zero_centered_gamma)


def analytic_grads(
    fn: Any, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, eps: float,
    zero_centered_gamma: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, dx, dw)`` from the kernel's own forward and hand-written backward."""
    xr = x.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)
    y = call_forward(fn, xr, wr, eps, zero_centered_gamma)
    # Σ(y·g) backpropagates exactly g into the kernel's backward (1·g is exact) and, unlike
    # y.backward(g), does not make torch import sympy to check shapes (~0.3 s per process).
    (y * g).sum().backward()
    for name, grad, ref in (("dx", xr.grad, xr), ("dw", wr.grad, wr)):
        if grad is None:
            raise ValueError(f"backward returned no gradient for {name}")
        if grad.shape != ref.shape:
            raise ValueError(
                f"backward returned {name} of shape {tuple(grad.shape)}, "
                f"expected {tuple(ref.shape)}"
            )
    assert xr.grad is not None and wr.grad is not None
    return y.detach(), xr.grad.detach(), wr.grad.detach()
