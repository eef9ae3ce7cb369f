"""The rules every check applies: the overrides and the per-element ratio.

``--atol`` replaces the derived tolerance (of every element); ``--rtol`` adds
``rtol × max|reference|``.

>>> import torch
>>> per_element_ratio(torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 2.0])).tolist()
[0.0, inf, 0.5]
"""

from __future__ import annotations

import torch

from gradcheck_bi.vocab import Config


def fd_tolerance(floor: torch.Tensor, scale: float | torch.Tensor, cfg: Config
                 ) -> torch.Tensor:
    """Per-element tolerance: the noise floor, or ``--atol`` in its place; ``--rtol`` adds
    ``rtol × scale`` (the largest |gradient|; given as the gradient, its largest magnitude
    is read only then: no host sync without ``--rtol``) to every element."""
    tol = torch.full_like(floor, cfg.atol) if cfg.atol is not None else floor
    if cfg.rtol is None:
        return tol
    if isinstance(scale, torch.Tensor):
        scale = float(scale.abs().max())
    return tol + cfg.rtol * scale


def per_element_ratio(err: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """``err / tol`` with ``0 / 0 = 0`` and ``x / 0 = inf``; NaN stays NaN.

    ``0 / 0``: an output that is exactly 0 (γ = zeros makes ``y ≡ 0``) gives an exact finite
    difference and a zero floor; an analytic gradient that is exactly 0 there passes, any
    nonzero one fails.
    """
    ratio = err / tol
    return torch.where((err == 0) & (tol == 0), 0.0, ratio)


def overridden(tol: float, scale: float, cfg: Config) -> float:
    """Apply the config's ``atol`` (replaces) and ``rtol`` (adds ``rtol × scale``)."""
    if cfg.atol is not None:
        tol = cfg.atol
    if cfg.rtol is not None:
        tol += cfg.rtol * scale
    return tol
