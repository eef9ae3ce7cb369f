"""Bad input never crashes the tool: one line, the contract's exit code, no partial file.

Exit codes (DESIGN.md): 2 for bad usage or input, decided before anything runs — nothing is
written to ``--output``; 1 when a kernel misbehaves while being measured (raises, returns
NaN/Inf, a wrong shape or dtype, a gradient of the wrong shape) — every such point is an
``error`` or ``fail`` result with a one-line message and the report is written, because it
*is* the verdict; 3 when something asked for cannot run here; 130 on Ctrl-C, with nothing
written. No traceback unless ``--debug``.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gradcheck_bi import cli

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--shape", "2,3,16", "--device", "cpu", "--dtype", "fp64"]

# Kernels that go wrong in every way a kernel can, each a thin wrapper around `after`.
BAD_KERNELS = '''
import torch
from gradcheck_bi.kernels.bundled.rmsnorm import After


def _wrap(fwd=None, bwd=None, fwd_raises=None, bwd_raises=None):
    class K(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, eps, zcg):
            if fwd_raises is not None and fwd_raises(x):
                raise RuntimeError("boom in forward")
            y = After.forward(ctx, x, w, eps, zcg)
            return fwd(y) if fwd else y

        @staticmethod
        def backward(ctx, g):
            if bwd_raises:
                raise RuntimeError("boom in backward")
            dx, dw, _, _ = After.backward(ctx, g)
            dx, dw = bwd(dx, dw) if bwd else (dx, dw)
            return dx, dw, None, None
    return K


AlwaysRaises = _wrap(fwd_raises=lambda x: True)
RaisesOnBigBatches = _wrap(fwd_raises=lambda x: x.numel() > 200)
RaisesInBackward = _wrap(bwd_raises=True)
ReturnsNaN = _wrap(fwd=lambda y: y * float("nan"))
ReturnsInf = _wrap(fwd=lambda y: y / 0.0)
InfGradient = _wrap(bwd=lambda dx, dw: (dx * float("inf"), dw))
WrongShape = _wrap(fwd=lambda y: y[..., :-1])
WrongDtype = _wrap(fwd=lambda y: y.float())
ReturnsTuple = _wrap(fwd=lambda y: (y, y))
WrongDxShape = _wrap(bwd=lambda dx, dw: (dx[..., :-1], dw))
WrongDwSize = _wrap(bwd=lambda dx, dw: (dx, dw[:-1]))
NotAFunction = 42
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kernels")
    (folder / "bad.py").write_text(BAD_KERNELS)
    (folder / "raises_at_import.py").write_text('raise RuntimeError("import-time failure")\n')
    (folder / "syntax_error.py").write_text("class Broken(:\n")
    return folder


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def assert_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str,
                       needles: tuple[str, ...] = ()) -> None:
    """Exit 2, one line naming the problem, and nothing at all written to --output."""
    out_file = tmp_path / "report.json"
    code, out, err = run(capsys, *args, "--format", "json", "--output", str(out_file))
    assert code == 2, f"exit {code}, expected 2; stderr: {err}"
    assert_one_line(err, "gradcheck-bi: error:", *needles)
    assert out == ""
    assert list(tmp_path.iterdir()) == [], f"left behind: {list(tmp_path.iterdir())}"


# --- kernels that cannot be loaded: exit 2 -------------------------------------------------


def test_missing_kernel_file(capsys: Any, tmp_path: Path) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "no/such/file.py:Fn", *SMALL,
                       needles=("no/such/file.py", "not found"))


def test_file_without_the_attribute(capsys: Any, tmp_path: Path, kernels: Path) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", f"{kernels}/bad.py:Nope", *SMALL,
                       needles=("no attribute 'Nope'",))


def test_attribute_that_is_not_a_function(capsys: Any, tmp_path: Path, kernels: Path) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", f"{kernels}/bad.py:NotAFunction",
                       *SMALL, needles=("not a kernel: expected an autograd Function",))


@pytest.mark.parametrize(("name", "needle"), [("raises_at_import", "import-time failure"),
                                              ("syntax_error", "SyntaxError")])
def test_kernel_whose_import_raises(capsys: Any, tmp_path: Path, kernels: Path, name: str,
                                    needle: str) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", f"{kernels}/{name}.py:Fn", *SMALL,
                       needles=("failed to import", needle))


def test_unknown_bundled_name(capsys: Any, tmp_path: Path) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "aftre", *SMALL,
                       needles=("unknown kernel 'aftre'",))


# --- bad options: exit 2 ----------------------------------------------------------------


@pytest.mark.parametrize("eps", ["0", "-1e-6", "nan", "inf"])
def test_eps_must_be_positive_and_finite(capsys: Any, tmp_path: Path, eps: str) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "after", *SMALL, f"--eps={eps}",
                       needles=("--eps",))


@pytest.mark.parametrize("shape", ["2,0,16", "0", "-1,16", "2,-3,16", "abc", "2,,16", ""])
def test_shape_must_be_positive_integers(capsys: Any, tmp_path: Path, shape: str) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "after", "--device", "cpu",
                       f"--shape={shape}", needles=("--shape",))


@pytest.mark.parametrize("args", [["--check", "jacobian"], ["--weight", "twos"],
                                  ["--dtype", "fp8"], ["--device", "tpu"], ["--bogus"]])
def test_unknown_option_values(capsys: Any, tmp_path: Path, args: list[str]) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "after", *args)


def test_output_folder_missing(capsys: Any, tmp_path: Path) -> None:
    code, _, err = run(capsys, "run", "--kernel", "after", *SMALL, "--check", "forward",
                       "--output", str(tmp_path / "nope" / "r.json"))
    assert code == 2
    assert_one_line(err, "does not exist")


@pytest.mark.parametrize("args", [["--shape", "64,4096", "--max-memory", "1M"],
                                  ["--shape", "64,4096", "--max-memory", "1M",
                                   "--mode", "directional"],  # no note before the error
                                  ["--shape", "1000000,65536"]])
def test_shape_over_the_memory_budget_is_refused_up_front(capsys: Any, tmp_path: Path,
                                                          args: list[str]) -> None:
    """Refused before any tensor is allocated, with the estimate in the message."""
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "after", "--device", "cpu", *args,
                       needles=("needs at least", "memory budget"))


def test_row_op_shape_over_the_budget_is_refused_up_front(capsys: Any, tmp_path: Path) -> None:
    """A layer norm's dx perturbs one column of every row per call, which needs more than
    the row-chunked estimator's budget (``fd.memory_estimate``): a budget between the two is
    refused with the estimate of the check that runs (exit 2), not run into 'unsupported'
    results — an RMSNorm's dx too, on the same engine."""
    import math

    import torch

    from gradcheck_bi.fd import CENTRAL4, memory_estimate
    from gradcheck_bi.fd.coloured import least_bytes

    shape = (8, 64)
    rms, row_op = memory_estimate(8, 64, CENTRAL4, torch.float64), least_bytes(shape)
    assert rms < row_op
    between = str(math.isqrt(rms * row_op))
    layer_norm = str(Path(__file__).parent / "kernels" / "layer_norm.py")
    common = ("--device", "cpu", "--dtype", "fp64", "--shape", "8,64", "--check", "dx",
              "--max-memory", between, "--zcg", "off", "--weight", "randn")
    assert_usage_error(capsys, tmp_path, "run", "--kernel", layer_norm, *common,
                       needles=("needs at least 240.0 KiB", "memory budget"))
    assert_usage_error(capsys, tmp_path, "run", "--kernel", "after", *common,
                       needles=("needs at least 240.0 KiB", "memory budget"))


