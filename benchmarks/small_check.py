"""The small check through the public API beside torch.autograd.gradcheck, one process.

(8, 1024) fp64 on CPU, dx + dw of the bundled ``after`` kernel, γ randn, zcg off, one
thread, called as a user calls it::

    gradcheck_bi.check("after", checks=["dx", "dw"], weights=["randn"], zcg=False,
                       shapes=[(8, 1024)], threads=1)

(its points in a worker process, as by default; ``GRADCHECK_BI_ISOLATE=0`` keeps them
here). Each round is a fresh process: the first call, ``--warm`` calls, then
``torch.autograd.gradcheck(fast_mode=False)`` on x and w (the same draw), then ``--warm``
calls again; the ratio is gradcheck's time over the first call and over the median of the
warm calls. The import is not timed. CPU seconds (this process and the check's worker)
beside wall seconds: on shared cores a process that waits for one counts no CPU time.

    PYTHONPATH=. python benchmarks/small_check.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (8, 1024)


def one_round(warm: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    import gradcheck_bi
    from gradcheck_bi.inputs import make_inputs
    from gradcheck_bi.kernels.bundled.rmsnorm import After
    from gradcheck_bi.vocab import Config

    check = gradcheck_bi.check

    def ours() -> tuple[float, float]:
        t, c = time.perf_counter(), _cpu()
        report = check("after", checks=["dx", "dw"], weights=["randn"], zcg=False,
                       shapes=[SHAPE], threads=1)
        seconds, cpu = time.perf_counter() - t, _cpu() - c
        assert report.ok and len(report.results) == 6, str(report)
        return seconds, cpu

    load = os.getloadavg()[0]
    first = ours()
    calls = [ours() for _ in range(warm)]
    x, w, _ = make_inputs(Config(check="dx", shape=SHAPE))
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    t, c = time.perf_counter(), _cpu()
    ok = torch.autograd.gradcheck(lambda a, b: After.apply(a, b, 1e-6, False), (xr, wr),
                                  fast_mode=False)
    reference, reference_cpu = time.perf_counter() - t, _cpu() - c
    calls += [ours() for _ in range(warm)]
    return {"load_start": load, "load_end": os.getloadavg()[0], "first": first[0],
            "warm": statistics.median(s for s, _ in calls), "gradcheck": reference,
            "gradcheck_ok": ok, "first_cpu": first[1],
            "warm_cpu": statistics.median(c for _, c in calls), "gradcheck_cpu": reference_cpu}


def _cpu() -> float:
    """CPU seconds of this process and its reaped children: the check's worker, which the
    check returns without waiting for, is waited for here (after the wall clock stopped)."""
    from gradcheck_bi.workers import reap_ended

    reap_ended(wait=True)
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="fresh processes, one by one")
    parser.add_argument("--warm", type=int, default=4, help="warm calls before and after")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_round(args.warm)))
        return
    cmd = [sys.executable, __file__, "--child", "--warm", str(args.warm)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    print("| round | load | first call s | warm call s (median) | gradcheck s | × first | "
          "× warm | CPU s: first, warm, gradcheck | × warm, CPU |\n"
          "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for n in range(args.rounds):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {n + 1} | {r['load_start']:.1f}–{r['load_end']:.1f} | {r['first']:.3f} | "
              f"{r['warm']:.3f} | {r['gradcheck']:.2f} | {r['gradcheck'] / r['first']:.0f}× | "
              f"{r['gradcheck'] / r['warm']:.0f}× | {r['first_cpu']:.3f}, {r['warm_cpu']:.3f}, "
              f"{r['gradcheck_cpu']:.2f} | {r['gradcheck_cpu'] / r['warm_cpu']:.0f}× |",
              flush=True)


if __name__ == "__main__":
    main()
