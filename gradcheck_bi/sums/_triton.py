"""The Triton kernels, compiled for CUDA tensors and interpreted for CPU tensors.

``_row_sum_kernel`` is the fixed-order row sum behind ``reduction.row_sum``;
``_rmsnorm_fwd_kernel`` is the same reduction fused with the RMSNorm forward (one kernel,
``x`` read twice, ``y`` and ``r`` written once) for the bundled kernels' Triton path.

Each program owns ``BLOCK_M`` rows and walks the columns in ``BLOCK_D`` steps, adding each
tile into a ``(BLOCK_M, BLOCK_D)`` accumulator created in the output's dtype, then folds the
accumulator with ``tl.sum``. The order of every addition depends only on the constexpr block
sizes, so a row's result is the same whatever the number of rows launched.

Both flavours are built from the same Python function: ``JITFunction`` compiles it,
``InterpretedFunction`` runs it with numpy on CPU. Building them explicitly (instead of
relying on ``TRITON_INTERPRET`` at decoration time) lets one process use both. One wrinkle:
``tl.zeros`` and ``tl.sum`` are themselves ``@triton.jit`` library functions, decorated
when ``triton.language`` was imported; unless ``TRITON_INTERPRET`` was set then, they are
compiled-only objects that refuse a direct call. While the interpreter runs our kernel,
``_device_calls_interpreted`` lets such calls run their Python body the way the
interpreter's own library functions do.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from gradcheck_bi.sums.blocking import BLOCK_M_CUDA, BLOCK_M_INTERPRETER, block_d


@triton.jit
def _blocked_row_sum(x_ptr, rows, row_ok, n_cols, stride_row, acc_dtype: tl.constexpr,
                     SQUARE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Σ_j x_j (or x_j², with SQUARE) per row, in the one fixed order both kernels share."""
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=acc_dtype)
    for start in range(0, n_cols, BLOCK_D):
        c = start + cols
        ok = row_ok[:, None] & (c[None, :] < n_cols)
        tile = tl.load(x_ptr + rows[:, None] * stride_row + c[None, :], mask=ok, other=0.0)
        tile = tile.to(acc_dtype)
        if SQUARE:
            tile = tile * tile
        acc += tile
    return tl.sum(acc, axis=1)


def _row_sum_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_row,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    total = _blocked_row_sum(x_ptr, rows, row_ok, n_cols, stride_row,
                             out_ptr.dtype.element_ty, False, BLOCK_M, BLOCK_D)
    tl.store(out_ptr + rows, total, mask=row_ok)


def _rmsnorm_fwd_kernel(
    x_ptr,
    w_ptr,
    eps_ptr,
    y_ptr,
    r_ptr,
    n_rows,
    n_cols,
    stride_row,
    ADD_ONE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Pass 1: Σ x² through the same blocked sum as _row_sum_kernel (a fixed order per row).
    # Pass 2: y = (x · r) · γ. sqrt and the divisions are the correctly rounded ones, like
    # torch's, so every element's bits are independent of where it sits in the launch.
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_D)
    cdt = r_ptr.dtype.element_ty
    total = _blocked_row_sum(x_ptr, rows, row_ok, n_cols, stride_row, cdt, True,
                             BLOCK_M, BLOCK_D)
    eps = tl.load(eps_ptr)
    d = tl.full((BLOCK_M,), 0, cdt) + n_cols
    one = tl.full((BLOCK_M,), 1, cdt)
    if cdt == tl.float32:  # fp32 "/" and sqrt are approximate on GPUs: ask for IEEE ones
        r = tl.div_rn(one, tl.sqrt_rn(tl.div_rn(total, d) + eps))
    else:  # fp64 division and sqrt are IEEE already
        r = one / tl.sqrt(total / d + eps)
    tl.store(r_ptr + rows, r, mask=row_ok)
    for start in range(0, n_cols, BLOCK_D):
        c = start + cols
        c_ok = c < n_cols
        ok = row_ok[:, None] & c_ok[None, :]
        offs = rows[:, None] * stride_row + c[None, :]
        tile = tl.load(x_ptr + offs, mask=ok, other=0.0)
        w = tl.load(w_ptr + c, mask=c_ok, other=0.0)
        if ADD_ONE:
            w = w + 1
        tl.store(y_ptr + rows[:, None] * n_cols + c[None, :], (tile * r[:, None]) * w[None, :],
                 mask=ok)


