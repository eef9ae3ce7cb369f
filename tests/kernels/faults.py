"""A correct RMSNorm that misbehaves at one hidden size only, as Triton kernels do past a
block boundary: each class below ends its process, raises a ``BaseException`` or hangs when
the last dimension is :data:`FAULT_WIDTH` (``cases/ci.toml``'s D = 1025), and computes
``tests/kernels/user_rmsnorm.py``'s correct RMSNorm everywhere else.

=========================  =========  ==========================================
class                      where      what it does at D = 1025
=========================  =========  ==========================================
``SysExitInBackward``      backward   ``sys.exit(0)``
``OsExitInForward``        forward    ``os._exit(0)`` (no cleanup, no exception)
``SegfaultInForward``      forward    dies of SIGSEGV (a read of address 0)
``AbortInForward``         forward    ``os.abort()``: SIGABRT, as a failed device assert
``KilledInForward``        forward    SIGKILL, as the out-of-memory killer sends it
``HangInBackward``         backward   never returns
``InterruptInForward``     forward    raises ``KeyboardInterrupt`` itself
``GeneratorExitInForward`` forward    raises ``GeneratorExit``
=========================  =========  ==========================================

Only torch and the standard library are imported; the RMSNorm itself is
``user_rmsnorm.py``'s ``Correct``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

FAULT_WIDTH = 1025


def _segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def _hang() -> None:
    while True:
        time.sleep(3600)


def _interrupt() -> None:
    raise KeyboardInterrupt("raised by the kernel, not by a user's Ctrl-C")


def _generator_exit() -> None:
    raise GeneratorExit


def _correct() -> type:
    """``tests/kernels/user_rmsnorm.py``'s correct RMSNorm, loaded by path as this file is."""
    path = Path(__file__).with_name("user_rmsnorm.py")
    spec = importlib.util.spec_from_file_location("user_rmsnorm_for_faults", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Correct  # type: ignore[no-any-return]


_Correct = _correct()


def _make(name: str, fault: Callable[[], None], where: str) -> type:
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float,
                    zero_centered_gamma: bool) -> torch.Tensor:
            if where == "forward" and x.shape[-1] == FAULT_WIDTH:
                fault()
            return _Correct.forward(ctx, x, weight, eps, zero_centered_gamma)  # type: ignore[no-any-return]

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
            if where == "backward" and ctx.saved_tensors[0].shape[-1] == FAULT_WIDTH:
                fault()
            return _Correct.backward(ctx, g)  # type: ignore[no-any-return]

    Fn.__name__ = Fn.__qualname__ = name
    Fn.__doc__ = f"RMSNorm that faults in {where} at D = {FAULT_WIDTH}: {name}"
    return Fn


SysExitInBackward = _make("SysExitInBackward", lambda: sys.exit(0), "backward")
OsExitInForward = _make("OsExitInForward", lambda: os._exit(0), "forward")
SegfaultInForward = _make("SegfaultInForward", _segfault, "forward")
AbortInForward = _make("AbortInForward", os.abort, "forward")
KilledInForward = _make("KilledInForward", lambda: os.kill(os.getpid(), signal.SIGKILL),
                        "forward")
HangInBackward = _make("HangInBackward", _hang, "backward")
InterruptInForward = _make("InterruptInForward", _interrupt, "forward")
GeneratorExitInForward = _make("GeneratorExitInForward", _generator_exit, "forward")
Healthy = _make("Healthy", lambda: None, "forward")
