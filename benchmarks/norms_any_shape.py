"""RMSNorm and LayerNorm as ops of any shape (tests/kernels/norms_any_shape.py) through the
shaped engine: each kernel's default sweep, the results that are not a pass grouped by check,
the axes off their default and the layout (docs/shaped_ops.md, "A norm as an op of any shape").

    PYTHONPATH=. python benchmarks/norms_any_shape.py sweep OP DTYPE SHAPE|- KERNEL …
    PYTHONPATH=. python benchmarks/norms_any_shape.py time [SHAPE] [DTYPE]
    PYTHONPATH=. python benchmarks/norms_any_shape.py false-alarms N

``false-alarms``: N random configurations per op and dtype (fp64, fp32) drawn as
benchmarks/shaped_false_alarms.py draws them, the correct kernels (:data:`CORRECT`).

``time``: dx of the bundled RMSNorm at SHAPE (default 64,8192, fp32) by the row engine (op
rms_norm) and the shaped engine (rms_norm_any, dx and dw), each twice in one process.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kernels"))
import norms_any_shape as nas  # noqa: E402

from gradcheck_bi.checks import run_check  # noqa: E402
from gradcheck_bi.checks.shaped import run_shaped_check  # noqa: E402
from gradcheck_bi.kernels import resolve  # noqa: E402
from gradcheck_bi.measure import PointMeasurer  # noqa: E402
from gradcheck_bi.sweep import Sweep, shaped_points  # noqa: E402
from gradcheck_bi.vocab import Config  # noqa: E402

BUNDLED = "gradcheck_bi/kernels/bundled/rmsnorm.py:After"
CORRECT = {"rms_norm_any": BUNDLED, "layer_norm_any": "tests/kernels/layer_norm.py:LayerNorm"}


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


def sweep(op: str, dtype: str, shape: str, refs: list[str]) -> None:
    record = nas.ANY[op]
    default = dict(record.variants()[0].values)
    for ref in refs:
        start = time.time()
        spec = resolve(ref, {"op": op})
        sw = Sweep(kernels=[spec.ref], targets=[("cpu", dtype)],
                   **({"shapes": [_shape(shape)]} if shape != "-" else {}))
        measure = PointMeasurer()
        results = [measure(spec, cfg, sw) for _, cfg in shaped_points(sw, [spec])]
        where: Counter[str] = Counter()
        for r in results:
            if r.status != "pass":
                moved = [f"{k}={v}" for k, v in (r.variant or {}).items() if default.get(k) != v]
                where[" ".join([r.check, *moved]
                               + ([r.layout] if r.layout != "contiguous" else []))] += 1
        print(f"| {ref.rsplit('/', 1)[-1]} | {dtype} | {len(results)} | {sum(where.values())} "
              f"| {'; '.join(where) or '—'} | {time.time() - start:.0f} |")


def timing(shape: tuple[int, ...], dtype: str) -> None:
    row = resolve(BUNDLED)
    for _ in range(2):
        start = time.perf_counter()
        m = run_check(row.fn, Config(check="dx", dtype=dtype, shape=shape, op="rms_norm"))
        print(f"row    dx {shape} {dtype}: {time.perf_counter() - start:.2f} s "
              f"passed={m.passed} err={m.max_abs_err:.3e} tol={m.tolerance:.3e}")
    spec = resolve(BUNDLED, {"op": nas.RMS_NORM_ANY.name})
    variant = nas.RMS_NORM_ANY.variants()[0].values
    for check in ("dx", "dw"):
        for _ in range(2):
            start = time.perf_counter()
            m = run_shaped_check(spec.fn, Config(check=check, dtype=dtype, shape=shape,
                                                 op=nas.RMS_NORM_ANY.name, variant=variant))
            d = m.details
            print(f"shaped {check} {shape} {dtype}: {time.perf_counter() - start:.2f} s "
                  f"passed={m.passed} err={m.max_abs_err:.3e} tol={m.tolerance:.3e} "
                  f"colours {d.get('colours')}, {d.get('checked_per_element')} of "
                  f"{d.get('elements')} per element, {d.get('directions')} directions")


def false_alarms(n: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from shaped_false_alarms import configs

    for op, ref in CORRECT.items():
        spec = resolve(ref, {"op": op})
        for dtype in ("fp64", "fp32"):
            start, results, alarms, worst = time.time(), 0, 0, 0.0
            measure, sw = PointMeasurer(), Sweep(kernels=[spec.ref], targets=[("cpu", dtype)])
            for i, cfgs in enumerate(configs(nas.ANY[op], spec, dtype, n, 20261203)):
                for cfg in cfgs:
                    r = measure(spec, cfg, sw)
                    results += 1
                    if r.status != "pass":
                        alarms += 1
                        print(f"FALSE ALARM {op} {dtype} #{i} {cfg}: {r.message}")
                    elif r.tolerance and r.max_abs_err is not None:
                        worst = max(worst, r.max_abs_err / r.tolerance)
            print(f"{op} {dtype}: {n} configurations, {results} results, {alarms} false "
                  f"alarms, worst err/tol {worst:.3f}, {time.time() - start:.0f} s")


def main(argv: list[str]) -> None:
    with nas.registered():
        if argv[0] == "sweep":
            sweep(argv[1], argv[2], argv[3], argv[4:])
        elif argv[0] == "false-alarms":
            false_alarms(int(argv[1]))
        else:
            timing(_shape(argv[1]) if len(argv) > 1 else (64, 8192),
                   argv[2] if len(argv) > 2 else "fp32")


if __name__ == "__main__":
    main(sys.argv[1:])
