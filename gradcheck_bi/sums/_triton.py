"""The fixed-order row sum in Triton: compiled for CUDA tensors, interpreted for CPU tensors.

``_row_sum_kernel`` is the kernel behind ``reduction.row_sum``; :func:`blocked_row_sum` is its
loop, which the bundled RMSNorm's fused forward (:mod:`gradcheck_bi.kernels.bundled.
_triton_rmsnorm`) calls too, so both sum a row in one order; :func:`launch_kernel` launches
either (and the finite differences' fused pass, :mod:`gradcheck_bi.fd._triton_fd`).

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
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from gradcheck_bi.sums.blocking import BLOCK_M_CUDA, BLOCK_M_INTERPRETER


@triton.jit
def blocked_row_sum(x_ptr, rows, row_ok, n_cols, stride_row, acc_dtype: tl.constexpr,
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
    total = blocked_row_sum(x_ptr, rows, row_ok, n_cols, stride_row,
                             out_ptr.dtype.element_ty, False, BLOCK_M, BLOCK_D)
    tl.store(out_ptr + rows, total, mask=row_ok)


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