# --- kernels that misbehave while measured: error/fail results, exit 1 -------------------


def run_bad(capsys: Any, tmp_path: Path, kernels: Path, attr: str,
            *extra: str) -> tuple[int, list[dict[str, Any]], str]:
    out_file = tmp_path / "report.json"
    code, _, err = run(capsys, "run", "--kernel", f"{kernels}/bad.py:{attr}", *SMALL,
                       "--zcg", "off", *extra, "--format", "json", "--output", str(out_file))
    assert "Traceback" not in err
    doc = json.loads(out_file.read_text())
    assert doc["ok"] is (code == 0)
    for r in doc["results"]:
        assert "\n" not in r.get("message", ""), r["message"]
    return code, doc["results"], err


def statuses(results: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in results:
        out.setdefault(r["check"], set()).add(r["status"])
    return out


@pytest.mark.parametrize(("attr", "check", "status", "needle"), [
    ("RaisesInBackward", "dx", "error", "RuntimeError: boom in backward"),
    ("RaisesOnBigBatches", "dx", "error", "RuntimeError: boom in forward"),
    ("ReturnsNaN", "forward", "fail", "y has 96 non-finite element(s)"),
    ("ReturnsInf", "forward", "fail", "non-finite"),
    ("InfGradient", "dx", "fail", "analytic dx has 96 non-finite element(s)"),
    ("WrongShape", "forward", "error",
     "forward returned y of shape (2, 3, 15) for x of (2, 3, 16)"),
    ("WrongDtype", "forward", "error",
     "forward returned y in torch.float32 for x of torch.float64"),
    ("ReturnsTuple", "forward", "error", "forward returned tuple, expected a tensor"),
    # A gradient of the wrong shape is a wrong answer, not a crash: fail.
    ("WrongDxShape", "dx", "fail", "invalid gradient at index 0"),
    ("WrongDwSize", "dw", "fail", "invalid gradient at index 1"),
])
def test_misbehaving_kernel_is_a_result_not_a_crash(capsys: Any, tmp_path: Path,
                                                    kernels: Path, attr: str, check: str,
                                                    status: str, needle: str) -> None:
    code, results, err = run_bad(capsys, tmp_path, kernels, attr)
    assert code == 1, f"{attr}: exit {code}, expected 1; {err}"
    hit = [r for r in results if r["check"] == check and r["status"] == status]
    assert hit, f"{attr}: no {status} result for {check}: {statuses(results)}"
    assert any(needle in r.get("message", "") for r in hit), (
        f"{attr}: {needle!r} not in {[r.get('message') for r in hit]}")


def test_forward_that_always_raises_is_an_error_not_unsupported(capsys: Any, tmp_path: Path,
                                                                kernels: Path) -> None:
    """A forward that raises on every input, with a message that refuses nothing, is a crash:
    every point an ``error`` with the kernel's message, exit 1 — never ``unsupported``, which
    is kept for explicit refusals of a device or dtype (tests/test_probe.py)."""
    code, results, _ = run_bad(capsys, tmp_path, kernels, "AlwaysRaises")
    assert code == 1
    assert {r["status"] for r in results} == {"error"}
    assert all("RuntimeError: boom in forward" in r["message"] for r in results)


def test_debug_shows_the_traceback(capsys: Any, tmp_path: Path, kernels: Path) -> None:
    with pytest.raises(Exception, match="import-time failure"):
        cli.main(["run", "--kernel", f"{kernels}/raises_at_import.py:Fn", *SMALL, "--debug"])


# --- the machine cannot do what was asked: exit 3 ----------------------------------------


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")
def test_device_cuda_without_a_gpu(capsys: Any, tmp_path: Path) -> None:
    out_file = tmp_path / "report.json"
    code, _, err = run(capsys, "run", "--kernel", "after", "--device", "cuda", "--shape",
                       "2,3,16", "--format", "json", "--output", str(out_file))
    assert code == 3, err
    assert "Traceback" not in err
    results = json.loads(out_file.read_text())["results"]
    assert results and {r["status"] for r in results} == {"unsupported"}
    assert all("no CUDA GPU" in r["message"] for r in results)


# --- case files: exit 2, nothing written -----------------------------------------------

HAS_CASE = "case" in inspect.signature(cli.run_command).parameters
needs_case = pytest.mark.skipif(not HAS_CASE, reason="--case not wired into the CLI yet")


@needs_case
@pytest.mark.parametrize(("text", "needle"), [
    ("shapes = [[2, 8, 256]\n", "not valid TOML"),
    ("kernels = ['after']\nshapez = [[2, 16]]\n", "unknown key 'shapez'"),
    ("[[sweep]]\nname = 'x'\nrepeats = 3\n", "unknown key 'repeats'"),
    ("shapes = '2,8,256'\n", "'shapes'"),
    ("seeds = [1.5]\n", "'seeds'"),
    ("zcg = ['yes']\n", "'zcg'"),
    ("eps = [0.0]\n", "'eps'"),
    ("eps = [-1e-6]\n", "'eps'"),
    ("eps = [nan]\n", "'eps'"),
    ("shapes = [[2, 0, 16]]\n", "'shapes'"),
    ("shapes = [[-2, 16]]\n", "'shapes'"),
    ("shapes = [[]]\n", "'shapes'"),
])
def test_bad_case_file(capsys: Any, tmp_path: Path, text: str, needle: str) -> None:
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    case = case_dir / "bad.toml"
    case.write_text(text)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert_usage_error(capsys, out_dir, "run", "--case", str(case), "--kernel", "after",
                       needles=("bad.toml", needle))


@needs_case
def test_missing_case_file(capsys: Any, tmp_path: Path) -> None:
    assert_usage_error(capsys, tmp_path, "run", "--case", str(tmp_path / "nope.toml"),
                       needles=("nope.toml", "not found"))


@needs_case
def test_case_file_never_executes_code(capsys: Any, tmp_path: Path) -> None:
    """A case names kernels; it cannot run code. A string that looks like code is just an
    unknown bundled kernel name."""
    marker = tmp_path / "pwned"
    case = tmp_path / "evil.toml"
    case.write_text(f"kernels = [\"__import__('pathlib').Path('{marker}').touch()\"]\n")
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = run(capsys, "run", "--case", str(case), *SMALL, "--output",
                       str(out / "r.json"))
    assert code == 2 and not marker.exists()
    assert_one_line(err, "gradcheck-bi: error:")


# --- Ctrl-C mid-sweep: exit 130, nothing written ----------------------------------------

SLOW_KERNEL = '''
import pathlib
from gradcheck_bi.kernels.bundled.rmsnorm import After

MARK = pathlib.Path(__file__).with_name("started")


class Slow(After):
    @staticmethod
    def forward(ctx, x, w, eps, zcg):
        MARK.touch()  # the sweep is under way
        return After.forward(ctx, x, w, eps, zcg)
'''


def test_ctrl_c_mid_sweep_discards_partial_results(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW_KERNEL)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradcheck_bi", "run", "--kernel", f"{tmp_path}/slow.py:Slow",
         "--device", "cpu", "--dtype", "fp64", "--shape", "4,8,512", "--format", "json",
         "--output", str(out_dir / "report.json")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert proc.poll() is None, f"exited early: {proc.communicate()}"
            assert time.monotonic() < deadline, "the sweep never started"
            time.sleep(0.05)
        time.sleep(1.0)  # well inside the sweep (it takes tens of seconds)
        assert proc.poll() is None, "the sweep finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, f"exit {proc.returncode}; stderr: {err}"
    assert "Traceback" not in err
    assert_one_line(err, "interrupted")
    assert out == ""
    assert list(out_dir.iterdir()) == [], f"left behind: {list(out_dir.iterdir())}"
