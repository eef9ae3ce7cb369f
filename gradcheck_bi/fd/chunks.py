"""Helpers for the batched forward calls of a finite difference.

A call is padded with unperturbed copies of its rows to a ladder step
(:func:`~gradcheck_bi.fd.budget.batch_rows`: every call of a check, the last too, is one
shape for the kernel, whose padding rows' outputs are ignored): :func:`pad_rows`. A
weight's perturbations, every one at once, each row aligned as a fresh tensor: :func:`perturbed`.
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


# A perturbed weight's row starts on a multiple of this many elements: each is passed to the
# kernel alone, aligned as a fresh tensor would be (a compiled kernel specialises on it).
ROW_ALIGN = 16


def perturbed(w0: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """``w0 + deltas`` (``deltas``: ``(k, D)``), each row aligned (:data:`ROW_ALIGN`): every
    perturbed weight in one op, each row as a fresh ``w0 + delta`` would hold it."""
    n = w0.shape[-1]
    rows = torch.empty(deltas.shape[0], -(-n // ROW_ALIGN) * ROW_ALIGN, dtype=w0.dtype,
                       device=w0.device)[:, :n]
    return torch.add(w0, deltas, out=rows)
