"""The family's gradient checks beside their forward floor (the ≤ 2× goal of RMSNorm's).

    PYTHONPATH=. python benchmarks/ops_floor.py [--device cuda] [--shape 64,8192] [--reps 3]

For each op (its correct kernel from tests/kernels/, or ``--kernel REF``), times every
gradient check of the op (d<input> and d<parameter>, γ = randn) and the **forward floor**:
the forward calls those checks cannot avoid — per input, the unperturbed batch once and
the stacked perturbed rows in the very chunks ``gradcheck_bi.fd.coloured`` uses (on
unperturbed copies: the same work), per parameter ``stencil.points + 1`` calls on the
batch. Alternates check and floor ``reps`` times and prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from gradcheck_bi.checks.family import make_point, run_op_check
from gradcheck_bi.fd.coloured import elements_per_call
from gradcheck_bi.fd.stencil import CENTRAL4, LEVELS
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.opcall import op_forward
from gradcheck_bi.ops import OPS
from gradcheck_bi.vocab import Config

KERNELS = {"fused_add_rms_norm": "tests/kernels/fused_add_rms_norm.py",
           "layer_norm": "tests/kernels/layer_norm.py",
           "rms_norm_gated": "tests/kernels/rms_norm_gated.py"}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def floor(fn: Any, cfg: Config) -> None:
    """Every forward call of the op's gradient checks, on unperturbed rows."""
    p = make_point(cfg)
    d = cfg.shape[-1]
    rows = p.inputs["x"].numel() // d
    per_call = max(1, elements_per_call(torch.device(cfg.device))
                   // (2 * len(LEVELS) * rows * d))
    with torch.no_grad():
        for _ in p.op.inputs:
            op_forward(fn, p.inputs, p.params, p.options, p.zcg)
            for c0 in range(0, d, per_call):
                k = 2 * len(LEVELS) * (min(d, c0 + per_call) - c0)
                ins = {n: t.reshape(-1, d).repeat(k, 1) for n, t in p.inputs.items()}
                op_forward(fn, ins, p.params, p.options, p.zcg)
        for _ in p.op.params:
            for _ in range(CENTRAL4.points + 1):
                op_forward(fn, p.inputs, p.params, p.options, p.zcg)


def side_by_side(op: str, ref: str, shape: tuple[int, ...], dtype: str, device: str,
                 reps: int) -> dict[str, float]:
    spec = resolve(ref)
    extra: dict[str, Any] = {"group_size": shape[-1] // 4 if op == "rms_norm_gated" else None,
                             "norm_before_gate": True if op == "rms_norm_gated" else None}
    cfgs = [Config(check=c, op=op, shape=shape, dtype=dtype, device=device, **extra)
            for c in OPS[op].gradient_checks]
    checks, floors = [], []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        for cfg in cfgs:
            run_op_check(spec.fn, cfg)
        _sync(device)
        checks.append(time.perf_counter() - t)
        t = time.perf_counter()
        floor(spec.fn, cfgs[0])
        _sync(device)
        floors.append(time.perf_counter() - t)
    c, f = statistics.median(checks), statistics.median(floors)
    return {"check_s": c, "floor_s": f, "ratio": c / f}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--shape", default="64,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--op", action="append")
    ap.add_argument("--kernel", help="with one --op: this kernel instead of tests/kernels'")
    args = ap.parse_args()
    if args.kernel and len(args.op or []) != 1:
        ap.error("--kernel needs exactly one --op")
    shape = tuple(int(s) for s in args.shape.split(","))
    print("| op | shape | device/dtype | checks (s) | forward floor (s) | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for op in args.op or list(KERNELS):
        r = side_by_side(op, args.kernel or KERNELS[op], shape, args.dtype, args.device, args.reps)
        name = f"{op} ({args.kernel})" if args.kernel else op
        print(f"| {name} | {args.shape} | {args.device}/{args.dtype} | {r['check_s']:.2f} | "
              f"{r['floor_s']:.2f} | {r['ratio']:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
