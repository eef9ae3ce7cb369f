"""Faults at load: a kernel that segfaults, exits or hangs while gradcheck-bi recognises it
(its forward at a small point: ``tests/kernels/load_faults.py``) is one ``error`` result;
the other kernels run and every report is written. Before, the run died with it (a segfault:
exit 139, no report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_bi.kernels.adapting.loader import Crashed
from gradcheck_bi.runner import resolve_kernels, run
from gradcheck_bi.sweep import Sweep

ROOT = Path(__file__).resolve().parent.parent
LOAD_FAULTS = "tests/kernels/load_faults.py"

SAID = {
    "segfault_when_small": "the kernel killed the process with SIGSEGV while it was "
                           "recognised at load (its forward at a (3, 8) float64 point on cpu)",
    "exit_when_small": "the kernel ended the process (exit code 3) while it was recognised",
    "sys_exit_when_small": "the kernel raised SystemExit: 0 while it was recognised",
}


@pytest.mark.parametrize("fault", sorted(SAID))
def test_a_crash_at_load_is_one_error_and_the_other_kernels_run(fault: str) -> None:
    specs = resolve_kernels([f"{LOAD_FAULTS}:{fault}", "after"])
    assert isinstance(specs[0].fn, Crashed), specs[0]
    sweep = Sweep(kernels=[s.name for s in specs], targets=[("cpu", "fp64")],
                  shapes=[(2, 24)], weights=["randn"], zcg=[False], checks=["forward", "dx"])
    results = run(sweep, specs)
    mine = [r for r in results if r.kernel == specs[0].name]
    assert len(mine) == 1 and mine[0].status == "error" and not mine[0].as_expected, mine
    assert SAID[fault] in mine[0].message and "none of its points ran" in mine[0].message, \
        mine[0].message
    others = [r.status for r in results if r.kernel == "after"]
    assert others and set(others) == {"pass"}, others


def test_a_kernel_that_runs_is_recognised_as_before_and_never_called_here() -> None:
    # The probe's calls ran in the child and were replayed: the same recognition.
    called = []
    import torch

    def my_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        called.append(tuple(x.shape))
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    from gradcheck_bi.kernels import adapt

    spec = adapt(my_rms_norm, "mine", "api")
    assert spec.zcg_how == "absent (γ = w)" and spec.op == "rms_norm", spec
    assert called == [], f"called in this process at load: {called}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "GRADCHECK_BI_ISOLATE"}
    return subprocess.run([sys.executable, "-m", "gradcheck_bi", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)})


def test_the_gate_reports_a_segfault_at_load_and_a_hang_at_load(tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    case = tmp_path / "gate.toml"
    case.write_text('targets = ["cpu/fp64"]\nweights = ["randn"]\nzcg = [false]\n'
                    'checks = ["forward", "dx"]\nshapes = [[2, 24]]\ntimeout = 2\n')
    done = _cli("--case", str(case), "--kernel", f"{LOAD_FAULTS}:segfault_when_small",
                "--kernel", f"{LOAD_FAULTS}:hang_when_small", "--kernel", "after",
                "--format", "json", "--output", str(tmp_path / "r.json"))
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    by_kernel: dict[str, list[dict[str, object]]] = {}
    for r in results:
        by_kernel.setdefault(str(r["kernel"]).rsplit(":", 1)[-1], []).append(r)
    assert {r["status"] for r in by_kernel["after"]} == {"pass"}, by_kernel["after"]
    (segv,), (hang,) = by_kernel["segfault_when_small"], by_kernel["hang_when_small"]
    assert segv["status"] == "error" and "SIGSEGV" in str(segv["message"]), segv
    assert hang["status"] == "error" and "did not finish in 2 s while it was recognised" \
        in str(hang["message"]), hang
    done = _cli("--case", str(case), "--kernel", f"{LOAD_FAULTS}:segfault_when_small",
                "--format", "junit", "--output", str(junit))
    assert done.returncode == 1 and "SIGSEGV" in junit.read_text(), done.stderr[-2000:]


def test_a_spawned_child_records_what_a_forked_one_does() -> None:
    # Where a kernel runs on CUDA only, its calls are recorded in a spawned child that loads
    # it by reference (a forked child cannot use CUDA): the same outcomes, in order.
    from gradcheck_bi.kernels import registry
    from gradcheck_bi.kernels.adapting import sandbox

    ref = "tests/kernels/user_rmsnorm.py:Correct"
    spawned = sandbox._record("spawn", None, ref, (registry.resolve, ref, {}))
    forked = sandbox._record("fork", lambda: registry.resolve(ref, {}), ref, None)
    assert spawned is not None and forked is not None and len(spawned) == len(forked) > 0
    assert [k for k, _ in spawned] == [k for k, _ in forked], (spawned, forked)
    with pytest.raises(sandbox.KernelCrashed, match="SIGSEGV"):
        bad = f"{LOAD_FAULTS}:segfault_when_small"
        sandbox._record("spawn", None, bad, (registry.resolve, bad, {}))

