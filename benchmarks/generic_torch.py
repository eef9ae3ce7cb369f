"""torch's own differentiable functions through the generic check: a false-alarm harness
for kernels that compute no op here (each is correct; any result not a pass is either a
false alarm or a property of torch's kernel that the row says).

    PYTHONPATH=. python benchmarks/generic_torch.py [--dtype fp64 --dtype fp32] [--seeds N]
        [NAME …]

Each function runs as ``gradcheck_bi.check(fn, inputs=…)`` at its example shapes (normals
of seed 0, 1, …, ``--seeds`` draws), every check and layout of the generic op; a row per
function and dtype: the results, those not passing and where (check · variant · layout ·
seed), the dependency pattern measured, the elements judged at a finer step (kinks) and
the seconds, all draws summed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import gradcheck_bi
from gradcheck_bi.vocab import DTYPES

# name → (function, example shapes)
FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...]]] = {
    "relu": (F.relu, ((4, 64),)),
    "hardtanh": (F.hardtanh, ((4, 64),)),
    "leaky_relu": (F.leaky_relu, ((4, 64),)),
    "elu": (F.elu, ((4, 64),)),
    "gelu": (F.gelu, ((4, 64),)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), ((4, 64),)),
    "sigmoid": (torch.sigmoid, ((4, 64),)),
    "softplus": (F.softplus, ((4, 64),)),
    "mish": (F.mish, ((4, 64),)),
    "abs": (torch.abs, ((4, 64),)),
    "softmax": (lambda x: torch.softmax(x, -1), ((4, 64),)),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), ((4, 64),)),
    "layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), ((4, 64),)),
    "normalize": (lambda x: F.normalize(x, dim=-1), ((4, 64),)),
    "cumsum": (lambda x: torch.cumsum(x, -1), ((4, 64),)),
    "sort": (lambda x: torch.sort(x, -1).values, ((4, 64),)),
    "topk": (lambda x: torch.topk(x, 3, -1).values, ((4, 64),)),
    "amax": (lambda x: x.amax(-1), ((4, 64),)),
    "max_pool1d": (lambda x: F.max_pool1d(x, 2), ((2, 3, 16),)),
    "matmul": (torch.matmul, ((8, 16), (16, 8))),
    "conv1d": (F.conv1d, ((2, 3, 16), (4, 3, 3))),
    "mse_loss": (F.mse_loss, ((4, 64), (4, 64))),
    "unused_input": (lambda x, w: 2 * x, ((4, 64), (64,))),
}


def one(name: str, dtype: str, seeds: int = 1) -> dict[str, Any]:
    fn, shapes = FUNCTIONS[name]
    row: dict[str, Any] = {"name": name, "dtype": dtype, "results": 0, "bad": [],
                           "kinks": 0, "pattern": "", "s": 0.0}
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        inputs = tuple(torch.randn(s, generator=gen, dtype=DTYPES[dtype]) for s in shapes)
        start = time.perf_counter()
        report = gradcheck_bi.check(fn, inputs=inputs, raise_on_failure=False)
        row["s"] += time.perf_counter() - start
        row["results"] += len(report.results)
        row["bad"] += [f"{r.check} · {r.variant or '-'} · {r.layout} · seed {seed}: "
                       f"{r.status}" for r in report.results if r.status != "pass"]
        row["kinks"] += sum(int(r.details.get("not_differentiable", 0))
                            for r in report.results)
        row["pattern"] = next((n.split(": ", 1)[1].split(";")[0] for n in report.notes
                               if n.startswith("dependency pattern")), "")
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(FUNCTIONS))
    ap.add_argument("--dtype", action="append", choices=("fp64", "fp32"))
    ap.add_argument("--seeds", type=int, default=1, help="draws per function (seed 0, 1, …)")
    args = ap.parse_args()
    print("| function | dtype | pattern measured | results | not pass | where | judged finer "
          "(kinks) | s |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: |")
    for name in args.names:
        for dtype in args.dtype or ["fp64", "fp32"]:
            try:
                row = one(name, dtype, args.seeds)
            except Exception as exc:  # the tool's own failure (an older tree's): the row says
                print(f"| {name} | {dtype} | | | | {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:120]} | | |", flush=True)
                continue
            print(f"| {row['name']} | {row['dtype']} | {row['pattern']} | {row['results']} | "
                  f"{len(row['bad'])} | {'; '.join(row['bad']) or '—'} | {row['kinks']} | "
                  f"{row['s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
