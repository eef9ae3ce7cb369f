"""False alarms on a GPU: `after` and the independent RMSNorm on CUDA, 200+ configs.

    PYTHONPATH=. python3 benchmarks/rmsnorm_false_alarms.py [N] [--dtype fp32 --dtype bf16 ...]

The same seeded generator as tests/test_false_alarms.py (tests/independent/false_alarms.py),
with device cuda and each configuration's dtype drawn from ``--dtype`` (default fp32;
bf16/fp16 run the ulp audit and the lifted gradients): every check (forward, dx, dw,
batch_invariance) of both correct kernels at each configuration. Prints a Markdown
table — count, false alarms and the worst err/tolerance per (kernel, check) — and exits 1
if any check failed.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "independent"))
sys.path.insert(0, str(ROOT))

import false_alarms  # noqa: E402
import torch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--dtype", action="append", choices=["fp64", "fp32", "bf16", "fp16"])
    args = parser.parse_args()
    dtypes = tuple(args.dtype or ["fp32"])
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible; this script checks CUDA kernels", file=sys.stderr)
        return 3
    started = time.perf_counter()
    tallies = false_alarms.run(args.n, dtypes, args.device,
                               log=lambda s: print(s, file=sys.stderr, flush=True))
    import triton

    where = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.machine()
    header = (f"### {args.device}: {args.n} seeded configurations × 2 kernels × 4 checks, "
              f"{'/'.join(dtypes)}\n\n{where}, torch {torch.__version__}, triton "
              f"{triton.__version__}, {platform.python_version()}; "
              f"{time.perf_counter() - started:.0f} s; "
              f"`PYTHONPATH=. python3 benchmarks/rmsnorm_false_alarms.py {args.n}"
              f"{''.join(' --dtype ' + d for d in args.dtype or [])}`")
    text = false_alarms.summary(tallies, header)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if any(t.failures for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
