"""Shared helpers: fresh random data per test, and failures that say where they differ."""

from __future__ import annotations

import torch


def rand(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0,
         scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).mul(scale).to(dtype)


def where_differs(a: torch.Tensor, b: torch.Tensor) -> str:
    """'max |a-b| = … at index …, k of n elements differ' for assertion messages."""
    diff = (a.double() - b.double()).abs()
    n = int((diff != 0).sum())
    if n == 0:
        return "identical"
    idx = [int(i) for i in torch.unravel_index(torch.argmax(diff), diff.shape)]
    return f"max |a-b| = {float(diff.max()):.3e} at {idx}; {n} of {diff.numel()} elements differ"
