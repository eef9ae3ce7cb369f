"""Multi-GPU sweep benchmark: one case file run by the CLI on one GPU and on every
visible GPU; wall times, the speed-up, and whether the two JSON reports are identical.

    PYTHONPATH=. python3 benchmarks/multi_gpu_sweep.py [--seeds 84] [--shape 32,8192]

The case: kernels before and after, cuda/fp32, the dx check, three γ controls, both zcg
settings, ``--seeds`` seeds (2 × 3 × 2 × seeds points: 1008 by default). Each run is a fresh
``python -m gradcheck_bi run --case ... --format json`` process timed from start to exit;
the one-GPU run sees only GPU 0 (``CUDA_VISIBLE_DEVICES=0``). The reports are compared
byte for byte after removing the ``timing`` key (wall time is the one field that differs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def case_text(seeds: int, shape: tuple[int, int]) -> str:
    return f"""description = "multi-GPU sweep benchmark"
kernels = ["before", "after"]
targets = ["cuda/fp32"]
checks = ["dx"]
weights = ["randn", "ones", "zeros"]
zcg = [false, true]
seeds = {list(range(seeds))}

[[sweep]]
name = "dx at model width"
shapes = [[{shape[0]}, {shape[1]}]]
"""


def run(case: Path, out: Path, visible: str | None) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    cmd = [sys.executable, "-m", "gradcheck_bi", "run", "--case", str(case), "--format",
           "json", "--output", str(out), "--no-progress"]
    t = time.perf_counter()
    code = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True).returncode
    return time.perf_counter() - t, code


def without_timing(path: Path) -> str:
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc.pop("timing", None)
    return json.dumps(doc, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=84)
    ap.add_argument("--shape", default="32,8192")
    args = ap.parse_args()
    import torch

    n_gpus = torch.cuda.device_count()
    shape = tuple(int(s) for s in args.shape.split(","))
    points = 2 * 3 * 2 * args.seeds
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "sweep.toml"
        case.write_text(case_text(args.seeds, shape), encoding="utf-8")  # type: ignore[arg-type]
        one, all_ = Path(tmp) / "one.json", Path(tmp) / "all.json"
        t1, c1 = run(case, one, "0")
        tn, cn = run(case, all_, None)
        a, b = without_timing(one), without_timing(all_)
        results = json.loads(a)["results"]
        statuses = sorted({r["status"] for r in results})
    print(f"\n### Sweep of {points} points ({shape} fp32 dx, before + after, 3 γ, 2 zcg, "
          f"{args.seeds} seeds): one GPU vs {n_gpus} GPUs, CLI start to exit\n")
    print("| GPUs | wall s | exit | speed-up |\n| ---: | ---: | ---: | ---: |")
    print(f"| 1 | {t1:.1f} | {c1} | 1.00x |")
    print(f"| {n_gpus} | {tn:.1f} | {cn} | **{t1 / tn:.2f}x** |")
    print(f"\nresults: {len(results)}, statuses {statuses}; JSON reports identical apart from "
          f"timing: **{a == b}** ({len(a)} bytes)")


if __name__ == "__main__":
    main()
