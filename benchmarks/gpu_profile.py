"""Where a full (R, D) fp32 dx + dw check spends its time on CUDA beyond the forward calls.

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_profile.py [--shape 64,8192]

After a warm-up, runs the check once under cProfile (wall clock: CUDA waits show up in
whichever call synchronises) and times the parts the issue 15 analysis named: the input
draw, the analytic backward, the dx chunk loop and the dw estimate, each synchronised.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from floor import full_check
from gpu_bench import timed

from gradcheck_bi import fd
from gradcheck_bi.inputs import forget_draws, make_inputs
from gradcheck_bi.kernels.call import analytic_grads, forward_in_w, forward_in_x
from gradcheck_bi.kernels.rmsnorm import After
from gradcheck_bi.vocab import Config


def timed_ms(fn: Callable[[], object], reps: int = 5) -> float:
    """Median of ``reps`` synchronised runs, in ms."""
    return statistics.median(timed(fn, reps)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64,8192")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    dev = args.device
    check = full_check(shape, "fp32", dev)
    check()
    check()
    cfg = Config(check="dx", shape=shape, dtype="fp32", device=dev)
    x, w, g = make_inputs(cfg)
    print(f"shape {shape} fp32 {dev}, medians of 5, ms")
    print(f"  full dx + dw check      {timed_ms(check):8.2f}")
    print(f"  make_inputs, fresh draw {timed_ms(lambda: (forget_draws(), make_inputs(cfg))):8.2f}")
    print(f"  make_inputs, kept draw  {timed_ms(lambda: make_inputs(cfg)):8.2f}")
    print(f"  analytic_grads          "
          f"{timed_ms(lambda: analytic_grads(After, x, w, g, cfg.eps, False)):8.2f}")
    fx, fw = forward_in_x(After, w, cfg.eps, False), forward_in_w(After, x, cfg.eps, False)
    print(f"  fd.input_grad           {timed_ms(lambda: fd.input_grad(fx, x, g, cfg.eps)):8.2f}")
    print(f"  fd.weight_grad          {timed_ms(lambda: fd.weight_grad(fw, w, x, g)):8.2f}")
    prof = cProfile.Profile()
    prof.enable()
    check()
    if dev == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
