"""Cross-entropy's gradient check against its forward floor (the goal: ≤ 1.5×).

    PYTHONPATH=. python benchmarks/ce_ratio.py [--shape 4096,128256] [--check dlogits] \
        [--profile N]

Runs ``gradcheck_bi.check(ce, checks=[CHECK], shapes=[SHAPE], device=…)`` twice (the first
warms up), where ``ce`` is ``torch.nn.functional.cross_entropy`` behind a function of the same
signature that counts its calls by their arguments' shapes, strides and options. The
**forward floor** is the calls a sampled check cannot avoid — the ones it made: Σ calls ×
each signature's median time alone (20 reps, after 3), on inputs of that signature. The
loop: ``benchmarks/floor_ratio.py``. Prints the check's wall time, the floor and their ratio,
and the calls per signature; ``--profile N``: then one more run under cProfile, its N
gradcheck_bi functions of most cumulative time (where the time above the floor goes).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
# before gradcheck_bi: it sets GRADCHECK_BI_ISOLATE=0 (the calls counted here)
from floor_ratio import Counted, floor, syncer, timed_runs

import gradcheck_bi


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096,128256")
    ap.add_argument("--check", default="dlogits")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=2, help="the last one is timed")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="one more run under cProfile: its N costliest gradcheck_bi functions")
    a = ap.parse_args()
    shape = tuple(int(s) for s in a.shape.split(","))
    counted, sync = Counted(), syncer(a.device)

    def cross_entropy(input: torch.Tensor, target: torch.Tensor,
                      weight: torch.Tensor | None = None, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
        counted.add((tuple(input.shape), input.stride(), weight is not None, ignore_index,
                     reduction, label_smoothing),
                    (input, target, weight, ignore_index, reduction, label_smoothing))
        return F.cross_entropy(input, target, weight=weight, ignore_index=ignore_index,
                               reduction=reduction, label_smoothing=label_smoothing)

    def check() -> gradcheck_bi.Report:
        return gradcheck_bi.check(cross_entropy, checks=[a.check], shapes=[shape],
                                  device=a.device, dtype=a.dtype, raise_on_failure=False)

    wall = timed_runs(check, counted, a.runs, sync)

    def once(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
             ignore_index: int, reduction: str, label_smoothing: float) -> None:
        F.cross_entropy(x, target, weight=weight, ignore_index=ignore_index,
                        reduction=reduction, label_smoothing=label_smoothing)

    def describe(key: tuple) -> str:
        return (f"{key[0]} stride {key[1]} weight={key[2]} ignore_index={key[3]} "
                f"reduction={key[4]} smoothing={key[5]}")

    total = floor(counted, a.device, once, describe, sync)
    print(f"cross_entropy --check {a.check} --shape {a.shape} --dtype {a.dtype} on "
          f"{a.device}: check {wall:.2f} s, forward floor {total:.2f} s, ratio "
          f"{wall / total:.2f}")
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: (check(), sync()))
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text).sort_stats("cumulative")
        stats.print_stats(r"gradcheck_bi/(?!api|runner|measure|workers)", a.profile)
        print(text.getvalue().split("ncalls", 1)[-1].rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
