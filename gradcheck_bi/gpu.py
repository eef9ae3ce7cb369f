"""Whether a GPU is here, asked without starting CUDA in this process; starting it in a child.

The process that writes the report hands its points to worker processes
(:mod:`gradcheck_bi.workers`) and its load-time kernel calls to a recording child
(:mod:`gradcheck_bi.kernels.adapting.sandbox`). A child **forked** from it inherits torch,
the kernel and its library already imported and the kernel already recognised, and starts in
milliseconds; a **spawned** one imports and recognises everything again (seconds, and every
Triton kernel loaded again). A forked child can run CUDA only if this process never
started it: torch refuses once this process has initialised CUDA ("Cannot re-initialize CUDA
in forked subprocess"), and the driver refuses once this process has called ``cuInit`` —
which ``torch.cuda.is_available()`` does through ``cudaGetDeviceCount`` unless
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, which the command line sets before anything is
imported (a kernel's library may ask at import: Liger does).

So this process asks only NVML (:func:`present`, through ``torch.cuda.device_count``), forks
its children while CUDA is untouched (:func:`forkable`), and a forked child that needs CUDA
starts it first thing (:func:`start_in_child`); where that fails (a library that called
``cuInit`` here at import, no NVML to ask), the caller spawns instead, as before.

One CUDA process per GPU for the run: a recording child that started CUDA (a kernel that
runs on CUDA only) is kept after recognition while its context still runs work
(:func:`unusable`), and becomes the CUDA worker (:mod:`gradcheck_bi.workers`), instead of a
second process paying a second context and loading the kernel's Triton kernels again.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=1)
def _counted() -> int:
    return torch.cuda.device_count()


def present() -> bool:
    """Whether a CUDA GPU is visible, without starting CUDA here (NVML's count: the runtime's
    only where NVML cannot answer). Where CUDA already runs here, torch's own answer."""
    if torch.cuda.is_initialized():
        return torch.cuda.is_available()
    return _counted() > 0


def count() -> int:
    """How many GPUs :func:`present` sees."""
    return torch.cuda.device_count() if torch.cuda.is_initialized() else _counted()


def forkable() -> bool:
    """Whether a child forked now may start CUDA: this process has ``fork`` and never
    initialised CUDA (a ``cuInit`` torch did not record is caught by :func:`start_in_child`)."""
    return hasattr(os, "fork") and not torch.cuda.is_initialized()


def start_in_child(device: str | None = None) -> str | None:
    """In a forked child, before the kernel runs: start CUDA (on ``device``, else the current
    one); ``None`` when it started, else why it cannot here (the parent must spawn)."""
    try:
        torch.cuda.init()
        if device is not None:
            torch.cuda.set_device(device)
    except Exception as exc:  # torch's bad-fork refusal, the driver's initialisation error
        return _why(exc)
    return None


def unusable() -> str | None:
    """In a process running CUDA: why its context no longer runs work (an illegal address
    or a failed device assert leaves it refusing everything, reported at a later call),
    ``None`` while it does."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
    except Exception as exc:
        return _why(exc)
    return None


def _why(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
