"""Does a kernel that crashes, exits or hangs at one shape cost that shape only?

Runs ``cases/ci.toml`` against kernels that misbehave at D = 1025 only and prints, per
kernel: the exit code, whether the JUnit report was written, the statuses, and the distinct
error messages (the dead points named). CPU: ``tests/kernels/faults.py`` (sys.exit(0),
os._exit(0), SIGSEGV, SIGABRT, a hang under ``--timeout 20``: one timeout per shape, not
per point; and the healthy twin, the time to beat); ``--cuda``: a Triton kernel
that stores out of bounds at that width and so poisons the CUDA context
(``tests/kernels/oob_triton.py``), and its healthy twin.

    PYTHONPATH=. python benchmarks/faults.py [--cuda] [--out DIR] [--only NAME]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
CPU = [("SysExitInBackward", []), ("OsExitInForward", []), ("SegfaultInForward", []),
       ("AbortInForward", []), ("HangInBackward", ["--timeout", "20"]),
       ("Healthy", ["--timeout", "20"])]
CUDA = [("oob_triton.py:OobAt1025", []), ("oob_triton.py:Healthy", [])]


def one(kernel: str, extra: list[str], device: list[str], out: Path) -> None:
    """One run of cases/ci.toml with ``--format junit``; what the JUnit report holds."""
    junit = out / f"{kernel.split(':')[-1]}.xml"
    cmd = [sys.executable, "-m", "gradcheck_bi", "run", "--case", "cases/ci.toml",
           "--kernel", f"tests/kernels/{kernel}", *device, *extra,
           "--format", "junit", "--output", str(junit)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True)
    took = time.perf_counter() - t0
    print(f"== {kernel} {' '.join(device + extra)}")
    print(f"   exit {done.returncode}, {took:.0f} s, JUnit written: {junit.exists()}")
    if not junit.exists():
        print("   stderr tail:", done.stderr[-600:])
        return
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    statuses: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[tuple[str, str]] = collections.Counter()
    for case in cases:
        bad = case.find("error")
        kind = ("error" if bad is not None else "fail" if case.find("failure") is not None
                else "skipped" if case.find("skipped") is not None else "pass")
        statuses[kind] += 1
        if bad is not None:
            message = bad.get("message", "")
            errors[(case.get("name", "").split(" ")[1], message.split(": error: ")[-1])] += 1
    print(f"   {sum(statuses.values())} testcases: {dict(statuses)}")
    for (shape, message), n in sorted(errors.items()):
        print(f"   {n:3d} x error at {shape}: {message}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", action="store_true", help="the poisoned-context kernels on CUDA")
    ap.add_argument("--out", type=Path, default=None, help="where the reports go")
    ap.add_argument("--only", default=None, help="one kernel (a substring of its name)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="faults-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.cuda:
        rows = [(f"{k}", e, ["--device", "cuda", "--dtype", "fp32"]) for k, e in CUDA]
    else:
        rows = [(f"faults.py:{k}", e, []) for k, e in CPU]
    for kernel, extra, device in rows:
        if args.only is None or args.only in kernel:
            one(kernel, extra, device, out)


if __name__ == "__main__":
    main()
