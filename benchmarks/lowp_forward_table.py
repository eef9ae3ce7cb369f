"""The numbers behind the bf16/fp16 forward audit's pass rule (docs/low_precision.md).

    PYTHONPATH=. python3 benchmarks/lowp_forward_table.py [--device cpu|cuda]

Runs the forward check (gradcheck_bi.checks.rows.forward, the ulp audit of gradcheck_bi.lowp) on
two correct single-rounding kernels (`after`, tests/independent/rmsnorm_ref.py) and on the
three forward mutants that round twice (tests/mutants/m31-m33), over bf16/fp16 × D ∈ {64,
256, 1000, 4096} × 5 seeds × γ ∈ {randn, randn·100, ones} × zcg off/on. Prints, per kernel
and dtype, the worst fraction of elements not correctly rounded, the largest error in ulps,
the largest |mean signed error|, and how many configurations passed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mutants"))
sys.path.insert(0, str(ROOT))

import catalog  # noqa: E402

from gradcheck_bi.checks import run_check  # noqa: E402
from gradcheck_bi.kernels.bundled.rmsnorm import After  # noqa: E402
from gradcheck_bi.vocab import Config  # noqa: E402

WIDTHS = (64, 256, 1000, 4096)
GAMMAS = (("randn", 1.0), ("randn", 100.0), ("ones", 1.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    kernels = {"after": After,
               "independent": catalog.load("rmsnorm_ref", "IndependentRMSNorm")}
    for stem in ("m31_lowp_zcg_offset_in_input_dtype", "m32_lowp_rsigma_rounded",
                 "m33_lowp_normalised_row_cast_down"):
        kernels[stem[:3]] = catalog.load(stem)
    print("| kernel | dtype | configs | passed | worst fraction not correctly rounded "
          "| max ulp | max \\|mean signed\\| ulp |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, fn in kernels.items():
        for dtype in ("bf16", "fp16"):
            n = passed = 0
            frac = ulp = bias = 0.0
            for d, seed, (control, scale), zcg in itertools.product(
                    WIDTHS, range(5), GAMMAS, (False, True)):
                shape = (max(1, 16384 // d), d)
                m = run_check(fn, Config(check="forward", device=args.device, dtype=dtype,
                                             shape=shape, seed=seed, control=control,
                                             weight_scale=scale, zero_centered_gamma=zcg))
                n += 1
                passed += m.passed
                frac = max(frac, m.details["not_correctly_rounded_y"])
                ulp = max(ulp, m.details["max_ulp_y"])
                bias = max(bias, abs(m.details["mean_signed_ulp_y"]))
            print(f"| {name} | {dtype} | {n} | {passed} | {frac:.3g} | {ulp:.4g} | {bias:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
