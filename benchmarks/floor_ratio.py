"""A gradient check beside its forward floor: the loop ``ce_ratio.py`` and ``gemm_ratio.py``
share.

A script wraps the kernel so that each forward call is counted under a key (its arguments'
shapes, strides, dtypes and options) with one copy of its arguments kept per key, then calls
:func:`timed_runs` (the check, ``runs`` times; the last one counts) and :func:`floor` (Σ
calls × each key's median time alone: what the check's finite differences cannot avoid).
Points run in the script's process (``GRADCHECK_BI_ISOLATE=0``) so that the calls can be
counted.
"""

from __future__ import annotations

import collections
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

os.environ["GRADCHECK_BI_ISOLATE"] = "0"  # count the calls in this process


class Counted:
    """The calls of a kernel by key, and one copy of the arguments of each key."""

    def __init__(self) -> None:
        self.calls: collections.Counter[Any] = collections.Counter()
        self.args_of: dict[Any, tuple[Any, ...]] = {}

    def add(self, key: Any, args: tuple[Any, ...]) -> None:
        self.calls[key] += 1
        if key not in self.args_of:
            self.args_of[key] = tuple(a.detach().clone() if isinstance(a, torch.Tensor)
                                      else a for a in args)


def syncer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def timed_runs(check: Callable[[], Any], counted: Counted, runs: int,
               sync: Callable[[], None]) -> float:
    """Run ``check()`` (it returns the report) ``runs`` times, each printed; the last
    one's wall time (its calls stay in ``counted``)."""
    wall = 0.0
    for rep in range(runs):
        counted.calls.clear()
        sync()
        t0 = time.perf_counter()
        report = check()
        sync()
        wall = time.perf_counter() - t0
        print(f"run {rep}: {wall:.2f} s, {sum(counted.calls.values())} forward calls, "
              f"{len(report.results)} results, passed "
              f"{sum(1 for r in report.results if r.status == 'pass')}", flush=True)
    return wall


def floor(counted: Counted, device: str, call: Callable[..., Any],
          describe: Callable[[Any], str], sync: Callable[[], None]) -> float:
    """Σ calls × the median time of ``call(*args)`` alone (3 warm-ups, 20 timed), one line
    per key (``describe(key)``); calls whose first tensor is on another device (load-time
    probes) are listed, not timed."""
    total = 0.0
    for key, n in counted.calls.items():
        args = counted.args_of[key]
        where = next(a.device.type for a in args if isinstance(a, torch.Tensor))
        if where != device:  # a load-time probe on the host, not the check's
            print(f"  {n:6d} calls on {where} (load-time probes): not timed")
            continue
        with torch.no_grad():
            for _ in range(3):
                call(*args)
            ts = []
            for _ in range(20):
                sync()
                t0 = time.perf_counter()
                call(*args)
                sync()
                ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        total += n * t
        print(f"  {n:6d} calls × {t * 1e6:9.1f} µs  {describe(key)}")
    return total
