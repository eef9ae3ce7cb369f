"""The fp64 input draw: one ``torch.randn`` after another against the split draw of
:func:`gradcheck_bi.inputs.draw_normal`, timed and compared bit for bit.

    PYTHONPATH=. python3 benchmarks/input_draw.py [--shapes 64,8192 256,8192] [--reps 5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gradcheck_bi import inputs


def sequential(seed: int, sizes: list[int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen, dtype=torch.float64) for n in sizes]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["64,8192", "64,16384", "256,8192"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, usable cores {inputs.usable_cores()}, split stream "
          f"matches plain randn: {inputs._split_matches()}\n")
    print("| shape | values | one randn after another, ms | split draw, ms | speed-up | "
          "bitwise equal |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for text in args.shapes:
        shape = tuple(int(s) for s in text.split(","))
        n = math.prod(shape)
        sizes = [n, n, shape[-1]]
        times: dict[str, list[float]] = {"seq": [], "split": []}
        for _ in range(args.reps):
            for name, fn in (("seq", sequential), ("split", inputs.draw_normal)):
                t = time.perf_counter()
                fn(0, sizes)
                times[name].append(time.perf_counter() - t)
        same = all(torch.equal(a, b) for a, b in
                   zip(sequential(0, sizes), inputs.draw_normal(0, sizes), strict=True))
        s, p = statistics.median(times["seq"]) * 1e3, statistics.median(times["split"]) * 1e3
        print(f"| {shape} | {2 * n + shape[-1]} | {s:.1f} | {p:.1f} | {s / p:.2f}x | {same} |",
              flush=True)


if __name__ == "__main__":
    main()
