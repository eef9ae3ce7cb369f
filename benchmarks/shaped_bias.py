"""The bias test of the shaped working-precision search (gradcheck_bi.checks.shaped_precision)
on correct kernels that compute in fp32 inside an fp64 call, and on RMSNorm's m15 (eps
outside the root) through rms_norm_any: per kernel, over every variant of its op, SEEDS seeds
and a few shapes (8 rows, the default, odd ones), the forward's ``|c| / (BIAS_SE·se +
BIAS_U·u)`` — above 1 the search rejects fp32. A correct kernel must stay below 1 everywhere
(its worst printed); m15 above 1 wherever it is tested (its least printed).

    PYTHONPATH=. python benchmarks/shaped_bias.py [SEEDS]    (default 10)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kernels"))
import norms_any_shape as nas  # noqa: E402

from gradcheck_bi.checks.shaped import model  # noqa: E402
from gradcheck_bi.checks.shaped_point import forward, make_point  # noqa: E402
from gradcheck_bi.checks.shaped_precision import (  # noqa: E402
    BIAS_SE,
    BIAS_U,
    bias,
    working_unit,
)
from gradcheck_bi.errors import unit  # noqa: E402
from gradcheck_bi.kernels import resolve  # noqa: E402
from gradcheck_bi.ops import SHAPED  # noqa: E402
from gradcheck_bi.vocab import Config  # noqa: E402

K = "tests/kernels/fp32_inside.py:"
# (kernel, the op it is loaded as or "", shapes, whether it is correct)
KERNELS = [
    (K + "gemm", "", [(8, 16, 4), (2, 8, 64, 48), (33, 7, 5), (64, 128, 96)], True),
    (K + "log_softmax", "", [(8, 16), (2, 8, 256), (33, 1000)], True),
    (K + "cross_entropy", "", [(8, 50), (2, 8, 512), (33, 1000)], True),
    (K + "layer_norm", "layer_norm_any", [(8, 16), (2, 8, 256), (40, 200)], True),
    ("tests/mutants/m13_compute_in_fp32.py:Mutant", "rms_norm_any",
     [(8, 16), (2, 8, 256), (40, 200)], True),
    ("tests/mutants/m15_eps_outside_sqrt.py:Mutant", "rms_norm_any",
     [(8, 16), (2, 8, 256), (40, 200)], False),
]


def ratios(ref: str, op_name: str, shapes: list[tuple[int, ...]], seeds: int
           ) -> tuple[str, list[float], int, int, int]:
    """The op, every tested output's ratio, the points, how many of them took fp32 and how
    many the bias alone kept from it."""
    spec = resolve(str(ROOT / ref), {"op": op_name} if op_name else {})
    op = SHAPED[spec.op]
    u = unit(torch.float32)
    out, points, took, kept = [], 0, 0, 0
    for variant in op.variants({k: [v] for k, v in spec.fixed}):
        for shape in shapes:
            for seed in range(seeds):
                cfg = Config(check="forward", shape=shape, op=op.name, seed=seed,
                             variant=variant.values)
                point = make_point(cfg)
                m = model(point, grads=False)
                got = forward(spec.fn, point)
                diffs = {k: got[k] - m.outputs[k] for k in m.outputs if k in got}
                points += 1
                at, note = working_unit(point, diffs, m)
                took += at == u
                kept += (note or "").startswith("not fp32")
                for k, d in diffs.items():
                    found = bias(d, m.outputs[k])
                    if found is not None:
                        out.append(abs(found[0]) / (BIAS_SE * found[1] + BIAS_U * u))
    return op.name, out, points, took, kept


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    print("| kernel | op | points | judged at fp32 | kept off fp32 by the bias | outputs "
          "tested | ratio (worst / least) | s |\n| --- | --- | ---: | ---: | ---: | ---: | ---: "
          "| ---: |")
    with nas.registered():
        for ref, op_name, shapes, correct in KERNELS:
            start = time.time()
            op, r, points, took, kept = ratios(ref, op_name, shapes, seeds)
            shown = (f"{max(r):.3g} worst" if correct else f"{min(r):.3g} least") if r else "—"
            print(f"| {ref.rsplit('/', 1)[-1]} | {op} | {points} | {took} | {kept} | {len(r)} "
                  f"| {shown} | {time.time() - start:.0f} |")


if __name__ == "__main__":
    main()
