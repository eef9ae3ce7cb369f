"""GPU validation for the README: compiled Triton reduction, batch invariance, fp32 tables.

Run on a CUDA machine from a source checkout:  PYTHONPATH=. python3 benchmarks/gpu_validate.py
Prints markdown; every GPU claim in README.md quotes this script's output.
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch
import triton

from gradcheck_bi.kernels.bundled.rmsnorm import After, Before
from gradcheck_bi.sums.reduction import row_sum

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
SIZES = (3, 8, 64, 512, 4096)


def grads(fn, x, w, g):  # type: ignore[no-untyped-def]
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    y = fn.apply(xr, wr, 1e-6, True)
    y.backward(g)
    return y.detach(), xr.grad, wr.grad


class TorchSumBackward(torch.autograd.Function):
    """`after`, except the backward's row sum s uses torch.sum (not batch-invariant)."""

    @staticmethod
    def forward(ctx, x, w, eps, zcg):  # type: ignore[no-untyped-def]
        y = After.apply(x, w, eps, zcg)
        x32 = x.float() if x.dtype != torch.float64 else x
        r = torch.rsqrt(x32.pow(2).mean(-1) + eps)
        ctx.save_for_backward(x, w, r)
        ctx.zcg = zcg
        return y

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        x, w, r = ctx.saved_tensors
        cdt = r.dtype
        xc, gc = x.to(cdt), g.to(cdt)
        gamma = w.to(cdt) + (1 if ctx.zcg else 0)
        s = (gc * xc * gamma).sum(-1, keepdim=True)
        r_ = r.unsqueeze(-1)
        dx = gc * gamma * r_ - r_**3 * xc * s / x.shape[-1]
        dw = (gc * xc * r_).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(w.dtype), None, None


def invariance_rows(fn, dtype: torch.dtype, d: int) -> tuple[int, int, list[int]]:  # type: ignore[no-untyped-def]
    """(comparisons, mismatches, batch sizes that differed) for rows alone vs in batches."""
    gen = torch.Generator(device="cuda").manual_seed(d)
    big = max(SIZES)
    x = torch.randn(big, d, device="cuda", generator=gen).to(dtype)
    g = torch.randn(big, d, device="cuda", generator=gen).to(dtype)
    w = torch.randn(d, device="cuda", generator=gen).to(dtype)
    compared = mismatched = 0
    bad: list[int] = []
    probes = (0, 1, 2)
    alone = {p: grads(fn, x[p : p + 1], w, g[p : p + 1]) for p in probes}
    for size in SIZES:
        y_b, dx_b, _ = grads(fn, x[:size], w, g[:size])
        for p in probes:
            for a, b in ((alone[p][0][0], y_b[p]), (alone[p][1][0], dx_b[p])):
                compared += 1
                if not torch.equal(a, b):
                    mismatched += 1
                    if size not in bad:
                        bad.append(size)
    return compared, mismatched, bad


def main() -> None:
    print(f"torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name(0)}\n")

    print("### Compiled Triton row_sum vs the torch path vs torch.sum (fp64 reference)\n")
    print("| dtype | D | max |triton - fp64 sum| | max |torch path - fp64 sum| | rel. to Σ|x| |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in ("fp32", "fp64"):
        for d in (1, 5, 1000, 4096, 5000, 8192):
            x = torch.randn(512, d, device="cuda", dtype=DTYPES[name])
            ref = x.double().sum(-1)
            a = (row_sum(x, "triton").double() - ref).abs().max().item()
            b = (row_sum(x, "torch").double() - ref).abs().max().item()
            rel = max(a, b) / x.double().abs().sum(-1).max().item()
            print(f"| {name} | {d} | {a:.2e} | {b:.2e} | {rel:.1e} |")

    print("\n### Batch invariance on the GPU (rows 0-2 alone vs in batches of "
          f"{', '.join(map(str, SIZES))}; y and dx bitwise)\n")
    print("| kernel | dtype | D | comparisons | bitwise mismatches | batch sizes that differed |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for kname, fn in (("after", After), ("before", Before),
                      ("after but s = torch.sum", TorchSumBackward)):
        for dname, dt in DTYPES.items():
            for d in (1024, 4096, 5000, 8192):
                n, bad, sizes = invariance_rows(fn, dt, d)
                print(f"| {kname} | {dname} | {d} | {n} | {bad} | {sizes or '—'} |")

    print("\n### `python -m gradcheck_bi run --format markdown` (default: cpu fp64 + cuda fp32)\n")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gradcheck_bi", "run", "--format", "markdown"],
                         capture_output=True, text=True)
    print(out.stdout)
    print(f"exit {out.returncode}; {time.perf_counter() - t:.1f} s; stderr: {out.stderr.strip()!r}")



if __name__ == "__main__":
    main()
