"""Every op-of-any-shape kernel under tests/kernels through its op's default sweep:
for each, the results that are not a pass, grouped by check and the axis values that
differ from the op's default — what shows each defect, and what is blind to it.

    PYTHONPATH=. python benchmarks/shaped_mutants.py [--dtype fp64] [--device cpu] [KERNEL …]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from gradcheck_bi.ops import SHAPED
from gradcheck_bi.runner import measured_here, run
from gradcheck_bi.sweep import Sweep

CATALOGUE = [
    *(f"tests/kernels/gemm_mutants.py:{m}" for m in (
        "DbiasFirstRow", "DbFirstRow", "DaFirstSlice", "CotangentAsContiguous",
        "SmallDefectNN")),
    "tests/kernels/gemm.py:GemmFn",
    *(f"tests/kernels/gelu_and_mul.py:{m}" for m in (
        "GeluAndMul", "GeluGradNoPdf", "TanhBackwardAlways")),
    *(f"tests/kernels/cross_entropy.py:{m}" for m in (
        "CrossEntropy", "AssumesGradOne", "FirstRowCotangent", "IgnoredRowsLeak",
        "MeanOverAllRows", "SmoothingWithoutOneMinusEps", "GradIntoLogits",
        "TargetProbRoundedLowp")),
    *(f"tests/kernels/token_logprobs.py:{m}" for m in (
        "TokenLogprobs", "IgnoresCotangent", "FirstTokenCotangent", "TemperatureForgotten")),
    *(f"tests/kernels/fused_linear_cross_entropy.py:{m}" for m in (
        "FusedLinearCrossEntropy", "ChunkedFusedLinearCrossEntropy", "DweightOneChunk",
        "MeanOverAllRows", "AssumesGradOne")),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp64")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("kernels", nargs="*")
    args = ap.parse_args()
    print("| kernel | results | not pass | where (check · axes off their default · layout) |"
          " s |\n| --- | ---: | ---: | --- | ---: |")
    for ref in args.kernels or CATALOGUE:
        start = time.time()
        with measured_here():
            results = run(Sweep(kernels=[ref], targets=[(args.device, args.dtype)]))
        where: Counter[str] = Counter()
        for r in results:
            if r.status == "pass":
                continue
            op = SHAPED[r.op]
            default = dict(op.variants()[0].values)
            moved = [f"{k}={v}" for k, v in (r.variant or {}).items() if default.get(k) != v]
            where[" ".join([r.check, *moved] + ([r.layout] if r.layout != "contiguous"
                                                 else []))] += 1
        shown = "; ".join(f"{k} ×{n}" if n > 1 else k for k, n in where.items()) or "—"
        print(f"| {ref.split('/')[-1]} | {len(results)} | {sum(where.values())} | {shown} | "
              f"{time.time() - start:.0f} |")


if __name__ == "__main__":
    main()
