"""How close a correct kernel sits to the ½-ulp bound in bf16/fp16, by construction.

A kernel that computes in fp32 and rounds each output once is off by just under ½ ulp at its
worst element; the forward's pass rule and the lifted gradients' tolerance are ½ ulp plus a
small margin. This prints, for ``after`` over shapes, γ controls, zcg and seeds, the worst
forward error in ulps and, for dx and dw, the reported element's error and tolerance in ulps
of the output (the numbers the tables' captions quote).

    PYTHONPATH=. python3 benchmarks/half_ulp_margin.py
"""

from __future__ import annotations

import itertools

from gradcheck_bi.checks import run_check
from gradcheck_bi.kernels.bundled.rmsnorm import After
from gradcheck_bi.vocab import Config

SHAPES = [(2, 8, 256), (4, 1000), (2, 3, 200), (2, 1030)]
CONTROLS = ["randn", "ones"]  # γ = zeros: every error is exactly 0


def main() -> None:
    print("| dtype | check | results | error (ulp) | tolerance (ulp) | error / tolerance |")
    print("| --- | --- | ---: | --- | --- | --- |")
    for dtype, check in itertools.product(("bf16", "fp16"), ("forward", "dx", "dw")):
        errs, tols = [], []
        for shape, control, zcg, seed in itertools.product(SHAPES, CONTROLS, (False, True),
                                                           (0, 1)):
            m = run_check(After, Config(check, dtype=dtype, shape=shape, control=control,
                                        zero_centered_gamma=zcg, seed=seed))
            assert m.passed, (dtype, check, shape, control, zcg, seed, m.message)
            ulp = float(m.details.get("ulp", 1.0))  # the forward is measured in ulps
            errs.append(m.max_abs_err / ulp)
            tols.append(m.tolerance / ulp)
        ratios = [e / t for e, t in zip(errs, tols, strict=True)]
        print(f"| {dtype} | {check} | {len(errs)} | {min(errs):.4f}–{max(errs):.4f} "
              f"| {min(tols):.4f}–{max(tols):.4f} | {min(ratios):.3f}–{max(ratios):.3f} |")


if __name__ == "__main__":
    main()
