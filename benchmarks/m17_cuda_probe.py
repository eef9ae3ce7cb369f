"""Is mutant m17 (a row sum split in two halves below 32 rows) batch-dependent here?

    PYTHONPATH=. python3 benchmarks/m17_cuda_probe.py [cuda|cpu]

For fp64 and fp32 and several D, the mutant's few-row sum (two half-row fixed-order sums)
against its many-row sum (one fixed-order sum), bitwise, over 8 random rows; then the
batch_invariance check of the mutant at three shapes. Where the two sums agree in every
bit, the kernel is batch-invariant at that D and a passing check is right (found on the
H200: fp64 at D = 128, fp32 at D = 256, where the compiled Triton sum's last step adds the
two halves).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mutants"))
import catalog  # noqa: E402

from gradcheck_bi.kernels.reduction import resolve_backend, row_sum  # noqa: E402

DEV = sys.argv[1] if len(sys.argv) > 1 else "cuda"


def main() -> None:
    fn = catalog.load("m17_batch_dependent_order")
    mutant = catalog._modules["gradcheck_bi_test_m17_batch_dependent_order"]
    for dt in (torch.float64, torch.float32):
        for d in (128, 200, 256, 1030, 4096):
            gen = torch.Generator(DEV).manual_seed(d)
            x = torch.randn(64, d, dtype=dt, device=DEV, generator=gen)
            few, many = mutant.row_sum(x[:8]), mutant.row_sum(x)[:8]
            print(f"{str(dt).removeprefix('torch.')} D={d} ({resolve_backend(x)} sums): "
                  f"{int((few != many).sum())} of 8 rows differ between 8 and 64 rows; "
                  f"{int((few != row_sum(x)[:8]).sum())} differ from the fixed sum")
    for dtype in ("fp64", "fp32"):
        for shape in ((2, 4, 128), (2, 3, 200), (2, 1030)):
            r = catalog.run_points(fn, "m17", [("batch_invariance", "randn", False, shape)],
                                   dtype, DEV)
            print(f"batch_invariance {dtype} {shape}: {r[0].status} {r[0].message[:90]}")


if __name__ == "__main__":
    main()
