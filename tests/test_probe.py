"""Refusal or crash: only an explicit refusal of a device or dtype is ``unsupported``.

Everything else a kernel raises is an ``error``: exit 1, a JUnit ``<error>``. A crash that
read as "unsupported, nothing wrong found" (exit 3) would let a broken kernel ship.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import cli
from gradcheck_bi.checks.probe import probe, refusal
from gradcheck_bi.kernels.adapting.loader import load
from gradcheck_bi.vocab import Unsupported

SMALL = ["--shape", "2,3,16", "--device", "cpu", "--dtype", "fp64", "--no-progress",
         "--layout", "contiguous"]


def raised(fn: Any) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


def _assert_false() -> None:
    assert 1 + 1 == 3, "row sums disagree"


@pytest.mark.parametrize("exc", [
    # Copies of Megatron-Core's two messages (batch_invariant_kernels.py).
    RuntimeError("Batch-invariant RMSNorm requires CUDA tensors."),
    RuntimeError("Unsupported dtype for batch-invariant RMSNorm: torch.float64"),
    NotImplementedError("fused path not written yet"),
    NotImplementedError(),
    Unsupported("needs an sm90 GPU"),
    TypeError("MyNorm only supports bfloat16 and float16 inputs"),
    ValueError("fp64 is not supported by this kernel"),
    RuntimeError('"rsqrt_cpu" not implemented for \'Half\''),
    RuntimeError("this kernel does not support CPU tensors"),
    ValueError("x: dtype torch.float64 unsupported"),
], ids=repr)
def test_explicit_refusals_are_unsupported(exc: BaseException) -> None:
    why = refusal(exc)
    assert why is not None, f"{exc!r} should read as a refusal"
    assert str(exc) in why


@pytest.mark.parametrize("make", [
    lambda: raised(lambda: rsqrtt(1.0)),  # type: ignore[name-defined]  # noqa: F821
    lambda: raised(lambda: torch.rsqrtt),  # AttributeError
    lambda: raised(lambda: 1 / 0),
    lambda: raised(lambda: torch.randn(2, 3) @ torch.randn(4, 5)),  # shapes
    lambda: raised(_assert_false),
    lambda: AssertionError("x must be a CUDA tensor (requires CUDA)"),  # an assert: always
    lambda: KeyError("float64"),
    lambda: RuntimeError("CUDA error: an illegal memory access was encountered"),
    lambda: RuntimeError("Expected all tensors to be on the same device, but found at least "
                         "two devices, cuda:0 and cpu! (requires all on one)"),
    lambda: RuntimeError("expected scalar type Double but found Float"),
    lambda: TypeError("unsupported operand type(s) for *: 'float' and 'NoneType'"),
    lambda: RuntimeError("mat1 and mat2 must have the same dtype, but got Float and Double"),
    lambda: ValueError("user kernel: backward not implemented for this layout"),
], ids=lambda f: "")
def test_crashes_are_not_refusals(make: Any) -> None:
    exc = make()
    assert refusal(exc) is None, f"{type(exc).__name__}: {exc} read as a refusal"


def test_not_implemented_from_torch_function_base_is_a_crash() -> None:
    """A Function without a backward: torch's placeholder raises NotImplementedError. That is
    a broken kernel, not a refusal of the device or dtype."""

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    exc = raised(lambda: NoBackward.apply(x).sum().backward())
    assert isinstance(exc, NotImplementedError)
    assert refusal(exc) is None


CRASHERS = '''
import torch
import gradcheck_bi
from gradcheck_bi.kernels.bundled.rmsnorm import After


def _fwd(body):
    class K(After):
        @staticmethod
        def forward(ctx, x, w, eps, zcg):
            body(x)
            return After.forward(ctx, x, w, eps, zcg)
    return K


def unnamed_typo(x, weight, eps):
    return rsqrtt(x) * weight


def _typo(x):
    return rsqrtt(x)  # a NameError, as a typo in a forward gives


def _fp64(exc):
    def body(x):
        if x.dtype == torch.float64:
            raise exc
    return body


NameErrorInForward = _fwd(_typo)
AttributeErrorInForward = _fwd(lambda x: x.no_such_method())
ZeroDivisionInForward = _fwd(lambda x: 1 / 0)
AssertsInForward = _fwd(lambda x: (_ for _ in ()).throw(AssertionError("bad rows")))
ShapeErrorInForward = _fwd(lambda x: x @ torch.ones(3, 3, dtype=x.dtype))
RefusesFp64NotImplemented = _fwd(_fp64(NotImplementedError("no fp64 path")))
RefusesFp64Unsupported = _fwd(_fp64(gradcheck_bi.Unsupported("this kernel is fp32-only")))
RefusesFp64Message = _fwd(_fp64(RuntimeError(
    "Unsupported dtype for batch-invariant RMSNorm: torch.float64")))
RefusesCpu = _fwd(lambda x: (_ for _ in ()).throw(
    RuntimeError("Batch-invariant RMSNorm requires CUDA tensors.")) if not x.is_cuda else None)


class NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps, zcg):
        return After.forward(ctx, x, w, eps, zcg)
'''


@pytest.fixture(scope="module")
def crashers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kernels") / "crashers.py"
    path.write_text(CRASHERS)
    return path


def cli_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str
            ) -> tuple[int, list[dict[str, Any]], str]:
    out_file = tmp_path / "r.json"
    code = cli.main(["run", *args, "--format", "json", "--output", str(out_file)])
    _, err = capsys.readouterr()
    return code, json.loads(out_file.read_text())["results"], err


@pytest.mark.parametrize(("attr", "needle"), [
    ("NameErrorInForward", "NameError: name 'rsqrtt' is not defined"),
    ("AttributeErrorInForward", "AttributeError"),
    ("ZeroDivisionInForward", "ZeroDivisionError"),
    ("AssertsInForward", "AssertionError: bad rows"),
    ("ShapeErrorInForward", "RuntimeError"),
])
def test_a_crashing_forward_is_error_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            crashers: Path, attr: str, needle: str) -> None:
    code, results, _ = cli_run(capsys, tmp_path, "--kernel", f"{crashers}:{attr}", *SMALL,
                               "--check", "forward", "--check", "dx")
    assert code == 1, f"{attr}: exit {code}, expected 1"
    assert {r["status"] for r in results} == {"error"}, {r["status"] for r in results}
    assert all(needle in r["message"] for r in results), results[0]["message"]


def test_a_crash_whose_op_nothing_says_is_refused_at_load(
        capsys: pytest.CaptureFixture[str], crashers: Path) -> None:
    """f(x, weight, eps) fits more than one op: with a forward that only raises, reading it
    as RMSNorm would be a guess. One line, exit 2, naming the error; --op still checks it.
    (Megatron's own apply(x, weight, eps, zero_centered_gamma), the crashers above, says
    RMSNorm: each of its points reports the crash.)"""
    code = cli.main(["run", "--kernel", f"{crashers}:unnamed_typo", *SMALL])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"gradcheck-bi: error: kernel {crashers}:unnamed_typo(x, weight, eps): its forward "
        "raised NameError: name 'rsqrtt' is not defined at a small random point (fp64 and "
        "fp32 on cpu"), err
    assert "and neither its name nor its parameters say which op it is; if it is one of the " \
        "tool's ops (rms_norm, " in err, err
    assert err.endswith("`gradcheck-bi ops`), fix it or say which with --op NAME, else check "
                        "it with --generic --shape … per input (gradcheck_bi.check(fn, "
                        "inputs=(…)) from Python), which checks its backward against its own "
                        "forward"), err
    code = cli.main(["run", "--kernel", f"{crashers}:unnamed_typo", *SMALL, "--op",
                     "rms_norm", "--check", "forward"])
    capsys.readouterr()
    assert code == 1


@pytest.mark.parametrize(("attr", "needle"), [
    ("RefusesFp64NotImplemented", "NotImplementedError: no fp64 path"),
    ("RefusesFp64Unsupported", "this kernel is fp32-only"),
    ("RefusesFp64Message", "Unsupported dtype for batch-invariant RMSNorm: torch.float64"),
    ("RefusesCpu", "requires CUDA tensors"),
])
def test_an_explicit_refusal_is_unsupported_exit_3(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, crashers: Path, attr: str,
                                                   needle: str) -> None:
    code, results, _ = cli_run(capsys, tmp_path, "--kernel", f"{crashers}:{attr}", *SMALL,
                               "--check", "forward", "--check", "dx")
    assert code == 3, f"{attr}: exit {code}, expected 3"
    assert {r["status"] for r in results} == {"unsupported"}
    assert all(needle in r["message"] for r in results), results[0]["message"]


def test_strict_turns_unsupported_into_exit_1(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, crashers: Path) -> None:
    code, results, _ = cli_run(capsys, tmp_path, "--kernel", f"{crashers}:RefusesCpu",
                               *SMALL, "--check", "forward", "--strict")
    assert code == 1 and {r["status"] for r in results} == {"unsupported"}
    code = cli.main(["run", "--kernel", f"{crashers}:RefusesCpu", *SMALL, "--check", "forward",
                     "--strict", "--format", "markdown"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "VERDICT: NOT AS EXPECTED (--strict) — 6 of 6 results could not run here" in out
    # Nothing unsupported: --strict changes nothing.
    code, _, _ = cli_run(capsys, tmp_path, "--kernel", "after", *SMALL, "--check", "forward",
                         "--strict")
    assert code == 0


def test_a_function_without_backward_is_error_for_gradients(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, crashers: Path) -> None:
    code, results, _ = cli_run(capsys, tmp_path, "--kernel", f"{crashers}:NoBackward", *SMALL,
                               "--check", "forward", "--check", "dw", "--weight", "randn")
    assert code == 1
    status = {r["check"]: r["status"] for r in results}
    assert status == {"forward": "pass", "dw": "error"}, status


def test_a_crash_is_a_junit_error_and_the_verdict_says_so(
        capsys: pytest.CaptureFixture[str], crashers: Path) -> None:
    code = cli.main(["run", "--kernel", f"{crashers}:NameErrorInForward", *SMALL, "--check",
                     "forward", "--format", "junit"])
    out, _ = capsys.readouterr()
    assert code == 1
    suite = ET.fromstring(out)
    assert suite.get("errors") == "6" and suite.get("skipped") == "0", out[:300]
    errors = suite.findall(".//testcase/error")
    assert len(errors) == 6 and "NameError" in (errors[0].get("message") or "")
    code = cli.main(["run", "--kernel", f"{crashers}:NameErrorInForward", *SMALL, "--check",
                     "forward", "--format", "markdown"])
    out, _ = capsys.readouterr()
    assert "VERDICT: NOT AS EXPECTED — 6 of 6 results differ from what the kernels declare " \
           "(6 raised an error)" in out


def test_probe_decides_only_refusals(crashers: Path) -> None:
    """A crash on the tiny probe decides nothing (each point reports its own error)."""
    assert probe(load(f"{crashers}:NameErrorInForward"), "cpu", "fp64") is None
    why = probe(load(f"{crashers}:RefusesFp64NotImplemented"), "cpu", "fp64")
    assert why == "kernel refuses cpu/fp64: NotImplementedError: no fp64 path"
    assert probe(load(f"{crashers}:RefusesFp64NotImplemented"), "cpu", "fp32") is None
