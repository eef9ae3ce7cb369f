"""Every loss mutant of tests/kernels on a GPU: caught where its defect shows, passing at the
blind control that hides it — as tests/test_shaped.py and tests/test_losses.py require on
CPU fp64 — and the correct kernels passing at both points.

    PYTHONPATH=. python benchmarks/gpu_loss_mutants.py [--device cuda] [--dtype fp32]

One line per mutant: ``shows`` (want fail) and ``blind`` (want pass) statuses, the worst
error/tolerance ratio, seconds. The bf16 rounding mutant runs in bf16 (its defect is a
bf16 rounding; the fused form's bf16 logit gradient: bf16, blind in fp32), everything else in
``--dtype``. Exits 1 on any point not as wanted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gradcheck_bi.kernels import resolve
from gradcheck_bi.measure import run_point
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config

KERNELS = Path(__file__).resolve().parents[1] / "tests" / "kernels"
CE, TLP, FLCE = "cross_entropy.py", "token_logprobs.py", "fused_linear_cross_entropy.py"
RANDOM, ONES = {"cotangent": "random"}, {"cotangent": "ones"}
NONE_RANDOM, NONE_ONES = {"reduction": "none", **RANDOM}, {"reduction": "none", **ONES}
SOME, NONE = {"ignore": "some"}, {"ignore": "none"}
# (kernel, check, where it shows, its blind control); "memory", "shape" and "dtype" keys
# are the point's, the rest the op's axes. A correct kernel is held to pass at both.
CATALOGUE: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    (f"{CE}:CrossEntropy", "dlogits", {**SOME, "label_smoothing": 0.1}, NONE_ONES),
    (f"{CE}:AssumesGradOne", "dlogits", RANDOM, ONES),
    (f"{CE}:FirstRowCotangent", "dlogits", NONE_RANDOM, NONE_ONES),
    (f"{CE}:IgnoredRowsLeak", "dlogits", SOME, NONE),
    (f"{CE}:MeanOverAllRows", "dlogits", SOME, NONE),
    (f"{CE}:SmoothingWithoutOneMinusEps", "dlogits", {"label_smoothing": 0.1},
     {"label_smoothing": 0.0}),
    (f"{CE}:GradIntoLogits", "dlogits", {}, {"memory": "never"}),
    (f"{CE}:ReadsStorageAsContiguous", "dlogits", {"memory": "logits-strided"}, {}),
    (f"{CE}:TargetProbRoundedLowp", "dlogits", {"dtype": "bf16", "peaked": True},
     {"dtype": "bf16", "peaked": False}),
    (f"{TLP}:TokenLogprobs", "dlogits", {**SOME, "temperature": 0.7}, {}),
    (f"{TLP}:IgnoresCotangent", "dlogits", RANDOM, ONES),
    (f"{TLP}:FirstTokenCotangent", "dlogits", RANDOM, ONES),
    (f"{TLP}:TemperatureForgotten", "dlogits", {"temperature": 0.7}, {"temperature": 1.0}),
    (f"{TLP}:IgnoredTokensLeak", "dlogits", SOME, NONE),
    (f"{FLCE}:ChunkedFusedLinearCrossEntropy", "dweight",
     {"softcap": 5.0, "label_smoothing": 0.1}, {"class_weight": True,
                                                "lse_square_scale": 1e-2}),
    (f"{FLCE}:AssumesGradOne", "dweight", RANDOM, ONES),
    (f"{FLCE}:AssumesGradOne", "dhidden", NONE_RANDOM, NONE_ONES),
    (f"{FLCE}:MeanOverAllRows", "dweight", SOME, NONE),
    (f"{FLCE}:DweightOneChunk", "dweight", {}, {"shape": (1, 4, 16, 320)}),
    (f"{FLCE}:SoftcapChainForgotten", "dhidden", {"softcap": 5.0}, {"softcap": None}),
    (f"{FLCE}:ZLossGradForgotten", "dweight", {"lse_square_scale": 1e-2},
     {"lse_square_scale": 0.0}),
    (f"{FLCE}:GradLogitsInInputDtype", "dweight", {"dtype": "bf16"}, {"dtype": "fp32"}),
]


def status(ref: str, check: str, device: str, dtype: str, point: dict[str, Any]
           ) -> tuple[str, float | None, str]:
    """One point of the kernel's op (its default variant with ``point``'s axes changed)."""
    spec = resolve(str(KERNELS / ref))
    op = SHAPED[spec.op]
    axes = {k: v for k, v in point.items() if k not in ("memory", "shape", "dtype")}
    values = {**dict(op.variants({k: [v] for k, v in spec.fixed})[0].values), **axes}
    cfg = Config(check=check, device=device, dtype=point.get("dtype", dtype),
                 shape=point.get("shape", op.default_shape), op=op.name,
                 layout=point.get("memory", "contiguous"),
                 variant=Variant(tuple((a.name, values[a.name]) for a in op.axes)).values)
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    ratio = r.max_abs_err / r.tolerance if r.max_abs_err is not None and r.tolerance else None
    return r.status, ratio, r.message


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="fp32")
    args = ap.parse_args()
    bad = 0
    for ref, check, shows, blind in CATALOGUE:
        correct = ref.split(":")[1] in ("CrossEntropy", "TokenLogprobs",
                                        "ChunkedFusedLinearCrossEntropy")
        t0 = time.perf_counter()
        got = []
        for point, want in ((shows, "pass" if correct else "fail"), (blind, "pass")):
            if point.get("memory") == "never":  # no blind control: always a mutation fail
                got.append(("–", None, "", True))
                continue
            try:
                s, ratio, msg = status(ref, check, args.device, args.dtype, point)
            except Exception as exc:  # a broken point is a line, not the end of the run
                s, ratio, msg = "error", None, f"{type(exc).__name__}: {exc}"
            got.append((s, ratio, msg, s == want))
        ok = all(g[3] for g in got)
        bad += not ok
        worst = max((g[1] for g in got if g[1] is not None), default=None)
        note = "" if ok else "  <-- " + "; ".join(g[2][:120] for g in got if not g[3])
        print(f"{'ok ' if ok else 'BAD'} {ref:52s} {check:8s} shows={got[0][0]:5s} "
              f"blind={got[1][0]:5s} worst={worst if worst is None else f'{worst:.3g}'} "
              f"{time.perf_counter() - t0:.1f}s{note}", flush=True)
    print(f"{len(CATALOGUE) - bad} of {len(CATALOGUE)} as wanted on {args.device}/{args.dtype}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
