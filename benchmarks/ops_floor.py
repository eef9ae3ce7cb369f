"""Every op's gradient checks beside their forward floor (the goal: ≤ 1.5×).

    PYTHONPATH=. python benchmarks/ops_floor.py [--device cuda] [--shape 64,8192 ...] [--reps 3]

For each op (its correct kernel from tests/kernels/, the bundled ``after`` for rms_norm, or
``--kernel REF``), times every gradient check of the op (d<input> and d<parameter>,
γ = randn) and the **forward floor**:
the forward calls those checks cannot avoid — per input, the unperturbed batch once and
the stacked perturbed rows in the very calls ``gradcheck_bi.fd.coloured.plan`` makes (on
unperturbed rows made up front: the same work, no copy timed), per parameter
``stencil.points + 1`` calls on the batch. After one untimed round of both (compiles,
autotuning), alternates check and floor ``reps`` times; prints the medians and their ratio.
``--profile N`` then prints where the checks' host time goes: the top N functions of a
cProfile of ``reps`` rounds (by own time and by cumulative time), and every host–device sync
the checks make, by the line of this package that made it (``torch.cuda.set_sync_debug_mode``).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import io
import pstats
import statistics
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch

from gradcheck_bi.checks.rows import make_point, run_op_check
from gradcheck_bi.fd.coloured import plan
from gradcheck_bi.fd.stencil import CENTRAL4
from gradcheck_bi.fd.threads import cpu_threads, run_steps
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.kernels.calling.opcall import op_forward
from gradcheck_bi.ops import ROWS
from gradcheck_bi.sweep import checks_of
from gradcheck_bi.vocab import Config

KERNELS = {"rms_norm": "gradcheck_bi.kernels.bundled.rmsnorm:After",
           "fused_add_rms_norm": "tests/kernels/fused_add_rms_norm.py",
           "layer_norm": "tests/kernels/layer_norm.py",
           "rms_norm_gated": "tests/kernels/rms_norm_gated.py",
           "log_softmax": "tests/kernels/log_softmax.py",
           "swiglu": "tests/kernels/swiglu.py",
           "silu_and_mul": "tests/kernels/silu_and_mul.py"}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], None], device: str) -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def floor(fn: Any, cfg: Config) -> Callable[[], None]:
    """A callable running every forward call the op's gradient checks cannot avoid, on
    unperturbed rows made up front: per input, the batch once and the chunked calls of
    :func:`gradcheck_bi.fd.coloured.input_grad_outputs` (its very plan: columns per call,
    rows per call with the padding); per parameter ``stencil.points + 1`` calls. On CPU the
    calls run on the threads the check's own loops choose (:mod:`gradcheck_bi.fd.threads`)."""
    p = make_point(cfg)
    dev = torch.device(cfg.device)
    loops: list[tuple[list[dict[str, torch.Tensor]], int]] = []
    for name in p.op.inputs:
        t = p.inputs[name]
        per_call, rows = plan(tuple(t.shape), t.dtype, dev)
        calls = -(-t.shape[-1] // per_call)
        n = t.numel() // t.shape[-1]
        ins = {k: v.reshape(-1, v.shape[-1]).repeat(-(-rows // n), 1)[:rows]
               for k, v in p.inputs.items()}
        loops.append(([p.inputs] + [ins] * calls, rows * t.shape[-1]))
    loops.append(([p.inputs] * ((CENTRAL4.points + 1) * len(p.op.params)), p.lead.numel()))

    def run() -> None:  # on CPU with the check's thread choice (fd.threads), loop by loop
        with torch.no_grad():
            for batches, elements in loops:
                with cpu_threads(dev, elements):
                    run_steps([functools.partial(op_forward, fn, ins, p.params, p.options,
                                                 p.zcg) for ins in batches], dev)

    return run


def side_by_side(op: str, ref: str, shape: tuple[int, ...], dtype: str, device: str,
                 reps: int, profile: int = 0, timeline: bool = False) -> dict[str, float]:
    spec = resolve(ref, {"op": op})
    fn = as_op_kernel(spec.fn)
    extra: dict[str, Any] = {"group_size": shape[-1] // 4 if op == "rms_norm_gated" else None,
                             "norm_before_gate": True if op == "rms_norm_gated" else None}
    cfgs = [Config(check=c, op=op, shape=shape, dtype=dtype, device=device, **extra)
            for c in ROWS[op].gradient_checks if c in checks_of(spec)]
    run_floor = floor(fn, cfgs[0])

    def run_checks() -> None:
        for cfg in cfgs:
            run_op_check(fn, cfg)

    run_checks()  # warm-up: compiles, autotuning, the allocator's growth kept out
    run_floor()
    checks, floors = [], []
    for _ in range(reps):
        checks.append(_timed(run_checks, device))
        floors.append(_timed(run_floor, device))
    c, f = statistics.median(checks), statistics.median(floors)
    if profile:
        _profile(run_checks, device, reps, profile)
    if timeline and device == "cuda":
        for cfg in cfgs:
            _timeline(functools.partial(run_op_check, fn, cfg), cfg.check)
    return {"check_s": c, "floor_s": f, "ratio": c / f}


def _profile(run_checks: Callable[[], None], device: str, reps: int, top: int) -> None:
    prof = cProfile.Profile()
    _sync(device)
    prof.enable()
    for _ in range(reps):
        run_checks()
    _sync(device)
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
        print(f"-- cProfile of {reps} rounds of the checks, by {key}:")
        print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
    if device != "cuda":
        return
    where: collections.Counter[str] = collections.Counter()
    torch.cuda.set_sync_debug_mode("warn")

    def note(*_: Any, **__: Any) -> None:  # called as the sync warns: its innermost package frame
        frames = [f for f in traceback.extract_stack()[:-1] if "gradcheck_bi" in f.filename]
        where[f"{frames[-1].filename.split('gradcheck_bi/')[-1]}:{frames[-1].lineno}"
              if frames else "elsewhere"] += 1

    with warnings.catch_warnings():  # restores showwarning after
        warnings.simplefilter("always")
        warnings.showwarning = note
        run_checks()
    torch.cuda.set_sync_debug_mode(0)
    print(f"-- host-device syncs in one round: {sum(where.values())}")
    for line, n in where.most_common():
        print(f"  {n:5d}  {line}")


def _timeline(run: Callable[[], None], name: str) -> None:
    """One run under torch.profiler: its wall time split into the GPU's busy time (the union
    of kernel and copy intervals), the head before the first GPU work, the tail after the
    last, and the idle gaps between; then the GPU time by kernel name."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    gpu = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    host = [e.time_range for e in prof.events() if e.device_type != torch.autograd.DeviceType.CUDA]
    start = min(r.start for r in host)
    end = max(max(r.end for r in host), gpu[-1][1] if gpu else 0)
    busy, gaps, cur = 0.0, [], None
    for a, b in gpu:
        if cur is None or a > cur[1]:
            if cur is not None:
                gaps.append(a - cur[1])
            cur = [a, b]
            busy += b - a
        elif b > cur[1]:
            busy += b - cur[1]
            cur[1] = b
    by: collections.Counter[str] = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name[:60]] += e.time_range.end - e.time_range.start
    head = (gpu[0][0] - start) if gpu else 0
    tail = (end - gpu[-1][1]) if gpu else 0
    big = sorted(gaps, reverse=True)[:5]
    ms = [round(g / 1e3, 2) for g in big]
    print(f"-- timeline {name}: wall {wall * 1e3:.1f} ms (span {(end - start) / 1e3:.1f}), "
          f"GPU busy {busy / 1e3:.1f}, head {head / 1e3:.1f}, tail {tail / 1e3:.1f}, "
          f"gaps {sum(gaps) / 1e3:.1f} in {len(gaps)} (largest {ms}); {len(gpu)} GPU events")
    for k, us in by.most_common(8):
        print(f"     {us / 1e3:8.2f} ms  {k}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--shape", action="append",
                    help="D1,D2,... (repeat for several shapes; default 64,8192)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--op", action="append")
    ap.add_argument("--kernel", help="with one --op: this kernel instead of tests/kernels'")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then print the top N functions of a cProfile, and the syncs")
    ap.add_argument("--timeline", action="store_true",
                    help="on CUDA: each check once under torch.profiler, its wall split into "
                         "GPU busy, head, tail and gaps")
    args = ap.parse_args()
    if args.kernel and len(args.op or []) != 1:
        ap.error("--kernel needs exactly one --op")
    print("| op | shape | device/dtype | checks (s) | forward floor (s) | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for text in args.shape or ["64,8192"]:
        shape = tuple(int(s) for s in text.split(","))
        for op in args.op or list(KERNELS):
            r = side_by_side(op, args.kernel or KERNELS[op], shape, args.dtype, args.device,
                             args.reps, args.profile, args.timeline)
            name = f"{op} ({args.kernel})" if args.kernel else op
            print(f"| {name} | {text} | {args.device}/{args.dtype} | {r['check_s']:.3f} | "
                  f"{r['floor_s']:.3f} | {r['ratio']:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
