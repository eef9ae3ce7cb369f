"""GPU: a gemm gradient check beside its forward floor (the forward calls it must make).

    PYTHONPATH=. python benchmarks/gemm_ratio.py [--kernel PATH.py:ATTR] [--shape 64,4096,4096]
        [--check dA] [--dtype fp32]

Runs ``gradcheck_bi.check(kernel, checks=[CHECK], shapes=[SHAPE], device="cuda")`` twice
(the first compiles), with the kernel's forward wrapped to count its calls by the shapes,
strides, dtypes and options it was given. The floor is Σ calls × that call's own median time
(each signature timed alone afterwards, synchronised, 20 reps): what the finite differences
cannot avoid (for dA, 6 forward calls per colour, K colours per point). Prints the check's
wall time, the calls, the floor and their ratio (the loop: ``benchmarks/floor_ratio.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# before gradcheck_bi: it sets GRADCHECK_BI_ISOLATE=0 (the calls counted here)
from floor_ratio import Counted, floor, syncer, timed_runs

import gradcheck_bi


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="tests/kernels/gemm_triton.py:GemmTritonFn")
    ap.add_argument("--shape", default="64,4096,4096")
    ap.add_argument("--check", default="dA")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=2, help="the last one is timed")
    a = ap.parse_args()
    shape = tuple(int(s) for s in a.shape.split(","))
    path, attr = a.kernel.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("kmod", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    base = getattr(mod, attr)
    counted, sync = Counted(), syncer(a.device)

    class Counted_(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def forward(ctx, A, B, bias, out_dtype, layout):
            counted.add((tuple(A.shape), A.stride(), tuple(B.shape), B.stride(), A.dtype,
                         bias is not None, layout), (A, B, bias, out_dtype, layout))
            return base.forward(ctx, A, B, bias, out_dtype, layout)

    Counted_.__doc__ = base.__doc__
    Counted_.__name__ = base.__name__
    wall = timed_runs(lambda: gradcheck_bi.check(
        Counted_, checks=[a.check], shapes=[shape], device=a.device, dtype=a.dtype,
        raise_on_failure=False), counted, a.runs, sync)
    total = floor(counted, a.device, base.apply,
                  lambda key: f"A{key[0]} B{key[2]} bias={key[5]} layout={key[6]}", sync)
    print(f"{a.kernel} --check {a.check} --shape {a.shape} --dtype {a.dtype}: check "
          f"{wall:.2f} s, forward floor {total:.2f} s, ratio {wall / total:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
