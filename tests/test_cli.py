"""The `run` command end to end: exit codes, the tables, JSON, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_bi.cli import main

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "gradcheck_bi", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def test_reviewer_command_shows_the_before_after_pattern() -> None:
    p = cli("run", "--dtype", "fp64", "--device", "cpu", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["tool"] == "gradcheck-bi" and doc["ok"] is True
    res = {(r["kernel"], r["check"], r["weight"], r["zero_centered_gamma"]): r
           for r in doc["results"]}
    err = {k: v["max_abs_err"] for k, v in res.items()}
    assert err["before", "dx", "randn", False] > 1e-2
    assert err["after", "dx", "randn", False] <= 1e-9
    assert err["before", "dx", "ones", False] == err["after", "dx", "ones", False]
    assert err["before", "dx", "zeros", False] == err["after", "dx", "zeros", False] == 0.0
    assert err["before", "forward", "randn", True] > 1.0
    assert err["after", "forward", "randn", True] < 1e-13
    for r in doc["results"]:
        for key in ("kernel", "check", "device", "dtype", "shape", "eps", "seed", "weight",
                    "zero_centered_gamma", "max_abs_err", "tolerance", "status", "expected",
                    "as_expected"):
            assert key in r, key
        assert r["device"] == "cpu" and r["dtype"] == "fp64" and r["shape"] == [2, 8, 256]


def test_table_output_names_controls_ratio_and_verdict() -> None:
    p = cli("run", "--dtype", "fp64", "--device", "cpu", "--check", "dx")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "γ=ones (control)" in out and "discrimination ratio" in out
    # 2 kernels × 3 γ × 2 zcg, and 2 × 2 × 2 at a strided x and a strided cotangent (γ=randn)
    assert "VERDICT: all 20 results as expected" in out
    assert "\x1b[" not in out  # no colour codes when not a terminal / NO_COLOR


def test_markdown_is_a_pasteable_table() -> None:
    p = cli("run", "--device", "cpu", "--check", "dx", "--zcg", "off", "--format", "markdown")
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| before | cpu fp64 |")]
    assert len(rows) == 1 and "fail" in rows[0] and "pass" in rows[0]
    # The layout rows run at γ = randn only: the other cells are empty.
    assert any(line.startswith("| before | cpu fp64 x-strided | ") and "| — | — |" in line
               for line in p.stdout.splitlines())


def test_a_defect_where_none_is_expected_exits_1(tmp_path: Path) -> None:
    # A bundled defective kernel run with --atol loose enough hides its defect: the declared
    # defect is then no longer detected, which is not as expected.
    out = tmp_path / "r.json"
    code = main(["run", "--kernel", "before", "--check", "dx", "--weight", "randn",
                 "--zcg", "off", "--atol", "100", "--format", "json", "--output", str(out)])
    assert code == 1
    doc = json.loads(out.read_text())
    assert doc["ok"] is False and doc["results"][0]["status"] == "pass"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--eps", "0"], "--eps"),
        (["run", "--eps", "nan"], "--eps"),
        (["run", "--shape", "2,-1"], "--shape"),
        (["run", "--shape", "2,x"], "--shape"),
        (["run", "--dtype", "fp8"], "fp8"),
        (["run", "--kernel", "nope"], "unknown kernel"),
        (["run", "--kernel", "torch.nn.LayerNorm"], "(did you mean 'torch.nn:LayerNorm'?)"),
        (["run", "--kernel", "after", "--kernel-arg", "foo=1"], "takes no --kernel-arg foo"),
        (["run", "--kernel", "after", "--generic", "--shape", "4,8"], "takes no --generic"),
        (["run", "--bogus"], "--bogus"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never.json"
    code = main([*args, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert not out.exists()


def test_cuda_without_gpu_is_unsupported_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code = main(["run", "--device", "cuda", "--check", "forward", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3
    assert {r["status"] for r in doc["results"]} == {"unsupported"}
    assert all("no CUDA GPU" in r["message"] for r in doc["results"])


def test_output_file_is_written_whole(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    code = main(["run", "--check", "forward", "--device", "cpu", "--format", "markdown",
                 "--output", str(out)])
    assert code == 0
    text = out.read_text()
    assert text.startswith("#### forward") and text.rstrip().endswith("**")
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary left behind


def test_kernels_lists_bundled_named_and_shapes_with_what_each_needs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    for name in ("before", "after", "fixed-forward", "fixed-dx", "torch", "torch:nn", "liger",
                 "liger:gemma", "liger:none", "liger:module", "liger:megatron"):
        assert f"\n  {name} " in out, f"{name} not listed:\n{out}"
    assert "needs a CUDA GPU and liger-kernel: pip install 'gradcheck-bi[liger]'" in " ".join(
        out.split())  # wrapped at 80 columns
    assert "an nn.Module class" in out and "--kernel-arg name=value" in out
def test_junit_to_a_file_leaves_the_verdict_and_failures_on_stdout(tmp_path: Path) -> None:
    p = cli("run", "--kernel", "tests/kernels/user_rmsnorm.py:DxDoubleWeight", "--check", "dx",
            "--shape", "2,8,64", "--layout", "contiguous", "--format", "junit", "--output",
            str(tmp_path / "r.xml"))
    assert p.returncode == 1, p.stderr
    assert (tmp_path / "r.xml").read_text().startswith("<?xml")
    lines = p.stdout.splitlines()
    assert lines[0].startswith("not as expected: 2 results")
    assert "✗ tests/kernels/user_rmsnorm.py:DxDoubleWeight dx" in lines[1]
    assert lines[-1].startswith("VERDICT: NOT AS EXPECTED")


def test_json_on_stdout_puts_the_verdict_on_stderr() -> None:
    p = cli("run", "--kernel", "after", "--check", "forward", "--shape", "2,16",
            "--format", "json")
    assert p.returncode == 0
    assert json.loads(p.stdout)["ok"] is True
    assert p.stderr.rstrip().splitlines()[-1].startswith("VERDICT: all")


def test_threads_option_pins_the_fd_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from gradcheck_bi.cli.run import set_threads
    from gradcheck_bi.fd import threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        set_threads(None)
        assert (threads.fixed_threads(), torch.get_num_threads()) == (None, 1)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        set_threads(None)
        # Pinned for the workers that measure the points; this process stays on one thread
        # (a forked worker of a process that ran a parallel region would hang: fd.threads).
        assert (threads.fixed_threads(), torch.get_num_threads()) == (2, 1)
        set_threads(1)
        assert (threads.fixed_threads(), torch.get_num_threads()) == (1, 1)
    finally:
        threads.fix_threads(None)
        torch.set_num_threads(before)
