"""gradcheck_bi.check(): the γ=randn gradient check inside a project's own pytest suite."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

import gradcheck_bi
from gradcheck_bi.kernels.adapting.loader import load

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "kernels"
# A project's own kernels would be imported normally; these test files are loaded by path.
Correct = load(f"{KERNELS}/user_rmsnorm.py:Correct").fn
DxDoubleWeight = load(f"{KERNELS}/user_rmsnorm.py:DxDoubleWeight").fn
MegatronLike = load(f"{KERNELS}/megatron_like.py:BatchInvariantRMSNormFn").fn


def test_rmsnorm_backward_moves_with_gamma() -> None:
    """The README's example: dx and dw at a trained-looking γ, both zcg modes."""
    report = gradcheck_bi.check(Correct, layouts=["contiguous"],
                                checks=["dx", "dw"], weights=["randn", "ones"],
                                shapes=[(4, 1000)], weight_scales=[30.0])
    assert report.ok and len(report.results) == 8
    assert all(r.max_abs_err is not None and r.max_abs_err <= r.tolerance  # type: ignore[operator]
               for r in report.results)


def test_a_wrong_backward_raises_an_assertion_that_names_it() -> None:
    with pytest.raises(gradcheck_bi.GradcheckFailure) as info:
        gradcheck_bi.check(DxDoubleWeight, layouts=["contiguous"],
                           checks=["dx"], shapes=[(3, 2, 40)], zcg=[False])
    msg = str(info.value)
    assert isinstance(info.value, AssertionError)
    assert "1 of 3 results differ from what the kernels declare" in msg
    assert "DxDoubleWeight dx cpu/fp64 shape (3, 2, 40) γ=randn" in msg
    assert [r.weight for r in info.value.report.failed] == ["randn"]  # ones is blind


def test_report_without_raising() -> None:
    report = gradcheck_bi.check(DxDoubleWeight, layouts=["contiguous"],
                                checks=["dx"], shapes=[(2, 33)],
                                raise_on_failure=False)
    assert report.exit_code == 1 and not report.ok
    assert {(r.weight, r.zero_centered_gamma) for r in report.failed} == {
        ("randn", False), ("randn", True)}


def test_expect_fail_turns_a_known_defect_into_a_pass() -> None:
    report = gradcheck_bi.check(DxDoubleWeight, layouts=["contiguous"],
                                checks=["dx"], weights=["randn"],
                                shapes=[(2, 33)], expect="fail")
    assert report.ok and {r.status for r in report.results} == {"fail"}


def test_all_unsupported_is_a_skip_not_a_pass() -> None:
    with pytest.raises(gradcheck_bi.GradcheckSkipped) as info:
        gradcheck_bi.check(MegatronLike, layouts=["contiguous"],
                           checks=["forward"], dtype="fp32")
    assert isinstance(info.value, unittest.SkipTest)
    report = info.value.report
    assert report.exit_code == 3 and len(report.unsupported) == len(report.results) == 6
    assert "6 of 6 results could not run here" in str(info.value)
    assert "requires CUDA tensors" in str(info.value)


def test_unsupported_report_without_raising() -> None:
    report = gradcheck_bi.check(MegatronLike, layouts=["contiguous"],
                                checks=["forward"], dtype="fp32",
                                raise_on_failure=False)
    assert report.exit_code == 3 and len(report.unsupported) == 6 and not report.failed


def test_strict_makes_unsupported_a_failure() -> None:
    with pytest.raises(gradcheck_bi.GradcheckFailure) as info:
        gradcheck_bi.check(MegatronLike, layouts=["contiguous"],
                           checks=["forward"], dtype="fp32", strict=True)
    assert info.value.report.exit_code == 1
    assert "NOT AS EXPECTED (--strict) — 6 of 6 results could not run here" in str(
        info.value)


def test_some_unsupported_returns_the_report(tmp_path: Path) -> None:
    """Only part unsupported (here: fp64 refused by dx/dw's backward only): no skip, no raise;
    ``strict=True`` raises."""
    (tmp_path / "bwd_fp32_only.py").write_text(
        "from gradcheck_bi.kernels.bundled.rmsnorm import After\n"
        "class Fn(After):\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        if g.dtype == __import__('torch').float64:\n"
        "            raise NotImplementedError('backward supports fp32 only')\n"
        "        return After.backward(ctx, g)\n")
    fn = load(f"{tmp_path}/bwd_fp32_only.py:Fn").fn
    report = gradcheck_bi.check(fn, layouts=["contiguous"],
                                checks=["forward", "dx"], weights=["randn"], zcg=[False],
                                shapes=[(2, 16)])
    assert [r.status for r in report.results] == ["pass", "unsupported"], report
    assert report.exit_code == 3
    with pytest.raises(gradcheck_bi.GradcheckFailure):
        gradcheck_bi.check(fn, layouts=["contiguous"],
                           checks=["forward", "dx"], weights=["randn"], zcg=[False],
                           shapes=[(2, 16)], strict=True)


