"""Cross-entropy's gradient check against its forward floor (the goal: ≤ 1.5×).

    PYTHONPATH=. python benchmarks/ce_ratio.py [--shape 4096,128256] [--check dlogits]

Runs ``gradcheck_bi.check(ce, checks=[CHECK], shapes=[SHAPE], device=…)`` twice (the first
warms up), where ``ce`` is ``torch.nn.functional.cross_entropy`` behind a function of the same
signature that counts its calls by their arguments' shapes, strides and options. The
**forward floor** is the calls a sampled check cannot avoid — the ones it made: Σ calls ×
each signature's median time alone (20 reps, after 3), on inputs of that signature. The
check runs in this process (``GRADCHECK_BI_ISOLATE=0``) so that its calls can be counted. Prints
the check's wall time, the floor and their ratio, and the calls per signature.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

import gradcheck_bi


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096,128256")
    ap.add_argument("--check", default="dlogits")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=2, help="the last one is timed")
    a = ap.parse_args()
    os.environ["GRADCHECK_BI_ISOLATE"] = "0"  # count the calls in this process
    shape = tuple(int(s) for s in a.shape.split(","))
    calls: collections.Counter[tuple[Any, ...]] = collections.Counter()
    args_of: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()

    def cross_entropy(input: torch.Tensor, target: torch.Tensor,
                      weight: torch.Tensor | None = None, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
        key = (tuple(input.shape), input.stride(), input.dtype, input.device.type,
               weight is not None, ignore_index, reduction, label_smoothing)
        calls[key] += 1
        if key not in args_of:
            args_of[key] = (input.detach().clone(), target.clone(),
                            None if weight is None else weight.detach().clone())
        return F.cross_entropy(input, target, weight=weight, ignore_index=ignore_index,
                               reduction=reduction, label_smoothing=label_smoothing)

    walls = []
    for rep in range(a.runs):
        calls.clear()
        sync()
        t0 = time.perf_counter()
        report = gradcheck_bi.check(cross_entropy, checks=[a.check], shapes=[shape],
                                    device=a.device, dtype=a.dtype, raise_on_failure=False)
        sync()
        walls.append(time.perf_counter() - t0)
        print(f"run {rep}: {walls[-1]:.2f} s, {sum(calls.values())} forward calls, "
              f"{len(report.results)} results, passed "
              f"{sum(1 for r in report.results if r.status == 'pass')}", flush=True)
    floor = 0.0
    for key, n in calls.items():
        x, target, weight = args_of[key]
        if x.device.type != a.device:  # a load-time probe on the host, not the check's
            print(f"  {n:6d} calls on {x.device.type} (load-time probes): not timed")
            continue
        ignore_index, reduction, smoothing = key[5:]
        once = functools.partial(F.cross_entropy, x, target, weight=weight,
                                 ignore_index=ignore_index, reduction=reduction,
                                 label_smoothing=smoothing)
        with torch.no_grad():
            for _ in range(3):
                once()
            ts = []
            for _ in range(20):
                sync()
                t0 = time.perf_counter()
                once()
                sync()
                ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        floor += n * t
        print(f"  {n:6d} calls × {t * 1e6:9.1f} µs  {key[0]} stride {key[1]} weight={key[4]} "
              f"ignore_index={ignore_index} reduction={reduction} smoothing={smoothing}")
    print(f"cross_entropy --check {a.check} --shape {a.shape} --dtype {a.dtype} on "
          f"{a.device}: check {walls[-1]:.2f} s, forward floor {floor:.2f} s, ratio "
          f"{walls[-1] / floor:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