_flavours: dict[tuple[str, bool], Any] = {}


def _kernel(interpreted: bool, fn: Any = _row_sum_kernel) -> Any:
    key = (fn.__name__, interpreted)
    if key not in _flavours:
        if interpreted:
            from triton.runtime.interpreter import InterpretedFunction

            _flavours[key] = InterpretedFunction(fn)
        else:
            _flavours[key] = triton.runtime.jit.JITFunction(fn)
    return _flavours[key]


@contextlib.contextmanager
def _device_calls_interpreted() -> Iterator[None]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    cache: dict[int, Any] = {}

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self) not in cache:
            cache[id(self)] = InterpretedFunction(self.fn)
        return cache[id(self)](*args, **kwargs)

    original = JITFunction.__call__
    JITFunction.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        JITFunction.__call__ = original  # type: ignore[method-assign]


def launch_kernel(fn: Any, n_rows: int, on_cuda: bool, *args: Any,
                  **constexprs: Any) -> None:
    """Launch the row kernel ``fn`` over ``n_rows`` rows, ``BLOCK_M`` at a time: compiled on
    CUDA, by Triton's interpreter on CPU (:mod:`gradcheck_bi.fd._triton_fd` launches so too)."""
    interpreted = not on_cuda
    block_m = BLOCK_M_INTERPRETER if interpreted else BLOCK_M_CUDA
    grid = (triton.cdiv(n_rows, block_m),)
    if interpreted:
        with _device_calls_interpreted():
            _kernel(True, fn)[grid](*args, BLOCK_M=block_m, **constexprs)
    else:
        _kernel(False, fn)[grid](*args, BLOCK_M=block_m, **constexprs)


def launch(rows: torch.Tensor, out: torch.Tensor, width: int) -> None:
    """Sum each row of the 2-D contiguous ``rows`` into ``out`` with the fixed-order kernel."""
    n_rows, n_cols = rows.shape
    launch_kernel(_row_sum_kernel, n_rows, rows.is_cuda, rows, out, n_rows, n_cols,
                  rows.stride(0), BLOCK_D=width)


@functools.lru_cache(maxsize=64)
def _eps_tensor(eps: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``eps`` as a one-element tensor on ``device``, made once: a fresh one per call was a
    pageable host-to-device copy, and so a stream synchronisation, in every forward."""
    return torch.tensor([eps], dtype=dtype, device=device)


def rmsnorm_forward(
    x_c: torch.Tensor, w_c: torch.Tensor, eps: float, add_one: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``y = (x · r) · (w [+ 1])``, ``r = 1/sqrt(mean x² + eps)`` for compute-dtype inputs.

    Returns ``(y, r)`` in ``x_c.dtype`` with ``y`` of ``x_c``'s shape, ``r`` of its leading
    shape.
    """
    n_cols = x_c.shape[-1]
    rows = x_c.reshape(-1, n_cols).contiguous()
    n_rows = rows.shape[0]
    y = torch.empty_like(rows)
    r = torch.empty(n_rows, dtype=x_c.dtype, device=x_c.device)
    eps_t = _eps_tensor(eps, x_c.dtype, x_c.device)
    if n_rows > 0:
        launch_kernel(_rmsnorm_fwd_kernel, n_rows, rows.is_cuda, rows, w_c.contiguous(), eps_t,
                      y, r, n_rows, n_cols, rows.stride(0), ADD_ONE=add_one,
                      BLOCK_D=block_d(n_cols))
    return y.reshape(x_c.shape), r.reshape(x_c.shape[:-1])
