"""Forwards handed to the spawned finite-difference workers of tests/test_chunks.py.

They live in a module of their own so that a fresh process can import them by name (as
:func:`gradcheck_bi.fd.chunks.loadable_elsewhere` requires) without importing a test file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

# How long this process waits for a worker's first chunk: a spawned worker imports torch,
# which on a loaded machine has taken more than 10 s.
WORKER_START_S = 180.0


class Announcing:
    """A worker's forward that leaves a marker file when it takes its first chunk, then
    computes (or, with ``fail``, raises as a broken forward would)."""

    def __init__(self, forward: Any, marker: Path, fail: bool = False) -> None:
        self.forward, self.marker, self.fail = forward, Path(marker), fail

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.marker.touch()
        if self.fail:
            raise RuntimeError("this worker's forward fails on purpose")
        return self.forward(x)


class WaitsForWorker:
    """This process's forward: its first call waits until a worker has taken a chunk (so
    the test never depends on how fast a process starts), every call then pauses so that
    the worker finds chunks left."""

    def __init__(self, forward: Any, marker: Path, pause: float) -> None:
        self.forward, self.marker, self.pause, self.calls = forward, Path(marker), pause, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.calls == 0:
            deadline = time.monotonic() + WORKER_START_S
            while not self.marker.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        self.calls += 1
        time.sleep(self.pause)
        return self.forward(x)
