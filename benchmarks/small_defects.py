"""The small-defect runs of docs/small_defects.md: m21-m24 at their primary check.

    PYTHONPATH=. python benchmarks/small_defects.py [--json OUT]

Each row is one mutant at its primary check, γ = randn, zcg off, eps 1e-6, seed 5, on CPU,
at the shapes, dtypes and input scales of the table in docs/small_defects.md; it prints the
largest |analytic - FD| anywhere, the tolerance at the element with the largest
error/tolerance, that ratio (caught iff > 1) and the verdict. Run it on two trees (before and
after a tolerance change) to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "mutants"))

# (mutant, check, dtype, shape, input scale)
POINTS = [
    *[("m21_dx_approx_rsqrt", "dx", dt, s, 1.0)
      for dt in ("fp32", "fp64") for s in ((1, 4096), (2, 256), (2, 1030))],
    *[("m22_dw_rsigma_18_bits", "dw", dt, s, 1.0)
      for dt in ("fp32", "fp64") for s in ((1, 4096), (2, 256), (2, 1030))],
    *[("m23_dx_eps_scaled", "dx", dt, s, sc) for dt in ("fp32", "fp64")
      for s, sc in (((1, 4096), 1.0), ((2, 256), 1.0), ((2, 1030), 1.0), ((3, 4, 64), 1e-4))],
    *[("m24_dx_variance_d_minus_1_wide", "dx", dt, s, 1.0)
      for dt in ("fp32", "fp64") for s in ((1, 4096), (2, 256), (2, 1030))],
]


def main() -> int:
    import catalog

    from gradcheck_bi.checks import run_check
    from gradcheck_bi.vocab import Config

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print("| mutant | dtype | shape | input scale | largest error | tolerance (at the worst "
          "element) | err/tol | verdict |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for stem, check, dtype, shape, scale in POINTS:
        cfg = Config(check=check, dtype=dtype, shape=shape, eps=1e-6, seed=5,
                     input_scale=scale)
        m = run_check(catalog.load(stem), cfg)
        ratio = m.details.get("ratio", m.max_abs_err / m.tolerance)
        any_err = m.details.get("max_abs_err_any", m.max_abs_err)
        verdict = "missed" if m.passed else "**caught**"
        rows.append(dict(mutant=stem, dtype=dtype, shape=list(shape), scale=scale,
                         err=any_err, tol=m.tolerance, ratio=ratio, caught=not m.passed))
        print(f"| {stem} | {dtype} | {'×'.join(map(str, shape))} | {scale:g} | {any_err:.2e} "
              f"| {m.tolerance:.2e} | {ratio:.3g} | {verdict} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
