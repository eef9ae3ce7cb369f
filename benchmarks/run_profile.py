"""Where a whole run's time goes, for a kernel written by someone else.

    PYTHONPATH=. python3 benchmarks/run_profile.py [--reps 5] [--no-fresh] -- --kernel liger

Two parts, both printed as Markdown:

* **fresh processes** — ``gradcheck-bi run --kernel K`` in a new process, ``--reps`` times
  with a cold Triton cache (a new, empty ``TRITON_CACHE_DIR`` each time) and as many with a
  warm one (one shared directory, primed by one uncounted run). Medians, plus the kernels
  Triton compiled (cache entries of a cold run) and the autotuner passes
  (``TRITON_PRINT_AUTOTUNING`` lines).
* **one warm process, broken down** (its Triton cache primed by one uncounted run) —
  imports; the kernel's autograd Function calls (every ``Function.apply`` and its
  ``backward``, synchronised), split into first calls per
  (phase, shapes, dtypes) — compile, cache load, autotune — and repeat calls; gradcheck-bi's
  finite-difference sums (``level_sums``/``sums_into``, synchronised); the rest is
  gradcheck-bi's own Python and torch work outside the kernel. Distinct shapes with counts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def fresh_runs(run_args: list[str], reps: int, root: Path) -> dict[str, Any]:
    """Wall seconds of ``reps`` cold and ``reps`` warm fresh-process runs, compiles, tunes."""
    cmd = [sys.executable, "-m", "gradcheck_bi", "run", "--no-progress", "--format", "json",
           *run_args]
    env = {**os.environ, "PYTHONPATH": str(root), "TRITON_PRINT_AUTOTUNING": "1"}

    def once(cache: str) -> tuple[float, int, str]:
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env={**env, "TRITON_CACHE_DIR": cache}, capture_output=True,
                           text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        lines = p.stdout.splitlines() + p.stderr.splitlines()
        tunes = sum("autotuning" in line.lower() for line in lines)
        # Triton prints "Triton autotuning for function F,\nwith key as K,": one (F, K) per pass.
        for i, line in enumerate(lines[:-1]):
            if line.startswith("Triton autotuning for function"):
                out["tuned_keys"].append(f"{line.split()[-1].rstrip(',')} {lines[i + 1]}")
        return wall, tunes, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""

    out: dict[str, Any] = {"cold": [], "warm": [], "compiled": [], "tunes_cold": [],
                           "tunes_warm": [], "tuned_keys": []}
    for rep in range(reps):
        with tempfile.TemporaryDirectory() as cache:
            wall, tunes, verdict = once(cache)
            if rep == 0:
                out["keys_first_run"] = list(out["tuned_keys"])
            out["cold"].append(wall)
            out["tunes_cold"].append(tunes)
            out["compiled"].append(sum(1 for p in Path(cache).rglob("*.cubin")))
    with tempfile.TemporaryDirectory() as cache:
        once(cache)
        for _ in range(reps):
            wall, tunes, verdict = once(cache)
            out["warm"].append(wall)
            out["tunes_warm"].append(tunes)
    out["verdict"] = verdict
    return out


class Clock:
    """Synchronised timers around the kernel's Function calls and the FD sums, by kind
    (``kernel``, ``fd``) and key (caller, phase, shapes): calls, first-call seconds, total."""

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self.calls: dict[str, collections.Counter[tuple[Any, ...]]] = {
            k: collections.Counter() for k in ("kernel", "fd")}
        self.first_seconds: dict[str, dict[tuple[Any, ...], float]] = {"kernel": {}, "fd": {}}
        self.total = {"kernel": 0.0, "fd": 0.0}
        self._depth = 0

    def time(self, kind: str, key: tuple[Any, ...], call: Any) -> Any:
        if self._depth:  # called inside another timed call: counted there
            return call()
        self.sync()
        t0 = time.perf_counter()
        self._depth += 1
        try:
            return call()
        finally:
            self._depth -= 1
            self.sync()
            dt = time.perf_counter() - t0
            self.total[kind] += dt
            if key not in self.calls[kind]:
                self.first_seconds[kind][key] = dt
            self.calls[kind][key] += 1

    def first(self, kind: str) -> float:
        return sum(self.first_seconds[kind].values())


def _shapes(args: Any) -> tuple[Any, ...]:
    import torch
    return tuple((tuple(a.shape), str(a.dtype).removeprefix("torch."))
                 for a in args if isinstance(a, torch.Tensor))


def instrument(clock: Clock) -> None:
    """Time every autograd Function (forward by ``apply``, backward by its staticmethod)
    and every FD-sum entry point of gradcheck-bi."""
    import torch

    base_apply = torch.autograd.Function.apply.__func__  # type: ignore[attr-defined]
    patched: set[type] = set()

    def patch_backward(cls: type) -> None:
        if cls in patched:
            return
        patched.add(cls)
        bwd = cls.__dict__.get("backward")
        if bwd is None:
            return
        fn = bwd.__func__ if isinstance(bwd, staticmethod) else bwd

        @functools.wraps(fn)
        def backward(ctx: Any, *grads: Any) -> Any:
            return clock.time("kernel", (cls.__name__, "backward", _shapes(grads)),
                              lambda: fn(ctx, *grads))
        cls.backward = staticmethod(backward)  # type: ignore[attr-defined]

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        patch_backward(cls)
        return clock.time("kernel", (cls.__name__, "forward", _shapes(args)),
                          lambda: base_apply(cls, *args, **kwargs))

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[assignment]
    for name, mod in list(sys.modules.items()):
        if not name.startswith("gradcheck_bi") or mod is None:
            continue
        for attr in ("level_sums", "sums_into"):
            fn = getattr(mod, attr, None)
            if callable(fn):
                setattr(mod, attr, _timed_sums(clock, fn, f"{name}.{attr}"))


def _timed_sums(clock: Clock, fn: Any, where: str) -> Any:
    @functools.wraps(fn)
    def timed(*a: Any, **k: Any) -> Any:
        return clock.time("fd", (where, _shapes(a)), lambda: fn(*a, **k))
    return timed


def breakdown(run_args: list[str], top: int = 0, warm_run: bool = False) -> None:
    t0 = time.perf_counter()
    import torch
    t_torch = time.perf_counter() - t0
    import gradcheck_bi.cli as cli
    import gradcheck_bi.fd.estimate
    from gradcheck_bi.runner import measured_here
    with contextlib.suppress(ImportError):
        import liger_kernel.ops.rms_norm  # noqa: F401
    t_import = time.perf_counter() - t0
    if warm_run:  # one uncounted run first: lazy imports and first calls out of the numbers
        with contextlib.redirect_stdout(io.StringIO()), measured_here():
            cli.main(["run", "--no-progress", "--format", "json", *run_args])
    clock = Clock(torch.cuda.synchronize if torch.cuda.is_available() else lambda: None)
    instrument(clock)
    sink = io.StringIO()
    t1 = time.perf_counter()
    prof = cProfile.Profile() if top else None
    with contextlib.redirect_stdout(sink), measured_here():  # profiled in this process
        if prof:
            prof.enable()
        code = cli.main(["run", "--no-progress", "--format", "json", *run_args])
        if prof:
            prof.disable()
    total = time.perf_counter() - t1
    first = clock.first("kernel")
    repeat, fd_sums = clock.total["kernel"] - first, clock.total["fd"]
    rest = total - clock.total["kernel"] - fd_sums
    import gradcheck_bi
    where = Path(gradcheck_bi.__file__).resolve().parents[1]
    tree = "this tree" if where == ROOT else f"an older tree ({where.name})"
    second = ", the second run in it" if warm_run else ""
    print(f"\none warm process{second}: `run {' '.join(run_args)}` exit {code}, gradcheck_bi "
          f"from {tree}\n")
    print("| part | seconds | share of the run |\n| --- | ---: | ---: |")
    print(f"| imports (torch {t_torch:.2f} s, gradcheck-bi and the kernel's library) "
          f"| {t_import:.2f} | (before) |")
    calls = clock.calls["kernel"]
    rows = [("kernel first calls (compile / cache load / autotune), "
             f"{len(calls)} distinct", first),
            (f"kernel repeat calls ({sum(calls.values()) - len(calls)})", repeat),
            ("gradcheck-bi FD sums", fd_sums),
            ("gradcheck-bi's other Python and torch work", rest),
            ("the run (cli.main)", total)]
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"\ngradcheck-bi's own time (outside the kernel's calls): {fd_sums + rest:.2f} s "
          f"= {(fd_sums + rest) / total:.0%} of the run")
    for kind, head in (("kernel", "Function, phase"), ("fd", "FD sums: caller")):
        print(f"\n| {head}, tensor shapes | calls | first call s |\n| --- | ---: | ---: |")
        firsts = clock.first_seconds[kind]
        for key, n in sorted(clock.calls[kind].items(), key=lambda kv: -firsts[kv[0]]):
            text = ", ".join(f"{tuple(s)} {d}" for s, d in key[-1])
            print(f"| {'.'.join(key[:-1])} {text} | {n} | {firsts[key]:.3f} |")
    if prof:
        print(f"\ncProfile of the run (cumulative, top {top}; times inflated by the profiler):")
        print("```")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(top)
        print("```")
        print(f"\ncProfile of the run (own time, top {top}):")
        print("```")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)
        print("```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-fresh", action="store_true", help="only the in-process breakdown")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also print the N top functions of the run by cumulative time")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="import gradcheck_bi from here (an older tree, for before/after)")
    ap.add_argument("--warm-run", action="store_true",
                    help="break down a second run in the process (the first uncounted)")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("run_args", nargs="*", help="after --: arguments of `gradcheck-bi run`")
    opts = ap.parse_args()
    if opts.in_process:
        breakdown(opts.run_args, opts.cprofile, opts.warm_run)
        return
    if not opts.no_fresh:
        r = fresh_runs(opts.run_args, opts.reps, opts.root.resolve())
        med = statistics.median
        print(f"`run {' '.join(opts.run_args)}`, fresh processes, {opts.reps} each; "
              f"{r['verdict']}\n")
        print("| Triton cache | median s | runs s | compiled kernels | autotune passes |")
        print("| --- | ---: | --- | ---: | ---: |")
        print(f"| cold | {med(r['cold']):.2f} | {' '.join(f'{t:.1f}' for t in r['cold'])} "
              f"| {med(r['compiled']):.0f} | {med(r['tunes_cold']):.0f} |")
        print(f"| warm | {med(r['warm']):.2f} | {' '.join(f'{t:.1f}' for t in r['warm'])} "
              f"| – | {med(r['tunes_warm']):.0f} |")
        keys = r.get("keys_first_run", [])
        if keys:
            print(f"\nfirst cold run: {len(keys)} autotuner passes over {len(set(keys))} "
                  "distinct (function, key) pairs; each pair and its passes:")
            for key in sorted(set(keys)):
                print(f"  {keys.count(key)}× {key}")
        sys.stdout.flush()
    # The breakdown in a process of its own, on a Triton cache primed by one uncounted run
    # (the default cache of a fresh machine is cold: its first calls would be compiles).
    env = {**os.environ, "PYTHONPATH": str(opts.root.resolve())}
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache
        subprocess.run([sys.executable, "-m", "gradcheck_bi", "run", "--no-progress",
                        *opts.run_args], env=env, cwd=ROOT, capture_output=True, check=False)
        warm = ["--warm-run"] if opts.warm_run else []
        subprocess.run([sys.executable, __file__, "--in-process", "--cprofile",
                        str(opts.cprofile), *warm, "--", *opts.run_args], env=env, check=False)


if __name__ == "__main__":
    main()
