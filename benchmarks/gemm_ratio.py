"""GPU: a gemm gradient check beside its forward floor (the forward calls it must make).

    PYTHONPATH=. python benchmarks/gemm_ratio.py [--kernel PATH.py:ATTR] [--shape 64,4096,4096]
        [--check dA] [--dtype fp32]

Runs ``gradcheck_bi.check(kernel, checks=[CHECK], shapes=[SHAPE], device="cuda")`` twice
(the first compiles), with the kernel's forward wrapped to count its calls by the shapes,
strides, dtypes and options it was given. The floor is Σ calls × that call's own median time
(each signature timed alone afterwards, synchronised, 20 reps): what the finite differences
cannot avoid (for dA, 6 forward calls per colour, K colours per point). Prints the check's
wall time, the calls, the floor and their ratio. Points run in this process
(``GRADCHECK_BI_ISOLATE=0``) so that the calls can be counted.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

import torch

import gradcheck_bi


def main() -> int:
    os.environ["GRADCHECK_BI_ISOLATE"] = "0"  # count the calls in this process
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="tests/kernels/gemm_triton.py:GemmTritonFn")
    ap.add_argument("--shape", default="64,4096,4096")
    ap.add_argument("--check", default="dA")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=2, help="the last one is timed")
    a = ap.parse_args()
    shape = tuple(int(s) for s in a.shape.split(","))

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()
    path, attr = a.kernel.rsplit(":", 1)
    import importlib.util
    spec = importlib.util.spec_from_file_location("kmod", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    base = getattr(mod, attr)
    calls: collections.Counter = collections.Counter()
    args_of: dict = {}

    class Counted(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def forward(ctx, A, B, bias, out_dtype, layout):
            key = (tuple(A.shape), A.stride(), tuple(B.shape), B.stride(), A.dtype,
                   bias is not None, layout)
            calls[key] += 1
            if key not in args_of:
                args_of[key] = (A.detach().clone(), B.detach().clone(),
                                None if bias is None else bias.detach().clone(), out_dtype,
                                layout)
            return base.forward(ctx, A, B, bias, out_dtype, layout)

    Counted.__doc__ = base.__doc__
    walls = []
    for rep in range(a.runs):
        calls.clear()
        sync()
        t0 = time.perf_counter()
        rep_ = gradcheck_bi.check(Counted, checks=[a.check], shapes=[shape], device=a.device,
                                  dtype=a.dtype, raise_on_failure=False)
        sync()
        walls.append(time.perf_counter() - t0)
        print(f"run {rep}: {walls[-1]:.2f} s, {sum(calls.values())} forward calls, "
              f"{len(rep_.results)} results, passed "
              f"{sum(1 for r in rep_.results if r.status == 'pass')}", flush=True)
    floor = 0.0
    for key, n in calls.items():
        A, B, bias, out_dtype, layout = args_of[key]
        if A.device.type != a.device:  # a load-time probe on the host, not the check's
            print(f"  {n:6d} calls on {A.device.type} (load-time probes): not timed")
            continue
        with torch.no_grad():
            for _ in range(3):
                base.apply(A, B, bias, out_dtype, layout)
            ts = []
            for _ in range(20):
                sync()
                t0 = time.perf_counter()
                base.apply(A, B, bias, out_dtype, layout)
                sync()
                ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        floor += n * t
        print(f"  {n:6d} calls × {t * 1e6:8.1f} µs  A{key[0]} B{key[2]} bias={key[5]} "
              f"layout={key[6]}")
    print(f"{a.kernel} --check {a.check} --shape {a.shape} --dtype {a.dtype}: check "
          f"{walls[-1]:.2f} s, forward floor {floor:.2f} s, ratio {walls[-1] / floor:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
