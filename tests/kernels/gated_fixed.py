"""Gated RMSNorms whose group and gate order are fixed by the kernel: ``(x, z, weight, eps)``.

``before`` normalises the whole row, then gates (``y = rms(x) · w · silu(z)``); ``after``
gates, then normalises (``y = rms(x · silu(z)) · w``). Both wrap the correct kernel of
``rms_norm_gated.py`` (group = D); ``gradcheck-bi run --op rms_norm_gated --kernel
tests/kernels/gated_fixed.py:before`` checks one without sweeping the axes it does not have.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rms_norm_gated import RMSNormGated


def before(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
           ) -> torch.Tensor:
    return RMSNormGated.apply(x, z, weight, eps, None, True)


def after(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
          ) -> torch.Tensor:
    return RMSNormGated.apply(x, z, weight, eps, None, False)
