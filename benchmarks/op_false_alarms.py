"""False alarms of the other row ops: ≥ 200 random configurations per dtype per op.

    PYTHONPATH=. python benchmarks/op_false_alarms.py [N] [--dtypes fp64,fp32,bf16] [--ops OP,…]
        [--device cuda]

Every check of each op's correct kernel (tests/kernels/) at N seeded random configurations
per op and dtype (tests/independent/op_false_alarms.py draws them); prints the table
docs/ops.md records and exits 1 on any false alarm. bf16/fp16: the forward's ulp audit and
the lifted gradients (err/tol ≈ 1 is an element near a rounding midpoint: the tolerance is
the ½-ulp bound itself plus fp32 noise).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "independent"))
import op_false_alarms


def main() -> int:
    args = sys.argv[1:]
    n = int(args[0]) if args and args[0].isdigit() else 200
    dtypes = ("fp64", "fp32")
    if "--dtypes" in args:
        dtypes = tuple(args[args.index("--dtypes") + 1].split(","))
    ops = tuple(args[args.index("--ops") + 1].split(",")) if "--ops" in args else None
    device = args[args.index("--device") + 1] if "--device" in args else "cpu"
    started = time.perf_counter()
    tallies: dict = {}
    for dtype in dtypes:  # N per dtype: one run per dtype
        tallies.update(op_false_alarms.run(n, (dtype,), device, ops=ops,
                                           log=lambda s: print(s, file=sys.stderr)))
    header = (f"{n} random configurations per op and dtype, {device.upper()}, "
              f"{time.perf_counter() - started:.0f} s")
    print(op_false_alarms.summary(tallies, header))
    bad = [m for t in tallies.values() for m in t["messages"]]
    for m in bad:
        print("FALSE ALARM:", m)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
