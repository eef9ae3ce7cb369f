"""Helpers for the batched forward calls of a finite difference.

A call is padded with unperturbed copies of its rows to a ladder step
(:func:`~gradcheck_bi.fd.budget.batch_rows`: every call of a check, the last too, is one
shape for the kernel, whose padding rows' outputs are ignored): :func:`pad_rows`.
"""

from __future__ import annotations

import torch


def pad_rows(rows: torch.Tensor, batch: int) -> torch.Tensor:
    """``rows`` ``(n, D)`` followed by copies of its own rows up to ``batch`` rows (the
    padding of a batched call: its outputs are ignored)."""
    n = rows.shape[0]
    if n >= batch:
        return rows
    return torch.cat([rows, rows.repeat(-(-(batch - n) // n), 1)[: batch - n]])
