"""The finite-difference level sums on CPU in one pass, compiled by numba.

The same sums as the torch path of :func:`gradcheck_bi.fd.reduce.level_sums`, bit for bit:
per perturbed row and level ``o``, the terms

    odd:   (y_i(+o) - y_i(-o)) · g_i
    even:  ((y_i(-o) - y0_i) + (y_i(+o) - y0_i)) · g_i

each rounded once in fp64 as the torch ops round them, added in the order of
:func:`~gradcheck_bi.sums.reduction.row_sum` (blocks of ``block_d(D)`` columns added one
after another into an accumulator, padded columns adding ``+0.0``, then folded in halves).
The torch path makes about a dozen passes over the chunk (differences, products, block
additions); this reads each perturbed output once, while it is still in cache, and the
inner loops vectorise (no reassociation: numba's default float semantics, no fastmath).

Serial on purpose: one chunk's sums take a fraction of its forward, and every second
thread tried fought torch's OpenMP threads (which spin after each op) for the same cores.
Measured on 2 cores with torch at 2 threads: numba's OpenMP ``prange`` no faster, its
workqueue 1.8x slower, half the rows in a Python thread 1.5x slower (docs/benchmarks.md).

Compiled on first use (about a second per dtype of ``ys``) and cached on disk by numba;
:mod:`gradcheck_bi.fd.reduce` calls it for checks large enough to repay that, and for any
check of a dtype whose compiled code this process has already run (:data:`READY`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from numba import njit

from gradcheck_bi.fd._one_pass import chunk_rows, result_for
from gradcheck_bi.sums.blocking import MAX_BLOCK_D

# The dtypes of ``ys`` whose compiled sums this process has already run: for those a check
# of any size pays no start (see gradcheck_bi.fd.reduce.native_worth).
READY: set[torch.dtype] = set()


@njit(cache=True, inline="always")
def _terms_set(yp, yn, c, g, acc_odd, acc_even, n):  # type: ignore[no-untyped-def]
    for j in range(n):
        a = np.float64(yp[j])
        b = np.float64(yn[j])
        acc_odd[j] = (a - b) * g[j]
        acc_even[j] = ((b - c[j]) + (a - c[j])) * g[j]


@njit(cache=True, inline="always")
def _terms_add(yp, yn, c, g, acc_odd, acc_even, n, width):  # type: ignore[no-untyped-def]
    for j in range(n):
        a = np.float64(yp[j])
        b = np.float64(yn[j])
        acc_odd[j] += (a - b) * g[j]
        acc_even[j] += ((b - c[j]) + (a - c[j])) * g[j]
    for j in range(n, width):  # the zero padding of a short last block
        acc_odd[j] += 0.0
        acc_even[j] += 0.0


@njit(cache=True, inline="always")
def _row(ys, y0, g, n_lev, odd, even, width, n_blocks, m, r, acc_odd, acc_even, out):  # type: ignore[no-untyped-def]
    n_cols = ys.shape[3]
    c, gr = y0[r], g[r]
    for k in range(n_lev):
        yp, yn = ys[k, m, r], ys[n_lev + k, m, r]
        if n_blocks > 1:  # block 0 + block 1, then += every further block
            _terms_set(yp, yn, c, gr, acc_odd, acc_even, width)
            for b in range(1, n_blocks):
                lo = b * width
                hi = min(n_cols, lo + width)
                _terms_add(yp[lo:hi], yn[lo:hi], c[lo:hi], gr[lo:hi], acc_odd, acc_even,
                           hi - lo, width)
            w = width
        elif width > 1:  # one block: its first half + its (padded) second half
            w = width // 2
            _terms_set(yp, yn, c, gr, acc_odd, acc_even, w)
            _terms_add(yp[w:], yn[w:], c[w:], gr[w:], acc_odd, acc_even, n_cols - w, w)
        else:
            w = 1
            _terms_set(yp, yn, c, gr, acc_odd, acc_even, 1)
        while w > 1:  # fold in halves: element j meets element j + w
            w //= 2
            for j in range(w):
                acc_odd[j] += acc_odd[w + j]
                acc_even[j] += acc_even[w + j]
        if odd:
            out[k, m, r] = acc_odd[0]
        if even:
            out[n_lev * odd + k, m, r] = acc_even[0]


@njit(cache=True)
def _width(n_cols, max_block):  # type: ignore[no-untyped-def]
    width = 1
    while width < n_cols and width < max_block:
        width *= 2
    return width, (n_cols + width - 1) // width


@njit(cache=True)
def _sums(ys, y0, g, n_lev, odd, even, max_block, out):  # type: ignore[no-untyped-def]
    width, n_blocks = _width(ys.shape[3], max_block)
    acc_odd = np.empty(width)
    acc_even = np.empty(width)
    for m in range(ys.shape[1]):
        for r in range(ys.shape[2]):
            _row(ys, y0, g, n_lev, odd, even, width, n_blocks, m, r, acc_odd, acc_even, out)


def level_sums(ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor, odd: bool, even: bool,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``(odd·L + even·L, *ys.shape[1:-1])`` fp64 sums of a CPU ``ys`` ``(2L, ..., R, D)``
    in fp32 or fp64, with ``y0`` and ``g`` of ``(R, D)``; see the module docstring. With
    ``out`` (fp64 CPU, that shape, any strides) the sums are written there, no copy."""
    return sums_into(y0, g, odd, even)(ys, result_for(ys, odd, even, out))


def sums_into(y0: torch.Tensor, g: torch.Tensor, odd: bool,
              even: bool) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``run(ys, out)``: :func:`level_sums` of ``ys`` into ``out`` for one fixed ``y0`` and
    ``g`` — their fp64 arrays prepared once, for a loop over many chunks of the same rows."""
    if not (odd or even):
        raise ValueError("level sums take 2 points per level and odd or even sums")
    y0_np, g_np = _f64(y0), _f64(g)
    n_r, n_cols = g.shape

    def run(ys: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        rows = chunk_rows(ys, n_r, n_cols)
        _sums(rows.numpy(), y0_np, g_np, ys.shape[0] // 2, odd, even, MAX_BLOCK_D,
              out.view(out.shape[0], rows.shape[1], n_r).numpy())
        READY.add(ys.dtype)
        return out

    return run


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).contiguous().numpy()
