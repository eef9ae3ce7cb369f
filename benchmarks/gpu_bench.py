"""GPU benchmark for issue 5: (64, 8192) fp32 full dx + dw on one GPU, and the achieved
bandwidth of the batched FD forward against a measured device-to-device copy.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py [--rows 64] [--cols 8192] [--reps 5]

Warms up first (Triton compiles the row-sum kernel), then times with
``torch.cuda.synchronize()`` around each call. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks import check_dw, check_dx
from gradcheck_bi.fd.estimate import _differences
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.rmsnorm import After
from gradcheck_bi.vocab import Config


def timed(fn, reps: int) -> list[float]:  # type: ignore[no-untyped-def]
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
    return 2 * n_bytes / min(timed(lambda: b.copy_(a), reps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_bench: no CUDA GPU visible")
    shape = (args.rows, args.cols)
    cfg = {k: Config(check=k, device="cuda", dtype="fp32", shape=shape) for k in ("dx", "dw")}

    def full_check() -> tuple[bool, bool]:
        return check_dx(After, cfg["dx"]).passed, check_dw(After, cfg["dw"]).passed

    t = time.perf_counter()
    passed = full_check()  # warm-up: Triton compile, allocator
    torch.cuda.synchronize()
    warmup = time.perf_counter() - t
    check_times = timed(full_check, args.reps)
    dx_m = check_dx(After, cfg["dx"])

    # The batched FD forward on one chunk, exactly as input_grad builds it.
    x, w, g = make_inputs(cfg["dx"])
    stencil = fd.CENTRAL4
    n_c, n_r = fd.chunk_shape(args.rows, args.cols, stencil, torch.float32,
                              None, "cuda")
    xs = x[:n_r].repeat(stencil.points * n_c, 1)
    g64 = g[:n_r].double()

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return After.apply(xs, w, 1e-6, False)

    def fwd_and_sums() -> None:
        ys = fwd()
        _differences(ys.view(stencil.points, n_c, n_r, args.cols), g64, g64.abs(),
                        len(stencil.offsets), True)

    fwd()
    fwd_and_sums()
    f_best = min(timed(fwd, args.reps * 2))
    s_best = min(timed(fwd_and_sums, args.reps * 2))
    copy_bw = copy_bandwidth()
    torch.cuda.empty_cache()
    moved = 2 * xs.numel() * xs.element_size()  # read the perturbed rows, write y: the minimum
    chunks = -(-args.cols // n_c) * -(-args.rows // n_r)

    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"\n### ({args.rows}, {args.cols}) fp32 CUDA, full dx + dw\n")
    print("| what | value | target |\n| --- | ---: | --- |")
    print(f"| first call (warm-up, includes Triton compile) | {warmup:.3f} s | |")
    print(f"| full dx + dw, min of {args.reps} | {min(check_times):.3f} s | <= 0.5 s |")
    print(f"| full dx + dw, median | {statistics.median(check_times):.3f} s | |")
    print(f"| passed (dx, dw) | {passed} | |")
    print(f"| dx max abs err / tolerance | {dx_m.max_abs_err:.3e} / {dx_m.tolerance:.3e} | |")
    print(f"| chunk (columns x rows), chunks, forward calls | {n_c} x {n_r}, {chunks}, "
          f"{dx_m.details['forward_calls']} | |")
    print(f"| copy bandwidth (4 GiB D2D, read + write) | {copy_bw / 1e9:.0f} GB/s | |")
    print(f"| batched FD forward, one chunk | {f_best * 1e3:.2f} ms, "
          f"{moved / f_best / 1e9:.0f} GB/s = {moved / f_best / copy_bw:.0%} of copy | >= 50% |")
    print(f"| forward + FD sums, one chunk | {s_best * 1e3:.2f} ms, "
          f"{moved / s_best / 1e9:.0f} GB/s = {moved / s_best / copy_bw:.0%} of copy | |")
    print("\nBandwidth counts the minimum traffic of the forward: the perturbed input read once "
          "and y written once (2 x 4 bytes per element).")


if __name__ == "__main__":
    main()
