"""The batch-invariance check: a row alone vs. inside batches of other sizes, bitwise.

``y`` and ``dx`` of probe rows (first, middle, last) are compared alone, inside the
checked shape and inside fixed batch sizes of fresh rows; ``y``, ``dx`` and ``dw`` are
compared run to run. Tolerance 0: every compared element must have the same bits.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gradcheck_bi.checks._measure import BitwiseLog
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import analytic_grads
from gradcheck_bi.vocab import Config, Measurement

# Batch sizes a probe row is placed into, capped so a batch stays under this many elements.
BATCH_SIZES = (3, 8, 64, 512, 4096)
MAX_BATCH_ELEMENTS = 1 << 22


def batch_sizes(n_cols: int) -> list[int]:
    """The batch sizes a probe row is placed in: fixed, capped by ``MAX_BATCH_ELEMENTS``."""
    return [b for b in BATCH_SIZES if b * n_cols <= MAX_BATCH_ELEMENTS] or [2]


@functools.lru_cache(maxsize=4)
def _filler_rows(seed: int, n_cols: int, input_scale: float
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, g)`` rows (fp64, CPU) that fill each batch around the probe rows.

    They depend only on seed, row length and input scale, so the controls, zcg settings and
    kernels of one point share one draw (drawing 2 × 4096 rows per check was a third of the
    default run).
    """
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    for size in batch_sizes(n_cols):
        fx = torch.randn(size, n_cols, generator=gen, dtype=torch.float64) * input_scale
        fg = torch.randn(size, n_cols, generator=gen, dtype=torch.float64)
        rows.append((fx, fg))
    return rows


def check_batch_invariance(fn: Any, cfg: Config) -> Measurement:
    """Rows alone vs. in batches of other sizes (``y``, ``dx``) and run-to-run (y, dx, dw).

    Every comparison is bitwise; the reported error is the largest abs difference among
    elements whose bits differ (0 when all are identical), the tolerance is 0.
    """
    x, w, g = make_inputs(cfg)
    n_cols = cfg.shape[-1]
    x2, g2 = x.reshape(-1, n_cols), g.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    probes = sorted({0, n_rows // 2, n_rows - 1})
    fillers = _filler_rows(cfg.seed, n_cols, cfg.input_scale)
    log = BitwiseLog()
    compare = log.compare

    def grads(xs: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return analytic_grads(fn, xs, w, gs, cfg.eps, cfg.zero_centered_gamma)

    y_full, dx_full, dw_full = grads(x, g)
    y_again, dx_again, dw_again = grads(x, g)
    compare("y run to run", y_full, y_again, 0)
    compare("dx run to run", dx_full, dx_again, 0)
    compare("dw run to run", dw_full, dw_again, 0)
    yf, dxf = y_full.reshape(-1, n_cols), dx_full.reshape(-1, n_cols)

    alone = {}
    for p in probes:
        y_one, dx_one, _ = grads(x2[p : p + 1], g2[p : p + 1])
        alone[p] = (y_one[0], dx_one[0])
        compare(f"y row {p} alone vs in shape {cfg.shape}", y_one[0], yf[p], p)
        compare(f"dx row {p} alone vs in shape {cfg.shape}", dx_one[0], dxf[p], p)
    for size, (fx, fg) in zip(batch_sizes(n_cols), fillers, strict=True):
        # One batch per size holds every probe row: at the end (often a partial tile), in the
        # middle and at the start; the rest is fresh random rows of the same scale.
        positions = [size - 1, size // 2, 0][: len(probes)]
        bx = fx.to(x.device, x.dtype, copy=True)  # copies: the cached fillers stay as drawn
        bg = fg.to(g.device, g.dtype, copy=True)
        for p, at in zip(probes, positions, strict=True):
            bx[at], bg[at] = x2[p], g2[p]
        yb, dxb, _ = grads(bx, bg)
        for p, at in zip(probes, positions, strict=True):
            compare(f"y row {p} alone vs at {at} in a batch of {size}", alone[p][0], yb[at], p)
            compare(f"dx row {p} alone vs at {at} in a batch of {size}", alone[p][1], dxb[at], p)

    return log.measurement({"batch_sizes": batch_sizes(n_cols), "probe_rows": probes})
