"""Central difference stencils: ``f' ≈ Σ_o w_o (f(x + o h) - f(x - o h)) / h``.

>>> CENTRAL4.points, CENTRAL4.order
(4, 4)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stencil:
    """A central difference: ``f' ≈ Σ_o weights[o] (f(x+o h) - f(x-o h)) / h``."""

    name: str
    offsets: tuple[int, ...]
    weights: tuple[float, ...]
    order: int

    @property
    def points(self) -> int:
        return 2 * len(self.offsets)

    @property
    def abs_weight_sum(self) -> float:
        return 2 * sum(abs(w) for w in self.weights)


CENTRAL2 = Stencil("central-2", (1,), (0.5,), 2)
CENTRAL4 = Stencil("central-4", (1, 2), (8 / 12, -1 / 12), 4)
STENCILS = {s.name: s for s in (CENTRAL2, CENTRAL4)}


def combine_sums(sums: torch.Tensor, stencil: Stencil) -> tuple[torch.Tensor, torch.Tensor]:
    """(stencil numerator, 2nd-order numerator at h) from per-offset sums ``Σ g·Δ_o y``.

    ``sums[o]`` holds ``Σ g (y(+o h) - y(-o h))``; divide either numerator by ``h``.
    """
    num = stencil.weights[0] * sums[0]
    for j in range(1, len(stencil.offsets)):
        num = num + stencil.weights[j] * sums[j]
    return num, 0.5 * sums[0]


def signed_offsets(stencil: Stencil) -> torch.Tensor:
    """``[+o..., -o...]`` in fp64: the order in which stencil points are stacked."""
    return torch.tensor([*stencil.offsets, *(-o for o in stencil.offsets)], dtype=torch.float64)
