"""GEMM mutants of the public bug classes: each a correct :class:`GemmFn` with one defect
in its backward (``# MUTANT``), and the control that shows it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import GemmFn, _op_a, _rows_of_b, fixed_order_mm


def _grads(ctx, g):
    A, B = ctx.saved_tensors
    layout = ctx.layout
    a, b = _op_a(A, layout), _rows_of_b(B, layout)
    return A, B, layout, a, b


def _place(A, B, layout, d_a, d_b):
    dA = d_a.t() if layout[0].upper() == "T" else d_a
    dB = d_b.t() if layout[1].upper() == "T" else d_b.reshape(B.shape)
    return dA.to(A.dtype), dB.to(B.dtype)


class DbiasFirstRow(GemmFn):
    """dbias from the cotangent's first row, times the rows (blind to a uniform cotangent)."""

    @staticmethod
    def backward(ctx, grad):
        A, B, layout, a, b = _grads(ctx, grad)
        g = grad.reshape(-1, grad.shape[-1])
        dA, dB = _place(A, B, layout, fixed_order_mm(b.t(), g), fixed_order_mm(g, a.t()))
        dbias = (g[0] * g.shape[0]) if ctx.has_bias else None  # MUTANT
        return dA, dB, dbias, None, None


class DbFirstRow(GemmFn):
    """dB from the cotangent's first row, for every row."""

    @staticmethod
    def backward(ctx, grad):
        A, B, layout, a, b = _grads(ctx, grad)
        g = grad.reshape(-1, grad.shape[-1])
        d_b = fixed_order_mm(g[:1].expand_as(g), a.t())  # MUTANT
        dA, dB = _place(A, B, layout, fixed_order_mm(b.t(), g), d_b)
        return dA, dB, g.sum(0) if ctx.has_bias else None, None, None


class DaFirstSlice(GemmFn):
    """dA from the first leading slice of a 3-D B only (2-D B: right)."""

    @staticmethod
    def backward(ctx, grad):
        A, B, layout, a, b = _grads(ctx, grad)
        g = grad.reshape(-1, grad.shape[-1])
        rows = B.shape[1] if B.dim() == 3 else b.shape[0]  # MUTANT
        d_a = fixed_order_mm(b[:rows].t(), g[:rows])
        dA, dB = _place(A, B, layout, d_a, fixed_order_mm(g, a.t()))
        return dA, dB, g.sum(0) if ctx.has_bias else None, None, None


class CotangentAsContiguous(GemmFn):
    """Reads the cotangent's storage as if it were contiguous (right for a contiguous one)."""

    @staticmethod
    def backward(ctx, grad):
        A, B, layout, a, b = _grads(ctx, grad)
        flat = grad.reshape(-1, grad.shape[-1])
        n, o = flat.shape
        g = grad.as_strided((n, o), (o, 1)) if grad.untyped_storage().nbytes() >= \
            n * o * grad.element_size() + grad.storage_offset() * grad.element_size() \
            else flat  # MUTANT: strides ignored
        dA, dB = _place(A, B, layout, fixed_order_mm(b.t(), g), fixed_order_mm(g, a.t()))
        return dA, dB, g.sum(0) if ctx.has_bias else None, None, None


class SmallDefectNN(GemmFn):
    """dA off by 1e-3 relative under layout NN only (what loose tolerances pass)."""

    @staticmethod
    def backward(ctx, grad):
        dA, dB, dbias, _, _ = GemmFn.backward(ctx, grad)
        if ctx.layout.upper() == "NN":
            dA = dA * (1 + 1e-3)  # MUTANT
        return dA, dB, dbias, None, None


class SplitKBelow32Rows(GemmFn):
    """A split-K heuristic keyed on the row count: below 32 rows the inner index is summed
    in two halves (more parallel work for a small M), from 32 on in one pass. Every value
    is right to rounding; a row's bits depend on how many rows its batch has."""

    @staticmethod
    def forward(ctx, A, B, bias, out_dtype, layout):
        y = GemmFn.forward(ctx, A, B, bias, out_dtype, layout)
        a, b = _op_a(A, layout), _rows_of_b(B, layout)
        if b.shape[0] < 32 and b.shape[1] >= 2:  # MUTANT
            half = b.shape[1] // 2
            y2 = fixed_order_mm(b[:, :half], a[:half]) + fixed_order_mm(b[:, half:], a[half:])
            if bias is not None:
                y2 = y2 + bias.to(y2.dtype)
            y = y2.reshape(y.shape).to(y.dtype)
        return y
