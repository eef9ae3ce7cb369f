"""What does a full check cost on CPU? Side by side with torch.autograd.gradcheck,
the (16, 8192) full check (time and peak RSS), the CLI end to end, growth in D and rows, and
the noise floor beside the error of a defect.

    PYTHONPATH=. python3 benchmarks/cpu_cost.py            # everything (make bench)
    PYTHONPATH=. python3 benchmarks/cpu_cost.py --only big  # one section

Each timed measurement runs in a fresh subprocess, so peak RSS is that measurement's own.
``--threads N`` pins torch's threads in those subprocesses to N (default: as the CLI chooses).
Prints markdown tables for docs/benchmarks.md. A check against its forward floor:
benchmarks/ops_floor.py (``--op rms_norm --dtype fp64 --shape 16,8192`` for this script's shape).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup(threads: int | None) -> None:
    """Threads as the CLI sets them: ``--threads N`` pins every op to N; by default the
    finite-difference loop chooses by chunk size and every other op runs on one thread."""
    from gradcheck_bi.cli.run import set_threads

    set_threads(threads)


def measure_ours(shape: tuple[int, ...], dtype: str = "fp64", checks: str = "dx,dw",
                 mode: str = "full") -> dict[str, Any]:
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.kernels.bundled.rmsnorm import After
    from gradcheck_bi.vocab import Config

    out: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
    t0, c0 = time.perf_counter(), time.process_time()
    for name in checks.split(","):
        t = time.perf_counter()
        m = run_check(After, Config(check=name, shape=shape, dtype=dtype, mode=mode))
        out[name] = {"seconds": time.perf_counter() - t, "passed": m.passed,
                     "max_abs_err": m.max_abs_err, "tolerance": m.tolerance,
                     "forward_calls": m.details.get("forward_calls")}
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0
    return out


def measure_gradcheck(shape: tuple[int, ...]) -> dict[str, Any]:
    import torch

    from gradcheck_bi.inputs import make_inputs
    from gradcheck_bi.kernels.bundled.rmsnorm import After
    from gradcheck_bi.vocab import Config

    x, w, _ = make_inputs(Config(check="dx", shape=shape))
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    t = time.perf_counter()
    ok = torch.autograd.gradcheck(lambda a, b: After.apply(a, b, 1e-6, False), (xr, wr),
                                  fast_mode=False)
    return {"seconds": time.perf_counter() - t, "passed": bool(ok)}


def side_by_side(shape: tuple[int, ...]) -> dict[str, Any]:
    """One process: ours cold (the first call in the process), ours warm, then
    torch.autograd.gradcheck."""
    cold = measure_ours(shape)
    warm = measure_ours(shape)
    return {"cold": cold, "warm": warm, "gradcheck": measure_gradcheck(shape)}


def noise_table() -> dict[str, Any]:
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.kernels.bundled.rmsnorm import After, Before
    from gradcheck_bi.vocab import Config

    rows = {}
    for dtype in ("fp64", "fp32"):
        after = run_check(After, Config(check="dx", dtype=dtype))
        before = {w: run_check(Before, Config(check="dx", dtype=dtype, control=w))
                  for w in ("randn", "ones")}
        # Largest error anywhere and largest floor (the verdict itself is per element).
        err = {w: m.details["max_abs_err_any"] for w, m in before.items()}
        rows[dtype] = {
            "floor": after.details["noise_floor_max"],
            "after_randn_err": after.details["max_abs_err_any"],
            "before_randn_err": err["randn"], "before_ones_err": err["ones"],
            "ratio": err["randn"] / max(err["ones"], 1e-300),
        }
    return rows


def _child(args: argparse.Namespace) -> None:
    _setup(args.threads)
    spec = json.loads(args.child)
    kind = spec.pop("kind")
    if kind == "ours":
        if spec.get("warm"):  # pay torch's one-time autograd import outside the timing
            measure_ours((2, 16))
        res = measure_ours(tuple(spec["shape"]), spec.get("dtype", "fp64"),
                           spec.get("checks", "dx,dw"), spec.get("mode", "full"))
    elif kind == "side":
        res = side_by_side(tuple(spec["shape"]))
    else:
        res = noise_table()
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(res))


def run_child(spec: dict[str, Any], threads: int | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    if threads:
        cmd += ["--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def machine() -> str:
    import torch

    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPUs ({model}), python {platform.python_version()}, "
            f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
            f"load average at start {load:.2f}")


def section_gradcheck(threads: int | None) -> None:
    shape = (8, 1024)
    res = run_child({"kind": "side", "shape": shape}, threads)
    cold, ours, ref = res["cold"], res["warm"], res["gradcheck"]
    print("\n### (8, 1024) fp64 CPU: dx + dw vs torch.autograd.gradcheck(fast_mode=False)\n")
    print("One process, `after` kernel, γ randn, zcg off.\n")
    print("| what | seconds | speed-up vs gradcheck | result |\n| --- | ---: | ---: | --- |")
    print(f"| torch.autograd.gradcheck (x and w) | {ref['seconds']:.2f} | 1x | {ref['passed']} |")
    for label, r in (("gradcheck-bi dx + dw, first call in the process", cold),
                     ("gradcheck-bi dx + dw, second call", ours)):
        print(f"| {label} | {r['seconds']:.3f} | {ref['seconds'] / r['seconds']:.0f}x | "
              f"dx {r['dx']['passed']}, dw {r['dw']['passed']} |")
    print("\ntarget: >= 100x")


def section_big(threads: int | None) -> None:
    shape = (16, 8192)
    res = run_child({"kind": "ours", "shape": shape}, threads)
    print("\n### (16, 8192) fp64 CPU, every element of dx and dw\n")
    print("| check | seconds | forward calls | max abs err | tolerance | passed |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name in ("dx", "dw"):
        r = res[name]
        print(f"| {name} | {r['seconds']:.2f} | {r['forward_calls']} | "
              f"{r['max_abs_err']:.3e} | {r['tolerance']:.3e} | {r['passed']} |")
    print(f"| **total** | **{res['seconds']:.2f}** | | | | target <= 20 s |")
    print(f"\nprocess CPU time {res['cpu_seconds']:.2f} s (wall above also counts time the "
          "process waited for a core on a shared machine)")
    print(f"\npeak RSS of the measuring process: {res['peak_rss_mib']:.0f} MiB "
          "(target <= 4096 MiB)")


def section_cli(threads: int | None, reps: int = 3) -> None:
    cmd = [sys.executable, "-m", "gradcheck_bi", "run", "--dtype", "fp64", "--device", "cpu",
           "--no-progress", "--format", "json"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    times, code = [], None
    for _ in range(reps):
        t = time.perf_counter()
        code = subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT).returncode
        times.append(time.perf_counter() - t)
    print("\n### `gradcheck-bi run --dtype fp64 --device cpu`, process start to exit\n")
    print("| runs | min s | median s | max s | exit |\n| ---: | ---: | ---: | ---: | ---: |")
    times.sort()
    print(f"| {reps} | {times[0]:.2f} | {times[len(times) // 2]:.2f} | {times[-1]:.2f} | "
          f"{code} |")


def _slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(v) for v in xs], [math.log(v) for v in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    cov = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    return cov / sum((a - mx) ** 2 for a in lx)


def section_growth(threads: int | None) -> None:
    print("\n### Growth of the full dx check (fp64 CPU)\n")
    print("| rows | D | seconds | forward calls | ns per perturbed element |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    ds = [256, 512, 1024, 2048, 4096]
    by_d = []
    for d in ds:
        r = run_child({"kind": "ours", "shape": (16, d), "checks": "dx", "warm": 1},
                      threads)
        by_d.append(r["dx"]["seconds"])
        ns = r["dx"]["seconds"] / (4 * 16 * d * d) * 1e9
        print(f"| 16 | {d} | {r['dx']['seconds']:.3f} | {r['dx']['forward_calls']} | {ns:.2f} |")
    rows = [4, 16, 64, 256]
    by_r = []
    for n in rows:
        r = run_child({"kind": "ours", "shape": (n, 1024), "checks": "dx", "warm": 1},
                      threads)
        by_r.append(r["dx"]["seconds"])
        ns = r["dx"]["seconds"] / (4 * n * 1024 * 1024) * 1e9
        print(f"| {n} | 1024 | {r['dx']['seconds']:.3f} | {r['dx']['forward_calls']} | "
              f"{ns:.2f} |")
    print(f"\nlog-log slope: time ~ D^{_slope(ds, by_d):.2f} (rows 16), "
          f"time ~ rows^{_slope(rows, by_r):.2f} (D 1024)")


def section_noise(threads: int | None) -> None:
    res = run_child({"kind": "noise"}, threads)
    print("\n### Noise floor and discrimination, dx, shape (2, 8, 256), seed 0\n")
    print("| dtype | largest estimated floor (per-element tolerance) | after randn err | "
          "before randn err | "
          "before ones err | ratio | targets |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    targets = {"fp64": "after err <= 1e-10, ratio >= 1e8",
               "fp32": "after err <= 3e-5, ratio >= 1e4"}
    for dtype in ("fp64", "fp32"):
        r = res[dtype]
        print(f"| {dtype} | {r['floor']:.3e} | {r['after_randn_err']:.3e} | "
              f"{r['before_randn_err']:.3e} | {r['before_ones_err']:.3e} | "
              f"{r['ratio']:.2e} | {targets[dtype]} |")


SECTIONS = {"gradcheck": section_gradcheck, "big": section_big, "cli": section_cli,
            "growth": section_growth, "noise": section_noise}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    _setup(args.threads)
    print(f"machine: {machine()}")
    started = time.perf_counter()
    for name in args.only or list(SECTIONS):
        SECTIONS[name](args.threads)
        sys.stdout.flush()
    print(f"\n(benchmark wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
