"""No op is guessed: a kernel no op here computes is refused in one line (exit 2), naming its
signature, the nearest op where one ran, and what to do — never checked against an op read
from its parameter names (a run of errors or failures).

The kernels are plain-torch stand-ins with the exact ``forward`` signatures of Liger-Kernel
0.8.5's and fla-core 0.6.0's autograd Functions (tests/kernels/refusals.py), which a run on
an H200 read as rms_norm or layer_norm from their parameter names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_bi import cli

KERNELS = Path(__file__).parent / "kernels" / "refusals.py"
SMALL = ["--shape", "2,3,16", "--device", "cpu", "--dtype", "fp64", "--no-progress",
         "--layout", "contiguous"]
TAIL = ("`gradcheck-bi ops`), say which with --op NAME, else check it with --generic --shape … "
        "per input (gradcheck_bi.check(fn, inputs=(…)) from Python), which checks its backward "
        "against its own forward")


def _refused(capsys: pytest.CaptureFixture[str], attr: str, *more: str,
             kernels: Path = KERNELS) -> str:
    code = cli.main(["run", "--kernel", f"{kernels}:{attr}", *SMALL, *more])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1, (code, err)
    assert "x, weight, eps" not in lines[0], lines[0]  # no norm's parameters asked for
    where = f"{kernels.name}:"
    assert lines[0].startswith("gradcheck-bi: error: kernel ") and where in lines[0]
    return lines[0].split(where, 1)[1]  # from the kernel's name on


@pytest.mark.parametrize(("attr", "signature", "unfilled"), [
    ("PowGLUFunction", "(x, y, power)", "'y', 'power'"),
    ("SwiGLULinearFunction", "(x, y, weight, bias)", "'y'"),
    ("SigmoidGLULinearFunction", "(x, y, weight, bias)", "'y'"),
    ("LigerDyTFunction", "(x, alpha, gamma, beta)", "'alpha'"),
    ("LigerFusedCETVDFunction", "(student_logits, teacher_logits, target, ignore_index)",
     "'teacher_logits', 'target'"),
    ("LigerLlama4RopeFunction", "(q, k, freqs_cis, BLOCK_SIZE)", "'k', 'freqs_cis'"),
    ("LigerMHCPostResFunction", "(x, f_out, h_post, h_res)", "'f_out', 'h_post', 'h_res'"),
    ("LigerRopeFunction", "(q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)",
     "'k', 'cos', 'sin'"),
    ("LigerFusedMoEFunction", "(x, gate_up_proj, down_proj, top_k_index, top_k_weights)",
     "'gate_up_proj', 'down_proj', 'top_k_index', 'top_k_weights'"),
])
def test_parameters_no_op_takes_are_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], attr: str, signature: str, unfilled: str) -> None:
    """Required parameters no role of any op fills: no op here takes the kernel. Those of
    three or four are read in Megatron's order first (RMSNorm's convention), and refused
    when the output then matches no RMSNorm — or the call raises, being handed floats."""
    line = _refused(capsys, attr)
    assert line.startswith(f"{attr}{signature}: no op here takes this "
                           f"signature (no role of a norm fills {unfilled}, and it is read "
                           "as no other op here"), line
    assert "if it is one of the tool's ops (rms_norm, " in line and line.endswith(TAIL), line


@pytest.mark.parametrize(("attr", "signature"), [
    ("SigmoidFunction", "(x)"),
    ("LigerSoftmaxFunction", "(input_)"),
])
def test_one_input_matching_no_op_is_refused_naming_the_nearest(
        capsys: pytest.CaptureFixture[str], attr: str, signature: str) -> None:
    """One input, an output no op's: the nearest of the norms and of the other ops, not a
    request for a weight and eps."""
    line = _refused(capsys, attr)
    assert line.startswith(f"{attr}{signature}: its output at a small random "
                           "point matches no op here (nearest: rms_norm without weight (max "
                           "relative error "), line
    assert line.endswith(TAIL), line


def test_a_forward_raising_where_only_a_bias_marks_a_norm_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """PolyNorm's (X, W, B, eps, in_place) asserts a W of shape (3,): a bias marks any norm
    with one, so its op is a guess; the line names what it raised. --op still checks it."""
    line = _refused(capsys, "LigerPolyNormFunction")
    assert line.startswith(
        "LigerPolyNormFunction(X, W, B, eps, in_place): its forward raised "
        "AssertionError: Weight tensor must have shape (3,) at a small random point"), line
    assert "fix it or say which with --op NAME, else check it with --generic" in line, line
    code = cli.main(["run", "--kernel", f"{KERNELS}:LigerPolyNormFunction", *SMALL,
                     "--op", "layer_norm", "--check", "forward"])
    capsys.readouterr()
    assert code == 1


@pytest.mark.parametrize(("attr", "signature"), [
    ("LayerNormGatedFunction", "(x, g, weight, bias, activation, residual, eps, prenorm, "
                               "residual_in_fp32, is_rms_norm)"),
    ("LayerNormFn", "(x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm)"),
])
def test_a_gated_layer_norm_is_refused_naming_the_flag_that_makes_it_rms(
        capsys: pytest.CaptureFixture[str], attr: str, signature: str) -> None:
    """fla's gated norms subtract the mean unless is_rms_norm=True: a gated layer norm is no
    op here, so it is refused, naming the value under which it is the gated RMSNorm — and
    with that value bound it is recognised as that and every result passes."""
    line = _refused(capsys, attr)
    assert line.startswith(
        f"{attr}{signature}: its output at a small random point matches no op "
        "here at its defaults (closest: rms_norm_gated with a bias, max relative error "), line
    assert ("with is_rms_norm=True it matches rms_norm_gated with a bias: check that with "
            "--kernel-arg is_rms_norm=True; else check it with --generic") in line, line
    code = cli.main(["run", "--kernel", f"{KERNELS}:{attr}", *SMALL, "--kernel-arg",
                     "is_rms_norm=True", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"op": "rms_norm_gated"' in out


def test_unnamed_parameters_in_megatron_order_are_still_an_rmsnorm() -> None:
    """f(a, b, c) computing RMSNorm in Megatron's order: its output says so."""
    import torch

    from gradcheck_bi.kernels import adapt

    def norm(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
        return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + c) * b

    spec = adapt(norm, "norm", "api")
    assert spec.recognised.startswith("recognised rms_norm from its output, its parameters "
                                      "(a, b, c) read in Megatron's order"), spec.recognised


