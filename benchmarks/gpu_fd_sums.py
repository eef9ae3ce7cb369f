"""Are the fused finite-difference sums right on CUDA, and how fast beside a call's forward?

    PYTHONPATH=. python3 benchmarks/gpu_fd_sums.py [--reps 5] [--only correctness|chunk]

Sections (each prints a markdown table; a failing section prints its error and the rest run):

1. ``correctness``: the fused level-sum kernel on fresh random data against an fp64
   reference, a sub-batch bitwise equal to the full batch, and two runs bitwise equal;
2. ``chunk``: one (64, 8192) fp32 call as ``gradcheck_bi.fd.coloured.plan`` sizes it: the
   forward, the fused sums, the torch-op sums, against a measured device-to-device copy.

A check's time beside its forward floor: benchmarks/ops_floor.py (every op, RMSNorm too).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gradcheck_bi import fd
from gradcheck_bi.fd import _triton_fd
from gradcheck_bi.fd.coloured import plan
from gradcheck_bi.fd.stencil import LEVELS
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.bundled.rmsnorm import After
from gradcheck_bi.sums.reduction import use_backend
from gradcheck_bi.vocab import Config


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def copy_bandwidth(n_bytes: int = 4 << 30, reps: int = 10) -> float:
    """Bytes moved per second (read + write) by a large device-to-device copy."""
    a = torch.empty(n_bytes // 4, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    b.copy_(a)
    best = min(timed(lambda: b.copy_(a), reps))
    a = b = None  # type: ignore[assignment]
    torch.cuda.empty_cache()
    return 2 * n_bytes / best


def section_correctness() -> None:
    print("\n### Fused level sums on CUDA vs an fp64 reference (fresh random data)\n")
    print("| dtype | shape (points, cols, rows, D) | max err / Σ|terms| | sub-batch bitwise | "
          "run-to-run bitwise |\n| --- | --- | ---: | --- | --- |")
    gen = torch.Generator().manual_seed(int(time.time()))
    for dtype, shape in ((torch.float32, (6, 7, 33, 1000)), (torch.float64, (6, 3, 64, 8192)),
                         (torch.float32, (4, 5, 9, 4097))):
        ys_d = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).cuda()
        y0 = torch.randn(shape[-2:], generator=gen, dtype=torch.float64)
        g = torch.randn(shape[-2:], generator=gen, dtype=torch.float64)
        n = shape[0] // 2
        yr = ys_d.double().cpu()  # the inputs as the kernel sees them
        ref = torch.stack([((yr[o] - yr[o + n]) * g).sum(-1) for o in range(n)]
                          + [((yr[o] + yr[o + n] - 2 * y0) * g).sum(-1) for o in range(n)])
        scale = torch.stack(
            [((yr[o].abs() + yr[o + n].abs()) * g.abs()).sum(-1) for o in range(n)]
            + [((yr[o].abs() + yr[o + n].abs() + 2 * y0.abs()) * g.abs()).sum(-1)
               for o in range(n)])
        got = _triton_fd.level_sums(ys_d, y0.cuda(), g.cuda(), True, True)
        again = _triton_fd.level_sums(ys_d, y0.cuda(), g.cuda(), True, True)
        part = _triton_fd.level_sums(ys_d[:, 1:3, 2:7].contiguous(), y0[2:7].cuda(),
                                     g[2:7].cuda(), True, True)
        torch.cuda.synchronize()
        err = float(((got.cpu() - ref).abs() / scale).max())
        ok_part = torch.equal(part, got[:, 1:3, 2:7])
        print(f"| {str(dtype).split('.')[-1]} | {shape} | {err:.2e} | {ok_part} | "
              f"{torch.equal(got, again)} |")


def section_chunk(reps: int) -> None:
    rows, cols = 64, 8192
    cfg = Config(check="dx", device="cuda", dtype="fp32", shape=(rows, cols))
    x, w, g = make_inputs(cfg)
    points = 2 * len(LEVELS)
    n_c, batch = plan((rows, cols), torch.float32, torch.device("cuda"))
    xs = x.repeat(-(-batch // rows), 1)[:batch]  # the call's rows, padding included
    g64, y0 = g.double(), After.apply(x, w, 1e-6, False).double()

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return After.apply(xs, w, 1e-6, False)

    ys = fwd()[: points * n_c * rows].view(points, n_c, rows, cols)
    fused = min(timed(lambda: fd.reduce.level_sums(ys, y0, g64), reps * 4))
    with use_backend("torch"):
        ops = min(timed(lambda: fd.reduce.level_sums(ys, y0, g64), reps * 2))
    f_best = min(timed(fwd, reps * 4))
    bw = copy_bandwidth()
    moved = 2 * xs.numel() * 4
    read = ys.numel() * 4  # the padding's rows are not summed
    print(f"\n### One ({rows}, {cols}) fp32 call: {n_c} columns x {rows} rows x "
          f"{points} points, {batch} rows with padding ({xs.numel() * 4 / 2**30:.2f} GiB of y), "
          "min of runs\n")
    print("| what | ms | GB/s | of copy |\n| --- | ---: | ---: | ---: |")
    print(f"| copy (4 GiB D2D, read + write) | | {bw / 1e9:.0f} | 100% |")
    print(f"| batched forward (x read, y written) | {f_best * 1e3:.2f} | "
          f"{moved / f_best / 1e9:.0f} | {moved / f_best / bw:.0%} |")
    print(f"| fused level sums (y read once) | {fused * 1e3:.2f} | {read / fused / 1e9:.0f} | "
          f"{read / fused / bw:.0%} |")
    print(f"| torch-op level sums (before) | {ops * 1e3:.2f} | {read / ops / 1e9:.0f} | "
          f"{read / ops / bw:.0%} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", action="append",
                    choices=["correctness", "chunk"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_fd_sums: no CUDA GPU visible")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"GPUs visible: {torch.cuda.device_count()}")
    sections: dict[str, Callable[[], None]] = {
        "correctness": section_correctness,
        "chunk": lambda: section_chunk(args.reps),
    }
    for name in args.only or list(sections):
        t = time.perf_counter()
        try:
            sections[name]()
        except Exception:
            print(f"\nsection {name} failed:\n{traceback.format_exc()}")
        print(f"\n({name}: {time.perf_counter() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
