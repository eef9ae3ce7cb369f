"""The full dx estimate of a large CPU check with N worker processes (issue 15).

    PYTHONPATH=. python3 benchmarks/cpu_processes.py [--shape 16,8192] [--counts 1,2,4,8]

Forces the usable cores (``fd.threads.usable_cores``) to each N in turn, so the chunk loop
spreads over N processes of one torch thread (``fd.threads.MAX_PROCESSES`` caps it; raise
it here to look past the cap), times ``fd.input_grad`` and checks every result is bitwise
the one-process result.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gradcheck_bi import fd
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import forward_in_x
from gradcheck_bi.kernels.rmsnorm import After
from gradcheck_bi.vocab import Config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16,8192")
    ap.add_argument("--counts", default="1,2,4,8,16,31")
    args = ap.parse_args()
    cfg = Config(check="dx", shape=tuple(int(s) for s in args.shape.split(",")), dtype="fp64")
    x, w, g = make_inputs(cfg)
    forward = forward_in_x(After, w, cfg.eps, False)
    fd.threads.MAX_PROCESSES = 1 << 10
    ref = None
    for n in (int(c) for c in args.counts.split(",")):
        fd.threads.usable_cores = lambda n=n: n  # type: ignore[misc]
        t = time.perf_counter()
        est = fd.input_grad(forward, x, g, cfg.eps)
        took = time.perf_counter() - t
        ref = est if ref is None else ref
        same = torch.equal(est.grad, ref.grad) and torch.equal(est.noise_floor, ref.noise_floor)
        print(f"processes {n:2d}: {took:6.2f} s, identical to 1: {same}", flush=True)


if __name__ == "__main__":
    main()
