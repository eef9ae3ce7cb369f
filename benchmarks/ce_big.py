"""Cross-entropy at a real vocabulary: time, peak memory and how many elements each
gradient check held per element and by direction, one process, the op's default variant
and its ``reduction="none"`` one.

    PYTHONPATH=. python benchmarks/ce_big.py --kernel torch.nn.functional:cross_entropy \\
        --shape 4096,128256 --device cuda --dtype fp32
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from gradcheck_bi.checks.shaped import run_shaped_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.vocab import Config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="torch.nn.functional:cross_entropy")
    ap.add_argument("--shape", default="512,32000")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp64")
    ap.add_argument("--checks", default="forward,dlogits")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    spec = resolve(args.kernel)
    op = SHAPED[spec.op]
    base = dict(op.variants({k: [v] for k, v in spec.fixed})[0].values)
    for reduction in ("mean", "none"):
        values = {**base, "reduction": reduction}
        variant = tuple((a.name, values[a.name]) for a in op.axes)
        for check in args.checks.split(","):
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            m = run_shaped_check(spec.fn, Config(check=check, device=args.device,
                                                 dtype=args.dtype, shape=shape, op=op.name,
                                                 variant=variant))
            took = time.perf_counter() - start
            peak = (f"GPU peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, "
                    if args.device == "cuda" else "")
            host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            d = m.details
            held = (f"{d['checked_per_element']} of {d['elements']} per element, "
                    f"{d['directions']} directions" if "elements" in d else "")
            print(f"{args.kernel} {check} reduction={reduction} {args.device}/{args.dtype} "
                  f"{shape}: {'pass' if m.passed else 'FAIL'} |err| {m.max_abs_err:.3e} "
                  f"tol {m.tolerance:.3e} · {took:.1f} s · {peak}host peak {host:.1f} GiB"
                  + (f" · {held}" if held else "") + (f" · {m.message}" if m.message else ""),
                  flush=True)


if __name__ == "__main__":
    main()
