"""Helpers for the batched forward calls of a finite difference, and for the processes that
run them.

A call is padded with unperturbed copies of its rows to a ladder step
(:func:`~gradcheck_bi.fd.budget.batch_rows`: every call of a check, the last too, is one
shape for the kernel, whose padding rows' outputs are ignored): :func:`pad_rows`. Worker
processes are spawned without the caller's main script: :func:`main_module_hidden`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch


def pad_rows(rows: torch.Tensor, batch: int) -> torch.Tensor:
    """``rows`` ``(n, D)`` followed by copies of its own rows up to ``batch`` rows (the
    padding of a batched call: its outputs are ignored)."""
    n = rows.shape[0]
    if n >= batch:
        return rows
    return torch.cat([rows, rows.repeat(-(-(batch - n) // n), 1)[: batch - n]])


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start spawned workers without the caller's main script: a spawned process otherwise
    runs it again (as ``__mp_main__``), and a script without a ``__main__`` guard would run
    its whole check a second time. For workers that need nothing from it (their kernel
    comes from a reference: :mod:`gradcheck_bi.workers`)."""
    main = sys.modules.get("__main__")
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__")
                             if main and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)
