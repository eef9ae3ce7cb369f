"""The Triton row-sum kernel, compiled for CUDA tensors and interpreted for CPU tensors.

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

from gradcheck_bi.kernels import reduction


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
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=out_ptr.dtype.element_ty)
    for start in range(0, n_cols, BLOCK_D):
        c = start + cols
        ok = row_ok[:, None] & (c[None, :] < n_cols)
        tile = tl.load(x_ptr + rows[:, None] * stride_row + c[None, :], mask=ok, other=0.0)
        acc += tile.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=row_ok)


_flavours: dict[str, Any] = {}


def _kernel(interpreted: bool) -> Any:
    key = "interpreted" if interpreted else "compiled"
    if key not in _flavours:
        if interpreted:
            from triton.runtime.interpreter import InterpretedFunction

            _flavours[key] = InterpretedFunction(_row_sum_kernel)
        else:
            _flavours[key] = triton.runtime.jit.JITFunction(_row_sum_kernel)
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


def launch(rows: torch.Tensor, out: torch.Tensor, width: int) -> None:
    """Sum each row of the 2-D contiguous ``rows`` into ``out`` with the fixed-order kernel."""
    interpreted = not rows.is_cuda
    block_m = reduction.BLOCK_M_INTERPRETER if interpreted else reduction.BLOCK_M_CUDA
    n_rows, n_cols = rows.shape
    grid = (triton.cdiv(n_rows, block_m),)
    args = (rows, out, n_rows, n_cols, rows.stride(0))
    if interpreted:
        with _device_calls_interpreted():
            _kernel(True)[grid](*args, BLOCK_M=block_m, BLOCK_D=width)
    else:
        _kernel(False)[grid](*args, BLOCK_M=block_m, BLOCK_D=width)