NOT_NORMS = Path(__file__).parent / "kernels" / "not_norms.py"


@pytest.mark.parametrize(("attr", "nearest", "how"), [
    ("NoNorm", "rms_norm with a bias", "x × 4 moves its output by "),
    ("InputScaledRMSNorm", "rms_norm", "its output is not affine in the weight"),
])
def test_a_norm_by_name_or_parameters_that_computes_none_is_refused(
        capsys: pytest.CaptureFixture[str], attr: str, nearest: str, how: str) -> None:
    """x·w + b (MobileBERT's NoNorm: a weight and a bias mark a norm with a bias) and
    rms_norm(x·(1 + w)) (named RMSNorm): their output matches no op and moves unlike every
    op's — none of them with a defect — so they are refused in one line, exit 2; --op still
    holds one to an op, whose forward then fails."""
    line = _refused(capsys, attr, kernels=NOT_NORMS)
    assert line.startswith(f"{attr}(hidden_states): its output at a small random point "
                           f"matches no op here (nearest: {nearest} (max relative error "), line
    assert f"and it is none of them with a defect: {how}" in line, line
    assert line.endswith(TAIL), line
    code = cli.main(["run", "--kernel", f"{NOT_NORMS}:{attr}", *SMALL, "--op", "rms_norm",
                     "--check", "forward"])
    capsys.readouterr()
    assert code == 1


def test_a_defect_that_keeps_a_norms_shape_is_checked_not_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """An RMSNorm dividing x²'s sum by D − 1 matches no op either, but moves as a norm does
    (unchanged as x scales, affine in the weight): checked as the op its name says, its
    forward fails saying what it matches."""
    code = cli.main(["run", "--kernel", f"{NOT_NORMS}:BesselRMSNorm", *SMALL, "--check",
                     "forward", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "recognised rms_norm from its name (BesselRMSNorm)" in err, err
    assert '"status": "fail"' in out, out
    assert "matches no known op (closest: rms_norm, max relative error" in out, out


@pytest.mark.parametrize("isolate", ["1", "0"])
def test_what_a_refused_kernel_warns_while_probed_is_not_shown(isolate: str) -> None:
    """``math.sqrt`` handed a tensor that requires grad: torch warns, then it raises. The
    probes' inputs are the tool's: one line, in a worker or here (a fresh process, as the
    recognition child writes to the process's own stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "gradcheck_bi", "run", "--kernel", "math:sqrt", *SMALL],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "GRADCHECK_BI_ISOLATE": isolate})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("gradcheck-bi: error: kernel math:sqrt(x): its forward raised")
