"""Summation orders: false alarms of correct kernels, scaled-gradient mutants, and
the detection thresholds of the dx / dw checks.

    PYTHONPATH=. python benchmarks/summation_orders.py orders     [--device cuda] [--quick]
    PYTHONPATH=. python benchmarks/summation_orders.py issue      [--device cuda]
    PYTHONPATH=. python benchmarks/summation_orders.py mutants    [--device cuda]
    PYTHONPATH=. python benchmarks/summation_orders.py thresholds [--device cuda]
    PYTHONPATH=. python benchmarks/summation_orders.py sums
    PYTHONPATH=. python benchmarks/summation_orders.py gpu        # one call on a lent GPU

* ``orders``: the correct kernels of tests/independent/orders.py (sequential, reversed,
  blocked, atomic) through forward, dx and dw at rows 1 … 8192 and D up to 16384, fp64 /
  fp32 / bf16 (dx only where rows · D² ≤ ``DX_BUDGET``: its cost); prints err/tol (a false
  alarm is > 1) and the check's ``detectable_rel``; points with rows · D above
  ``MAX_ELEMENTS`` are left out (memory). ``issue``: the same at the issue's shapes only.
* ``mutants``: the sequential kernel with dw × (1 + 1e-4) (fp32) / (1 + 1e-8) (fp64) and dx ×
  (1 + 1e-4) (fp32) at the issue's shapes; each must fail.
* ``thresholds``: the smallest relative scaling of dx / dw caught, from a 1-2-5 grid, beside
  the check's ``detectable_rel`` and torch.autograd.gradcheck's threshold at its defaults
  (atol 1e-5, rtol 1e-3: an element fails when ``|δ·g| > atol + rtol·|g|``, so its threshold
  is ``rtol + atol / max|g|``, from the same reference gradient).
* ``sums``: the rounding the model bounds, alone: sums of n terms (signed, of one sign, of
  mean 1) in each order against an extended-precision sum, in units of ``u·sqrt(V)``
  (gradcheck_bi/tolerance/summation.py): RMS and largest over 256-8192 sums.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "independent"))

ROWS = (1, 7, 256, 1000, 4096, 8192)
WIDTHS = (64, 255, 1024, 4099, 16384)
DX_BUDGET = 3e8  # rows · D² of the dx checks run (CPU: about a minute each at the top)
# rows · D of a point (the dw check holds ~10 copies of x in fp64): 23 GB of CPU memory here
MAX_ELEMENTS = {"cpu": 1 << 25, "cuda": 1 << 28}
MUTANT_POINTS = [((256, 1024), "fp64"), ((4096, 64), "fp64"),
                 ((256, 1024), "fp32"), ((4096, 256), "fp32")]
GPU_MUTANT_POINTS = [((8192, 512), "fp32"), ((4096, 1024), "fp32")]
THRESHOLD_POINTS = [((4, 1024), "fp64"), ((256, 1024), "fp64"), ((4096, 64), "fp64"),
                    ((4, 1024), "fp32"), ((256, 1024), "fp32"), ((4096, 256), "fp32"),
                    ((1, 16384), "fp32"), ((8192, 512), "fp32")]
BISECT_BUDGET = 3e7  # rows · D² up to which dx is bisected (each step is a full dx check)
GRID = [m * 10.0**e for e in range(-16, -1) for m in (1, 2, 5)]


def _run(fn, check: str, device: str, dtype: str, shape: tuple[int, ...], seed: int = 1):
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.vocab import Config

    return run_check(fn, Config(check=check, device=device, dtype=dtype, shape=shape,
                                seed=seed))


def _ratio(m) -> float:
    return m.details.get("ratio", m.max_abs_err / m.tolerance if m.tolerance else 0.0)


def _row(name: str, fn, check: str, device: str, dtype: str, shape: tuple[int, ...]):
    """Run one point and print its table row (err/tol, detectable_rel, seconds)."""
    t0 = time.perf_counter()
    m = _run(fn, check, device, dtype, shape)
    det = m.details.get("detectable_rel")
    print(f"| {name} | {dtype} | {shape} | {check} | {_ratio(m):.3g}"
          f"{'' if m.passed else ' **FALSE ALARM**'} | {'' if det is None else f'{det:.2g}'} | "
          f"{time.perf_counter() - t0:.1f} |", flush=True)
    return m


def _grid(device: str, quick: bool) -> list[tuple[tuple[int, int], str, list[str]]]:
    rows, widths = ((1, 256, 4096), (64, 1024)) if quick else (ROWS, WIDTHS)
    cap = MAX_ELEMENTS[device]
    return [((n, d), dtype, ["forward", "dw"] + (["dx"] if n * d * d <= DX_BUDGET else []))
            for dtype in ("fp64", "fp32", "bf16") for n in rows for d in widths
            if n * d <= cap]


def orders(device: str, quick: bool, issue: bool = False) -> int:
    import orders as kernels

    points = ([(s, dt, ["forward", "dx", "dw"]) for s, dt in MUTANT_POINTS] if issue
              else _grid(device, quick))
    print("| kernel | dtype | shape | check | err/tol | detectable_rel | s |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    alarms = worst = 0.0
    for shape, dtype, checks in points:
        for name, fn in kernels.KERNELS.items():
            for check in checks:
                m = _row(name, fn, check, device, dtype, shape)
                worst = max(worst, _ratio(m))
                alarms += not m.passed
    print(f"\n{int(alarms)} false alarms; worst err/tol {worst:.3g}")
    return int(alarms > 0)


def mutants(device: str) -> int:
    import orders as kernels

    points = MUTANT_POINTS + (GPU_MUTANT_POINTS if device == "cuda" else [])
    print("| mutant | dtype | shape | err/tol | caught |")
    print("| --- | --- | --- | ---: | --- |")
    missed = 0
    for shape, dtype in points:
        scale = 1e-4 if dtype == "fp32" else 1e-8
        cases = [("dw", f"dw × (1 + {scale:g})", dict(dw_scale=1 + scale))]
        if dtype == "fp32":
            cases.append(("dx", "dx × (1 + 1e-4)", dict(dx_scale=1 + 1e-4)))
        for check, label, kw in cases:
            m = _run(kernels.make("sequential", **kw), check, device, dtype, shape)
            missed += m.passed
            print(f"| {label} | {dtype} | {shape} | {_ratio(m):.3g} | "
                  f"{'MISSED' if m.passed else 'caught'} |", flush=True)
    print(f"\n{missed} missed")
    return int(missed > 0)


def thresholds(device: str) -> int:
    import orders as kernels

    print("| dtype | shape | check | smallest scaling caught | detectable_rel (median "
          "tol/|ref|) | torch gradcheck at its defaults |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for shape, dtype in THRESHOLD_POINTS:
        for check in ("dx", "dw"):
            base = _run(kernels.make("sequential"), check, device, dtype, shape)
            found = None
            lo, hi = 0, len(GRID) - 1  # caught is monotone in the scale: bisect the grid
            skip = check == "dx" and shape[0] * shape[1] ** 2 > BISECT_BUDGET and device == "cpu"
            if skip:  # too costly here: detectable_rel only
                lo = hi + 1
            while lo <= hi:
                mid = (lo + hi) // 2
                kw = {f"{check}_scale": 1 + GRID[mid]}
                if _run(kernels.make("sequential", **kw), check, device, dtype, shape).passed:
                    lo = mid + 1
                else:
                    found, hi = GRID[mid], mid - 1
            torch_thr = _torch_threshold(check, shape)
            shown = "not run" if skip else "none" if found is None else f"{found:g}"
            print(f"| {dtype} | {shape} | {check} | {shown}"
                  f" | {base.details['detectable_rel']:.2g} | {torch_thr} |", flush=True)
    return 0


def _torch_threshold(check: str, shape: tuple[int, ...]) -> str:
    """``rtol + atol / max|g|`` with the fp64 reference gradient of the same point."""
    import torch

    from gradcheck_bi.inputs import make_inputs
    from gradcheck_bi.vocab import Config

    x, w, g = make_inputs(Config(check=check, dtype="fp64", shape=shape, seed=1))
    x = x.requires_grad_(True)
    w = w.requires_grad_(True)
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    dx, dw = torch.autograd.grad(y, (x, w), g)
    gmax = float((dx if check == "dx" else dw).abs().max())
    return f"{1e-3 + 1e-5 / gmax:.2g}"


GPU_POINTS = [((256, 1024), "fp32", ["forward", "dx", "dw"]),
              ((1024, 512), "fp32", ["forward", "dx", "dw"]),
              ((4096, 256), "fp32", ["forward", "dx", "dw"]),
              ((8192, 512), "fp32", ["forward", "dx", "dw"]),
              ((8192, 4096), "fp32", ["forward", "dw"]), ((2048, 16384), "fp32", ["forward", "dw"]),
              ((8192, 512), "bf16", ["forward", "dx", "dw"]), ((8192, 512), "fp64", ["dw"])]


def gpu(budget_s: float = 200.0) -> int:
    """One call on a lent GPU: the orders at the GPU shapes, then the scaled mutants; stops
    starting new points after ``budget_s`` seconds (and says so)."""
    import orders as kernels
    import torch

    t_start = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| kernel | dtype | shape | check | err/tol | detectable_rel | s |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    alarms = 0
    for shape, dtype, checks in GPU_POINTS:
        for check in checks:
            for name, fn in kernels.KERNELS.items():
                if time.perf_counter() - t_start > budget_s:
                    print(f"(budget of {budget_s:.0f} s spent: {shape} {dtype} {check} and "
                          "later points not run)")
                    return mutants("cuda") or int(alarms > 0)
                alarms += not _row(name, fn, check, "cuda", dtype, shape).passed
    print(f"\n{alarms} false alarms, {time.perf_counter() - t_start:.0f} s\n")
    return mutants("cuda") or int(alarms > 0)


def sums() -> int:
    import numpy as np
    import orders as kernels
    import torch

    from gradcheck_bi.tolerance.summation import any_order_var

    print("| dtype | terms | n | sums | " + " | ".join(kernels.ORDERS) + " |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * len(kernels.ORDERS))
    for dtype in (torch.float32, torch.float64):
        u = float(torch.finfo(dtype).eps) / 2
        for kind in ("signed", "one sign", "mean 1"):
            for n in (64, 1024, 8192):
                cols = max(256, 2**19 // n)
                t = torch.randn(n, cols, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(n))
                t = t * t if kind == "one sign" else t + 1 if kind == "mean 1" else t
                t = t.to(dtype)
                t64 = t.to(torch.float64)
                exact = t64.numpy().astype(np.longdouble).sum(0)
                scale = u * any_order_var(t64.T).sqrt().numpy()
                cells = []
                for order in kernels.ORDERS:
                    got = kernels.ordered_sum(t.T.contiguous(), order).to(torch.float64)
                    z = np.abs(got.numpy().astype(np.longdouble) - exact).astype(float) / scale
                    cells.append(f"{np.sqrt((z ** 2).mean()):.2f} / {z.max():.2f}")
                print(f"| {str(dtype)[6:]} | {kind} | {n} | {cols} | " + " | ".join(cells)
                      + " |", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("part",
                        choices=("orders", "issue", "mutants", "thresholds", "sums", "gpu"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.part in ("orders", "issue"):
        return orders(args.device, args.quick, args.part == "issue")
    if args.part == "mutants":
        return mutants(args.device)
    if args.part == "sums":
        return sums()
    if args.part == "gpu":
        return gpu()
    return thresholds(args.device)


if __name__ == "__main__":
    sys.exit(main())