def test_a_crashing_kernel_raises(tmp_path: Path) -> None:
    (tmp_path / "typo.py").write_text(
        "import torch\n"
        "class Fn(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, w, eps, zcg):\n"
        "        return x * torch.rsqrtt(x.pow(2).mean(-1, keepdim=True) + eps) * w\n")
    fn = load(f"{tmp_path}/typo.py:Fn").fn
    with pytest.raises(gradcheck_bi.GradcheckFailure) as info:
        gradcheck_bi.check(fn, checks=["forward"], shapes=[(2, 16)])
    assert {r.status for r in info.value.report.results} == {"error"}
    assert "AttributeError" in str(info.value) and "rsqrtt" in str(info.value)


def _user_pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """A user's suite of one file, ``body``, run by pytest in a fresh process."""
    (tmp_path / "test_user.py").write_text("import gradcheck_bi\n" + body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_user.py")], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_pytest_shows_all_unsupported_as_skipped(tmp_path: Path) -> None:
    """What a user's suite sees: a skip, not a pass and not a failure."""
    done = _user_pytest(
        tmp_path,
        "from gradcheck_bi.kernels.adapting.loader import load\n"
        f"Fn = load({str(KERNELS / 'megatron_like.py')!r} + ':BatchInvariantRMSNormFn').fn\n"
        "def test_it():\n"
        "    gradcheck_bi.check(Fn, checks=['forward'], dtype='fp32', shapes=[(2, 16)])\n")
    assert "1 skipped" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, done.stdout


def test_pytest_shows_the_users_call_not_our_source(tmp_path: Path) -> None:
    """A failing check() and a bad argument lead with the user's line and our message; the
    frames of check() and its validators are hidden (``__tracebackhide__``)."""
    done = _user_pytest(
        tmp_path,
        "from gradcheck_bi.kernels.bundled.rmsnorm import Before\n"
        "def test_defective():\n"  # the class, not the name "before": expected to pass
        "    gradcheck_bi.check(Before, checks='dx', weights='randn', zcg=False,\n"
        "                       shapes=(3, 16), layouts='contiguous')\n"
        "def test_bad_argument():\n"
        "    gradcheck_bi.check(Before, dtype='float33')\n"
        "def test_bad_value():\n"
        "    gradcheck_bi.check(Before, eps=0.0)\n")
    out = done.stdout
    assert "3 failed" in out, out + done.stderr
    assert "GradcheckFailure: gradcheck-bi: VERDICT: NOT AS EXPECTED" in out, out
    assert "Before dx cpu/fp64 shape (3, 16) γ=randn zcg=off" in out, out
    assert "argument 'dtype'" in out and "argument 'eps'" in out, out
    for ours in ("raise GradcheckFailure", "def check(", "raise ValueError", "raise CaseError",
                 str(ROOT / "gradcheck_bi")):
        assert ours not in out, f"{ours!r} in the user's report:\n{out}"


def test_bundled_names_keep_their_declared_defects() -> None:
    report = gradcheck_bi.check("before", checks=["forward"], zcg=[True], shapes=[(2, 16)])
    assert report.ok and {r.status for r in report.results} == {"fail"}


def test_not_a_kernel() -> None:
    with pytest.raises(TypeError, match="not a kernel: expected an autograd Function"):
        gradcheck_bi.check(3)
    # x → x computes no op: refused naming the nearest, never asked for a norm's parameters
    with pytest.raises(TypeError, match=r"<lambda>\(x\): its output at a small random point "
                                        r"matches no op here \(nearest: ") as refused:
        gradcheck_bi.check(lambda x: x)
    assert "x, weight, eps" not in str(refused.value)
    assert "say which with --op NAME, else check it with --generic" in str(refused.value)


def _threads_seen(monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> set[tuple]:
    """What torch's thread count and the FD loop's pin were while the kernel ran."""
    import torch

    from gradcheck_bi.fd import threads as fd_threads

    seen: set[tuple] = set()
    # Here: the kernel's calls (at load too: kernels/adapting/sandbox.py) run in this process, seen.
    monkeypatch.setenv("GRADCHECK_BI_ISOLATE", "0")

    def kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        seen.add((torch.get_num_threads(), fd_threads.fixed_threads()))
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    gradcheck_bi.check(kernel, checks="forward", weights="randn", zcg=False, shapes=(2, 16),
                       **kwargs)
    return seen


def test_the_api_gets_the_clis_thread_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """check() applies the CLI's policy (threads=N, else OMP_NUM_THREADS, else one thread
    outside the loop's own choice) while it runs, and gives the caller its settings back."""
    import torch

    from gradcheck_bi.fd import threads as fd_threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(5)  # the caller's own setting, which the check must not use
        seen = _threads_seen(monkeypatch)
        assert (1, None) in seen and all(n <= fd_threads.usable_cores() and fixed is None
                                         for n, fixed in seen), seen
        assert _threads_seen(monkeypatch, threads=3) == {(3, 3)}
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert _threads_seen(monkeypatch) == {(2, 2)}
        assert (torch.get_num_threads(), fd_threads.fixed_threads()) == (5, None)
        for bad in (0, "2", True):
            with pytest.raises(ValueError, match="threads="):
                gradcheck_bi.check("after", checks="forward", threads=bad)
    finally:
        torch.set_num_threads(before)
