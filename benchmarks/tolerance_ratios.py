"""Tolerance / measured error of correct kernels: how far the floor sits above a true error.

    PYTHONPATH=. python3 benchmarks/tolerance_ratios.py [--device cpu] [--dtype fp32 ...]
        [--d 256 1024 ...] [--controls randn ones zeros] [--kernels after independent]
        [--no-zcg] [--jsonl out.jsonl]

For ``after`` and the independent RMSNorm (tests/independent/rmsnorm_ref.py), dx and dw, every
γ control and zcg, at each D (shape (4, D) up to 1024, (2, 4096), (1, 8192); seed 1000 + D):
``tol/err`` is ``1 / ratio`` — the tolerance over the error at the element nearest its own
tolerance, i.e. how much a correct kernel's error could grow before the check fails (the
target since ae0a4cc is ≤ 10). γ = zeros makes ``y ≡ 0``: dx is exactly 0 with tolerance 0 (0/0
passes, reported as "exact"). With γ = ones or zeros the effective weight is the same bits
under zcg on and off, so zcg = on is run for γ = randn only. Prints a Markdown table of the
min–max over the two kernels per (D, dtype, check, γ).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "independent"))
sys.path.insert(0, str(ROOT))

from rmsnorm_ref import IndependentRMSNorm  # noqa: E402

from gradcheck_bi.checks import run_check  # noqa: E402
from gradcheck_bi.kernels.bundled.rmsnorm import After  # noqa: E402
from gradcheck_bi.vocab import Config  # noqa: E402


def shape_for(d: int) -> tuple[int, int]:
    return (4, d) if d <= 1024 else (2, d) if d <= 4096 else (1, d)


KERNELS = {"after": After, "independent": IndependentRMSNorm}


def measure(device: str, dtypes: list[str], widths: list[int], out: Path | None,
            controls: list[str], kernels: list[str], zcg_on: bool = True) -> list[dict]:
    plan = [(c, False) for c in controls]
    if zcg_on and "randn" in controls:
        plan.insert(1, ("randn", True))
    rows = []
    for d in widths:
        for dtype in dtypes:
            for kname in kernels:
                fn = KERNELS[kname]
                for check in ("dx", "dw"):
                    for control, zcg in plan:
                        cfg = Config(check=check, device=device, dtype=dtype, shape=shape_for(d),
                                     seed=1000 + d, control=control, zero_centered_gamma=zcg)
                        t0 = time.perf_counter()
                        m = run_check(fn, cfg)
                        det = m.details
                        row = dict(device=device, D=d, dtype=dtype, kernel=kname, check=check,
                                   control=control, zcg=zcg, passed=m.passed, err=m.max_abs_err,
                                   tol=m.tolerance, ratio=det["ratio"],
                                   max_err_any=det["max_abs_err_any"],
                                   floor_max=det["noise_floor_max"], lam=det["noise_scale"],
                                   u_eff=det["u_eff"], s=time.perf_counter() - t0)
                        rows.append(row)
                        if out:
                            with out.open("a") as fh:
                                fh.write(json.dumps(row) + "\n")
                        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["device"], r["D"], r["dtype"], r["check"], r["control"]), []).append(r)
    lines = ["| device | D | dtype | check | γ | tol/err (min–max) | max err | floor (max) | λ "
             "| pass |",
             "| --- | ---: | --- | --- | --- | --- | ---: | ---: | ---: | --- |"]
    for (dev, d, dtype, check, control), rs in sorted(groups.items()):
        inv = [1 / r["ratio"] for r in rs if r["ratio"] > 0]
        span = f"{min(inv):.1f}–{max(inv):.1f}" if inv else "exact (0/0)"
        lines.append(
            f"| {dev} | {d} | {dtype} | {check} | {control} | {span} | "
            f"{max(r['max_err_any'] for r in rs):.2e} | {max(r['floor_max'] for r in rs):.2e} | "
            f"{min(r['lam'] for r in rs):.2f}–{max(r['lam'] for r in rs):.2f} | "
            f"{'all' if all(r['passed'] for r in rs) else 'NO'} |")
    worst = max((1 / r["ratio"] for r in rows if r["ratio"] > 0), default=0.0)
    lines += ["", f"{len(rows)} checks; largest tol/err {worst:.2f}; "
              f"{sum(not r['passed'] for r in rows)} failed."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", nargs="+", default=["fp32", "fp64"])
    p.add_argument("--d", nargs="+", type=int, default=[256, 1024, 4096, 8192])
    p.add_argument("--controls", nargs="+", default=["randn", "ones", "zeros"])
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    p.add_argument("--no-zcg", action="store_true", help="skip zcg = on (γ = randn)")
    p.add_argument("--jsonl", type=Path, default=None)
    a = p.parse_args()
    rows = measure(a.device, a.dtype, a.d, a.jsonl, a.controls, a.kernels, not a.no_zcg)
    print(table(rows))
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
