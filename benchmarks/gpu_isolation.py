"""What the isolation costs on a GPU: whole runs, isolated against in one process.

    PYTHONPATH=. python benchmarks/gpu_isolation.py [--pairs 3] [--budget 420]

For each run below, first one **census** run in this process (``gradcheck-bi run``'s own
entry point, uncounted: it also warms Triton's cache for the timed runs), which prints
the worker processes the run started (device kind, fork or spawn), the recording
children of the load-time calls (fork or spawn) and whether CUDA was ever initialised in
the process that writes the report (a CUDA worker that is a kernel's recording child kept
for it, ``cuda/kept recording child``, is also counted among the recording children). Then
``--pairs`` pairs of fresh processes
(``python -m gradcheck_bi run …``), ``GRADCHECK_BI_ISOLATE=1`` and ``=0``, the order
alternating from pair to pair; each pair's wall-clock ratio, and the medians. A run whose
pairs would not fit in what is left of ``--budget`` seconds is cut short, and says so.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import time
from typing import Any

RUNS: dict[str, list[str]] = {
    "default": [],
    "liger": ["--kernel", "liger"],
    "gemm_triton": ["--kernel", "tests/kernels/gemm_triton.py:GemmTritonFn"],
}
RUN_TIMEOUT_S = 150


def census(args: list[str]) -> tuple[float, int]:
    """One run in this process (as the command line runs it), watched; its wall time and
    exit code. Prints what it started."""
    from gradcheck_bi import workers
    from gradcheck_bi.fd import threads as fd_threads
    from gradcheck_bi.kernels.adapting import sandbox

    started: collections.Counter[str] = collections.Counter()
    children: collections.Counter[str] = collections.Counter()
    worker_init, record = workers._Worker.__init__, sandbox._record

    def watched_worker(self: Any, lane: Any, device: Any, points: Any, tasks: Any,
                       kept: Any = None) -> None:
        # a forked worker of a process that had a thread pool runs torch on one thread
        threads = "" if lane.start == "spawn" or fd_threads.fork_keeps_threads() else ", 1 thread"
        how = "kept recording child" if kept is not None else lane.start
        started[f"{lane.kind}/{how}{threads}"] += 1
        worker_init(self, lane, device, points, tasks, kept)

    def watched_record(start: str, *rest: Any) -> Any:
        children[start] += 1
        return record(start, *rest)

    workers._Worker.__init__ = watched_worker  # type: ignore[method-assign]
    sandbox._record = watched_record  # type: ignore[assignment]
    import torch

    from gradcheck_bi.cli import main

    argv, sys.argv = sys.argv, ["gradcheck-bi", "run", *args]
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the report (and its workers') unseen
    t0 = time.perf_counter()
    try:
        code = main()  # argv None: as the program (the NVML check, the thread policy)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        sys.argv = argv
        workers._Worker.__init__ = worker_init  # type: ignore[method-assign]
        sandbox._record = record  # type: ignore[assignment]
    wall = time.perf_counter() - t0
    print(f"  census: exit {code}, {wall:.1f} s; workers "
          f"{dict(started) or 'none'}; recording children {dict(children) or 'none'}; "
          f"CUDA initialised in the reporting process: {torch.cuda.is_initialized()} "
          f"(libcuda loaded there: {_libcuda_loaded()})", flush=True)
    return wall, code


def _libcuda_loaded() -> bool:
    """Whether the driver library is mapped here (loaded by a CUDA call, or by a library)."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return any("libcuda.so" in line for line in maps)


def timed(args: list[str], isolate: str) -> float:
    env = {**os.environ, "GRADCHECK_BI_ISOLATE": isolate}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gradcheck_bi", "run", *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1, 3):
        tail = done.stderr.strip().splitlines()[-3:]
        print(f"    ISOLATE={isolate}: exit {done.returncode}: {' | '.join(tail)}", flush=True)
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for all of it")
    parser.add_argument("--only", choices=sorted(RUNS), action="append")
    opts = parser.parse_args()
    deadline = time.monotonic() + opts.budget
    rows = []
    for name in opts.only or list(RUNS):
        args = RUNS[name]
        print(f"== {name}: gradcheck-bi run {' '.join(args)}", flush=True)
        pid = os.fork()  # the census in a child: a fresh process, as the timed runs are
        if pid == 0:
            try:
                census(args)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        on: list[float] = []
        off: list[float] = []
        for i in range(opts.pairs):
            need = 1.2 * (on[-1] + off[-1]) if on else 0.0
            if time.monotonic() + need > deadline:
                print(f"  cut short after {i} pairs: the budget is spent", flush=True)
                break
            order = ["1", "0"] if i % 2 == 0 else ["0", "1"]
            walls = {iso: timed(args, iso) for iso in order}
            on.append(walls["1"])
            off.append(walls["0"])
            print(f"  pair {i + 1}: isolated {walls['1']:.2f} s, in one process "
                  f"{walls['0']:.2f} s, ratio {walls['1'] / walls['0']:.3f}", flush=True)
        if on:
            ratios = [a / b for a, b in zip(on, off, strict=True)]
            rows.append((name, statistics.median(on), statistics.median(off),
                         statistics.median(ratios), min(ratios), max(ratios), len(on)))
    print("\n| run | isolated (median) | in one process (median) | ratio, median (min–max) "
          "| pairs |\n| --- | ---: | ---: | ---: | ---: |")
    for name, a, b, r, lo, hi, n in rows:
        print(f"| {name} | {a:.2f} s | {b:.2f} s | {r:.3f} ({lo:.3f}–{hi:.3f}) | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
