"""Correct RMSNorms, as plain functions ``f(x, weight, eps)``, that fault on small inputs
only — where gradcheck-bi calls them to recognise them at load (a (3, 8) forward, then one at
w = 0), never at a point of a sweep (D ≥ 16 there):

=========================  ==============================================
function                   what it does when the hidden size is below 16
=========================  ==============================================
``segfault_when_small``    dies of SIGSEGV (a read of address 0)
``exit_when_small``        ``os._exit(3)``
``hang_when_small``        never returns
``sys_exit_when_small``    ``sys.exit(0)``
=========================  ==============================================
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable

import torch

SMALL = 16


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _hang() -> None:
    while True:
        time.sleep(3600)


def _make(name: str, fault: Callable[[], object]) -> Callable[..., torch.Tensor]:
    def fn(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.shape[-1] < SMALL:
            fault()
        return _rms_norm(x, weight, eps)

    fn.__name__ = fn.__qualname__ = name
    return fn


segfault_when_small = _make("segfault_when_small", lambda: ctypes.string_at(0))
exit_when_small = _make("exit_when_small", lambda: os._exit(3))
hang_when_small = _make("hang_when_small", _hang)
sys_exit_when_small = _make("sys_exit_when_small", lambda: sys.exit(0))
