"""Both mutant catalogues on a GPU: does every defect the CPU suite catches show on CUDA?

    PYTHONPATH=. python3 benchmarks/gpu_mutants.py [--device cuda] [--catalogue family]

For each mutant of tests/mutants/ (RMSNorm, m01–m35) and tests/mutants/ops/ (the family),
its ``fast`` point must fail and its ``blind`` points must pass — as tests/test_mutants.py
and tests/test_op_mutants.py require on CPU — here on ``--device``, in the catalogue's
dtype (fp64 for the formula defects, bf16 for the mis-roundings). The correct kernels
(``after``; tests/kernels/ for the family) must pass every one of those points. Then, as
information only, the fp64 fast points again in fp32 and the bf16 ones in fp16. Prints
Markdown; exits 1 on any point not as the CPU suite expects.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "mutants"), str(ROOT / "tests" / "mutants" / "ops")]

import catalog  # noqa: E402
import ops_catalog  # noqa: E402

from gradcheck_bi import runner  # noqa: E402


def _worst(results: list[Any]) -> str:
    ratios = [r.max_abs_err / r.tolerance for r in results
              if r.max_abs_err is not None and r.tolerance]
    return f"{max(ratios):.3g}" if ratios else "–"


class Table:
    """Rows of the printed table and whether each was as the CPU suite expects."""

    def __init__(self, miss: str = "**unexpected**") -> None:
        self.rows: list[str] = []
        self.oks: list[bool] = []
        self.miss = miss  # the last column of a row not as wanted

    def add(self, stem: str, what: str, dtype: str, want: str, results: list[Any]) -> None:
        got = sorted({r.status for r in results}) or ["none"]
        ok = bool(results) and got == [want]
        self.rows.append(f"| {stem} | {what} | {dtype} | {want} | {'/'.join(got)} "
                         f"| {_worst(results)} | {'' if ok else self.miss} |")
        self.oks.append(ok)


OTHER = {"fp64": "fp32", "bf16": "fp16"}  # the information-only dtype of a fast point


def rmsnorm_rows(device: str) -> tuple[Table, Table]:
    from gradcheck_bi.kernels.bundled.rmsnorm import After

    main, extra = Table(), Table("not caught")
    for m in catalog.MUTANTS:
        fn = catalog.load(m.stem, m.attr)
        fast = f"fast {m.fast[0]} γ={m.fast[1]}"
        main.add(m.stem, fast, m.dtype, "fail",
                 catalog.run_points(fn, m.stem, [m.fast], m.dtype, device, m.precision))
        if m.blind:
            main.add(m.stem, f"{len(m.blind)} blind", m.dtype, "pass",
                     catalog.run_points(fn, m.stem, list(m.blind), m.dtype, device,
                                        m.precision))
        main.add(f"after ({m.stem})", "fast + blind", m.dtype, "pass",
                 catalog.run_points(After, "after", [m.fast, *m.blind], m.dtype, device,
                                    m.precision))
        extra.add(m.stem, fast, OTHER[m.dtype], "fail",
                  catalog.run_points(fn, m.stem, [m.fast], OTHER[m.dtype], device, m.precision))
    return main, extra


def op_rows(device: str, ops: tuple[str, ...] = ()) -> tuple[Table, Table]:
    main, extra = Table(), Table("not caught")
    for m in ops_catalog.MUTANTS:
        if ops and m.op not in ops:
            continue
        op = None if m.by_name else m.op  # the ops beyond norms are named with --op

        def points(ref: str, pts: list[Any], op: str | None = op) -> list[Any]:
            return ops_catalog.run_points(ref, pts, device, op)

        main.add(m.stem, m.fast.label(), m.fast.dtype, "fail", points(m.ref, [m.fast]))
        if m.blind:
            main.add(m.stem, f"{len(m.blind)} blind", "as listed", "pass",
                     points(m.ref, list(m.blind)))
        main.add(f"correct {m.op} ({m.stem})", "fast + blind", "as listed", "pass",
                 points(ops_catalog.CORRECT[m.op], [m.fast, *m.blind]))
        other = replace(m.fast, dtype=OTHER[m.fast.dtype])
        extra.add(m.stem, other.label(), other.dtype, "fail", points(m.ref, [other]))
    return main, extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--catalogue", choices=("both", "rmsnorm", "family"), default="both",
                    help="which catalogue to run")
    ap.add_argument("--op", action="append", default=[],
                    help="the family catalogue's mutants of this op only (repeatable)")
    opts = ap.parse_args()
    head = ("| mutant / kernel | points | dtype | expected | got | worst err/tol | |\n"
            "| --- | --- | --- | --- | --- | ---: | --- |")
    started = time.perf_counter()
    bad = 0
    for key, title, make in (("rmsnorm", "RMSNorm (tests/mutants)", rmsnorm_rows),
                             ("family", "The family (tests/mutants/ops)", op_rows)):
        if opts.catalogue not in ("both", key):
            continue
        # In this process: a worker per point set (a fresh CUDA process each time) made the
        # family's catalogue outlast a 600 s device call; none of these kernels crashes.
        with runner.measured_here():
            main_table, extra = (op_rows(opts.device, tuple(opts.op)) if key == "family"
                                 else make(opts.device))
        oks = main_table.oks
        bad += oks.count(False)
        print(f"\n### {title} on {opts.device}: {oks.count(True)} of {len(oks)} as on CPU\n")
        print(head)
        print("\n".join(main_table.rows))
        print(f"\nInformation only, the fast points in the other dtype ({title}): "
              f"{extra.oks.count(True)} of {len(extra.oks)} fail\n")
        print(head)
        print("\n".join(extra.rows), flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s; {bad} point sets not as on CPU")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
