"""Real libraries' entry points as a new user points the tool at them, with no flags: each
stand-in of tests/kernels/entry_points.py run through ``gradcheck-bi run``, one Markdown row
each — the exit code, the seconds to verdict, and the line that says what happened (the
refusal, else the recognition note and the verdict).

    PYTHONPATH=. python benchmarks/entry_points.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

FILE = "tests/kernels/entry_points.py"
# (stand-in, what it stands for, extra arguments)
ROWS: list[tuple[str, str, list[str]]] = [
    ("TritonSiluMul", "a Triton swiglu Function `forward(ctx, A, B)`", []),
    ("LigerSiLUMulFunction", "Liger 0.8.5 `LigerSiLUMulFunction(a, b, gate_multiplier, "
     "down_multiplier)`", []),
    ("LigerSiLUMulDropsGate", "its mutant: da without m_g", []),
    ("GeluAndMulFn", "a Triton `GeluAndMul(x, y, approximate=\"none\")`", []),
    ("l2norm", "an L2 norm `l2norm(x, eps, output_dtype)`", []),
    ("LigerStyleCE", "a cross-entropy Function (Liger's signature)", []),
    ("fused_add_layer_norm", "a fused add + LayerNorm with bias, no backward", []),
    ("rmsnorm_fn", "Mamba-2 `rmsnorm_fn(x, weight, bias, z, eps, group_size, "
     "norm_before_gate)`", []),
    ("rms_norm_gated", "fla `rms_norm_gated(x, g, weight, bias, activation, …)`", []),
    ("SiluAndMul", "vLLM `SiluAndMul` module, `forward(x)`", []),
    ("SiluAndMul", "the same, `--op silu_and_mul`", ["--op", "silu_and_mul"]),
    ("GeluAndMul", "vLLM `GeluAndMul(approximate)` module, `forward(x)`", []),
    ("SiLUMul", "a Liger-style `forward(ctx, a, b)` swiglu, no SwiGLU name", []),
    ("SiLUMulTorchSigmoid", "a correct swiglu on `torch.sigmoid` (CPU), shape 3,37",
     ["--shape", "3,37", "--dtype", "fp32"]),
]


def said(err: str, out: str) -> str:
    """The line that says what happened: an error, else the recognition note and the
    verdict (the first failure's head where one failed)."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("gradcheck-bi: error:")]
    if errors:
        return errors[0].removeprefix("gradcheck-bi: error: ")
    notes = [ln.removeprefix("gradcheck-bi: note: ") for ln in lines if "recognised" in ln]
    body = out.splitlines()
    verdict = next((ln for ln in body if ln.startswith("VERDICT")), "no verdict")
    first = next((i for i, ln in enumerate(body) if ln.startswith("✗")), None)
    failure = (" ".join(s.strip() for s in body[first:first + 6])[:520] + " … "
               if first is not None else "")
    return " · ".join([*notes[:1], failure + verdict])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a stand-in's name (repeatable)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "."), "COLUMNS": "400"}
    print("| entry point (stand-in) | exit | s | what the tool said |")
    print("| --- | --- | --- | --- |")
    for name, what, extra in ROWS:
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, "-m", "gradcheck_bi", "run", "--kernel", f"{FILE}:{name}",
               "--no-progress", *extra]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        took = time.perf_counter() - start
        line = said(done.stderr, done.stdout).replace("|", "\\|")
        print(f"| {what} (`{name}`) | {done.returncode} | {took:.1f} | {line} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
