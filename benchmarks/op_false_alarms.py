"""False alarms of the row ops (the norms): ≥ 200 random configurations per dtype per op,
and the smallest defect each op's checks catch.

    PYTHONPATH=. python benchmarks/op_false_alarms.py [N] [--dtypes fp64,fp32,bf16] [--ops OP,…]
        [--device cuda] [--no-power]

Every check of each op's correct kernel (tests/independent/op_false_alarms.py: KERNELS) at
N seeded random configurations per op and dtype (the same module draws them); prints the
table docs/false_alarms.md records and exits 1 on any false alarm. bf16/fp16: the
forward's ulp audit and the lifted gradients (err/tol ≈ 1 is an element near a rounding
midpoint: the tolerance is the ½-ulp bound itself plus fp32 noise).

Detection power (``--no-power`` skips it), fp64 and fp32, as benchmarks/shaped_false_alarms.py
measures it for the ops of any shape: the correct kernel with every output's cotangent
multiplied by ``1 + δ`` in its backward (every input and parameter gradient off by a
relative δ), at the op's default point (Config's defaults: shape (2, 8, 256), γ = randn,
seed 0, contiguous); the smallest δ in 1e-1 … 1e-12 that some gradient check fails. N = 0
measures it alone.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from gradcheck_bi.checks import run_check
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.ops import ROWS
from gradcheck_bi.sweep import checks_of
from gradcheck_bi.vocab import Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "independent"))
# after tests/independent: its op_false_alarms, not this one
sys.path.append(str(Path(__file__).resolve().parent))
import op_false_alarms
from merge_false_alarms import DTYPE_ORDER, markdown
from shaped_false_alarms import POWER_DTYPES, off_by, smallest


class DefectiveNorm:
    """A correct norm kernel (behind ``call``, as the checks call it) whose every input and
    parameter gradient is off by a relative ``delta``."""

    def __init__(self, kernel: Any, delta: float) -> None:
        self.kernel, self.delta = as_op_kernel(kernel), delta
        self.op = self.kernel.op
        self.absent = getattr(self.kernel, "absent", frozenset())

    def call(self, inputs: Any, params: Any, options: Any, zcg: bool) -> Any:
        return off_by(self.kernel.call(inputs, params, options, zcg), self.delta)


def smallest_caught(op: str, dtype: str, device: str = "cpu") -> float | None:
    """The smallest relative defect δ ∈ [1e-12, 1e-1] some gradient check of ``op``'s correct
    kernel catches at the default point (None: not even 1e-1)."""
    spec = op_false_alarms.kernel(op_false_alarms.KERNELS[op])
    cfgs = [Config(check=c, op=op, dtype=dtype, device=device)
            for c in checks_of(spec) if c in ROWS[op].gradient_checks]
    assert all(run_check(spec.fn, cfg).passed for cfg in cfgs), "correct kernel fails"
    return smallest(lambda delta: any(not run_check(DefectiveNorm(spec.fn, delta), cfg).passed
                                      for cfg in cfgs))[0]


def rows(tallies: dict[tuple[str, str, str], dict[str, Any]],
         power: dict[tuple[str, str], float | None], device: str) -> list[dict[str, Any]]:
    """One row per (op, dtype), as benchmarks/shaped_false_alarms.py's table has them: its
    checks' tallies added up, the smallest defect caught beside them."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (op, dtype, _), t in tallies.items():
        r = out.setdefault((op, dtype), {
            "op": op, "dtype": dtype, "device": device, "configurations": t["count"],
            "results": 0, "false_alarms": 0, "worst_err_tol": 0.0, "seconds": 0.0,
            "power_measured": (op, dtype) in power,
            "smallest_defect": power.get((op, dtype))})
        r["results"] += t["count"]
        r["false_alarms"] += t["failures"]
        r["worst_err_tol"] = max(r["worst_err_tol"], t["worst_ratio"])
        r["seconds"] += t["seconds"]
    for r in out.values():
        r["s_per_configuration"] = r["seconds"] / r["configurations"]
    return [out[k] for k in sorted(out, key=lambda k: (k[0], DTYPE_ORDER.index(k[1])))]


def main() -> int:
    args = sys.argv[1:]
    n = int(args[0]) if args and args[0].isdigit() else 200
    dtypes = ("fp64", "fp32")
    if "--dtypes" in args:
        dtypes = tuple(args[args.index("--dtypes") + 1].split(","))
    ops = (tuple(args[args.index("--ops") + 1].split(",")) if "--ops" in args
           else tuple(op_false_alarms.KERNELS))
    unknown = [op for op in ops if op not in op_false_alarms.KERNELS]
    if unknown:
        print(f"op_false_alarms: no correct kernel for {', '.join(unknown)}; the row ops here: "
              f"{', '.join(op_false_alarms.KERNELS)}", file=sys.stderr)
        return 2
    device = args[args.index("--device") + 1] if "--device" in args else "cpu"
    started = time.perf_counter()
    power: dict[tuple[str, str], float | None] = {}
    if "--no-power" not in args:
        for op in ops:
            for dtype in (d for d in dtypes if d in POWER_DTYPES):
                power[op, dtype] = smallest_caught(op, dtype, device)
                print(f"{op} {dtype}: smallest defect caught {power[op, dtype]}",
                      file=sys.stderr)
    tallies: dict = {}
    for dtype in dtypes if n else ():  # N per dtype: one run per dtype
        tallies.update(op_false_alarms.run(n, (dtype,), device, ops=ops,
                                           log=lambda s: print(s, file=sys.stderr)))
    header = (f"{n} random configurations per op and dtype, {device.upper()}, "
              f"{time.perf_counter() - started:.0f} s")
    print(op_false_alarms.summary(tallies, header))
    print()
    print(markdown(rows(tallies, power, device)))
    bad = [m for t in tallies.values() for m in t["messages"]]
    for m in bad:
        print("FALSE ALARM:", m)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
