"""Step-size sweeps (plot.py) and the `plot` command: the V of a correct backward, the
plateau of a defective one, and a picture a reviewer can read."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from gradcheck_bi import fd
from gradcheck_bi.cli import main
from gradcheck_bi.kernels.registry import resolve
from gradcheck_bi.report.plot import MARKERS, build_figure, render_text
from gradcheck_bi.stepsweep import Curve, StepSweep, step_sweep
from gradcheck_bi.tolerance.noise import unit_roundoff

SHAPE = (4, 64)


@pytest.fixture(scope="module")
def fp64_central4() -> StepSweep:
    return step_sweep([resolve("before"), resolve("after")], weights=["randn", "ones"],
                      dtype="fp64", shape=SHAPE)


@pytest.fixture(scope="module")
def fp64_central2() -> StepSweep:
    return step_sweep([resolve("after")], weights=["randn"], dtype="fp64", shape=SHAPE,
                      stencil="central-2")


def curve(sweep: StepSweep, kernel: str, weight: str) -> Curve:
    return next(c for c in sweep.curves if c.kernel == kernel and c.control == weight)


def decades(a: float, b: float) -> float:
    return abs(math.log10(a / b))


def points(c: Curve) -> str:
    return ", ".join(f"2^{round(math.log2(s))}: {e:.2e}" for s, e in
                     zip(c.step_rel, c.max_abs_err, strict=True))


@pytest.mark.parametrize("weight", ["randn", "ones"])
def test_after_traces_the_v_of_the_central4_stencil(fp64_central4: StepSweep,
                                                    weight: str) -> None:
    c = curve(fp64_central4, "after", weight)
    assert c.rounding is not None and c.truncation is not None, points(c)
    assert c.rounding.points >= 5 and c.truncation.points >= 4, (c.rounding, c.truncation)
    assert abs(c.rounding.slope - (-1)) <= 0.5, f"rounding slope {c.rounding}; {points(c)}"
    assert abs(c.truncation.slope - 4) <= 0.5, f"truncation slope {c.truncation}; {points(c)}"
    # The bottom of the V is where `run` puts its step, near u^(1/5) for a 4th-order stencil.
    assert fp64_central4.run_step_rel == fd.STEP_REL[torch.float64]
    assert decades(c.min_step, fp64_central4.run_step_rel) <= 1, points(c)
    assert decades(c.min_step, unit_roundoff(torch.float64) ** (1 / 5)) <= 1
    assert c.min_err < fp64_central4.reference_floor, points(c)


def test_central2_has_truncation_slope_2_and_its_bottom_near_u_cube_root(
        fp64_central2: StepSweep) -> None:
    c = fp64_central2.curves[0]
    assert c.rounding is not None and c.truncation is not None, points(c)
    assert abs(c.rounding.slope - (-1)) <= 0.5, f"{c.rounding}; {points(c)}"
    assert abs(c.truncation.slope - 2) <= 0.5, f"{c.truncation}; {points(c)}"
    u = fp64_central2.unit_roundoff
    assert decades(c.min_step, u ** (1 / 3)) <= 1, points(c)
    # The central-2 floor is about u^(2/3) at unit scale: the reference line means what it says.
    assert decades(c.min_err, fp64_central2.reference_floor) <= 1, points(c)


def test_before_at_randn_sits_on_a_plateau_far_above_the_floor(
        fp64_central4: StepSweep) -> None:
    c = curve(fp64_central4, "before", "randn")
    finite = [e for e in c.max_abs_err if math.isfinite(e)]
    assert len(finite) == len(c.max_abs_err), points(c)
    assert max(finite) <= 10 * c.plateau and min(finite) >= c.plateau / 10, points(c)
    assert c.rounding is None and c.truncation is None, (c.rounding, c.truncation)
    after = curve(fp64_central4, "after", "randn")
    assert c.plateau > 1e6 * after.min_err, (c.plateau, after.min_err)


def test_blind_control_before_and_after_agree(fp64_central4: StepSweep) -> None:
    b, a = curve(fp64_central4, "before", "ones"), curve(fp64_central4, "after", "ones")
    for s, eb, ea in zip(b.step_rel, b.max_abs_err, a.max_abs_err, strict=True):
        assert eb <= 2 * ea and ea <= 2 * eb, f"γ=ones at h/ℓ=2^{math.log2(s):.0f}: {eb} vs {ea}"


def test_fp32_bottom_is_the_run_step() -> None:
    sw = step_sweep([resolve("after")], weights=["randn"], dtype="fp32", shape=SHAPE)
    c = sw.curves[0]
    assert c.rounding is not None and abs(c.rounding.slope + 1) <= 0.5, points(c)
    assert decades(c.min_step, sw.run_step_rel) <= 1, points(c)


def test_zeros_control_is_exactly_zero_at_every_step() -> None:
    sw = step_sweep([resolve("after")], weights=["zeros"], shape=SHAPE,
                    steps=[2.0**e for e in range(-20, -4, 5)])
    assert sw.curves[0].max_abs_err == [0.0] * 4
    assert "exactly 0" in render_text(sw)


def test_figure_is_labelled(fp64_central4: StepSweep) -> None:
    pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (gradcheck-bi[plot])")
    fig = build_figure(fp64_central4)
    ax = fig.axes[0]
    assert "h/ℓ" in ax.get_xlabel() and "dimensionless" in ax.get_xlabel()
    assert "dx" in ax.get_ylabel() and "units of dL/dx" in ax.get_ylabel()
    for part in ("before", "after", "cpu", "fp64", "4×64", "central-4"):
        assert part in ax.get_title(), (part, ax.get_title())
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 6, labels  # 4 curves, the run step, the u^(2/3) reference
    assert any("step run uses" in t for t in labels) and any("u^(2/3)" in t for t in labels)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_terminal_drawing_marks_the_run_step_and_reference(fp64_central4: StepSweep) -> None:
    text = render_text(fp64_central4, width=62, height=16)
    assert " ".join(text.split("\n\n")[0].split()) == fp64_central4.title  # wrapped
    assert "step run uses: h/ℓ = 2^-11" in text and "u^(2/3) = 2.31e-11" in text
    assert "flat near" in text and "(theory -1 / +4)" in text
    plot_rows = [ln for ln in text.splitlines() if "┤" in ln]
    assert len(plot_rows) == 16 and all(len(ln.split("┤", 1)[1]) == 62 for ln in plot_rows)


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_terminal_drawing_fits_the_terminal(fp64_central4: StepSweep, columns: int) -> None:
    lines = render_text(fp64_central4, columns=columns).splitlines()
    assert max(len(ln) for ln in lines) <= columns, "\n".join(lines)
    plot_rows = [ln for ln in lines if "┤" in ln]
    assert {len(ln.split("┤", 1)[1]) for ln in plot_rows} == {min(72, columns - 9)}
    assert "(not visible: under x, the same points)" in " ".join(" ".join(lines).split())


ARGS = ["plot", "--kernel", "after", "--weight", "randn", "--shape", "2,32", "--steps", "-24:-2"]


def test_terminal_legend_names_only_markers_it_draws(fp64_central4: StepSweep) -> None:
    # before and after agree at γ=ones: the later curve is drawn over every point of the
    # earlier one, so the legend must not promise the earlier marker on the picture.
    text = render_text(fp64_central4, columns=80)
    drawn = "".join(line.split("┤", 1)[1] for line in text.splitlines() if "┤" in line)
    legend: list[str] = []  # an entry and its wrapped continuation lines
    for line in text.splitlines()[text.splitlines().index("", 2) + 1:]:
        if line[:2] == "  " and line[2] in MARKERS and line[3] == " ":
            legend.append(line)
        elif legend and line.startswith(" " * 8):
            legend[-1] += " " + line.strip()
    assert len(legend) == len(fp64_central4.curves), legend
    for line in legend:
        assert line[2] in drawn or "not visible" in line, line
    assert any("not visible" in line for line in legend), "before/after at γ=ones overlap"


def test_cli_json_gives_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tool"] == "gradcheck-bi" and doc["stencil"] == "central-4"
    assert doc["run_step_rel"] == 2.0**-11 and doc["shape"] == [2, 32]
    (c,) = doc["curves"]
    assert len(c["step_rel"]) == len(c["max_abs_err"]) == 23
    assert abs(c["slope_truncation"]["slope"] - 4) <= 0.5
    assert abs(c["slope_rounding"]["slope"] + 1) <= 0.5


def test_cli_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (gradcheck-bi[plot])")
    out = tmp_path / "sweep.png"
    assert main([*ARGS, "--output", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000
    assert f"wrote {out}" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    (["--format", "png"], "--format png needs --output"),
    (["--steps", "0:-3"], "--steps '0:-3'"),
    (["--shape", "4,x"], "--shape"),
    (["--eps", "-1"], "--eps"),
    (["--output", "/no/such/folder/p.png"], "does not exist"),
])
def test_cli_bad_input_is_one_line_and_exit_2(extra: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradcheck-bi: error: ") and message in err, err


def test_cli_without_matplotlib_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main([*ARGS, "--steps", "-8:-2", "--output", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pip install" in err, err
    assert not (tmp_path / "p.png").exists()


def test_cli_cuda_without_gpu_is_unsupported(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main([*ARGS, "--device", "cuda"]) == 3
    assert "no CUDA GPU" in capsys.readouterr().err


def test_run_markdown_embeds_the_plot(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--kernel", "after", "--check", "forward", "--weight", "randn", "--zcg", "off",
            "--device", "cpu", "--dtype", "fp64", "--shape", "2,32", "--format", "markdown",
            "--no-progress"]
    assert main([*args, "--plot", "docs/img/step_sweep.png"]) == 0
    assert "(docs/img/step_sweep.png)" in capsys.readouterr().out
    assert main([*args[:-3], "--no-progress", "--plot", "x.png"]) == 2
    assert "--plot" in capsys.readouterr().err


def test_point_at_the_run_step_is_the_error_run_reports() -> None:
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.vocab import Config

    sw = step_sweep([resolve("after"), resolve("before")], weights=["randn"], shape=(2, 32),
                    steps=[2.0**e for e in range(-13, -8)])
    for c in sw.curves:
        at_run = dict(zip(c.step_rel, c.max_abs_err, strict=True))[sw.run_step_rel]
        # The plot shows the largest error anywhere; run reports it as max_abs_err_any (its
        # max_abs_err is the error at the element nearest its own tolerance).
        m = run_check(resolve(c.kernel).fn, Config(check="dx", shape=(2, 32)))
        measured = m.details["max_abs_err_any"]
        assert at_run == measured, f"{c.kernel}: plot {at_run!r} vs run {measured!r}"


# The other row ops (plot once called RMSNorm's `apply` on every op kernel: 86eb384). One
# correct kernel per op, its other gradient, and a mutant of the family's catalogue whose
# defect shows in that gradient at γ=randn.
ROOT = Path(__file__).resolve().parent.parent
OP_KERNELS = {
    "torch:layer_norm": ("dbias", "tests/mutants/ops/ln03_dx_drops_the_mean_term.py"),
    "tests/kernels/layer_norm.py": ("dw", "tests/mutants/ops/ln03_dx_drops_the_mean_term.py"),
    "tests/kernels/fused_add_rms_norm.py": (
        "dresidual", "tests/mutants/ops/fa04_dx_double_weight.py"),
    "tests/kernels/rms_norm_gated.py": ("dz", "tests/mutants/ops/gn03_dx_double_weight.py"),
}
OP_ARGS = ["plot", "--weight", "randn", "--shape", "2,32", "--steps", "-14:-8"]
RUN_STEP = 2.0**-11  # fp64's, inside -14:-8


def _plotted(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*OP_ARGS, *args, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kernel", list(OP_KERNELS))
def test_op_kernel_plots_a_png(kernel: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (gradcheck-bi[plot])")
    out = tmp_path / "p.png"
    assert main([*OP_ARGS, "--kernel", kernel, "--output", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000


@pytest.mark.parametrize("kernel", list(OP_KERNELS))
def test_op_kernel_dx_is_at_the_floor_and_its_mutant_on_a_plateau(
        kernel: str, capsys: pytest.CaptureFixture[str]) -> None:
    mutant = OP_KERNELS[kernel][1]
    doc = _plotted(capsys, "--kernel", kernel)
    (good,) = doc["curves"]
    assert doc["plot"].startswith("dx ") and doc["op"] == resolve(kernel).op, doc["plot"]
    at_run = dict(zip(good["step_rel"], good["max_abs_err"], strict=True))[RUN_STEP]
    assert at_run < 1e-9 * good["max_abs_dx"], (kernel, good["max_abs_err"])
    (bad,) = _plotted(capsys, "--kernel", mutant)["curves"]
    assert min(bad["max_abs_err"]) > 1e-3 * bad["max_abs_dx"], (mutant, bad["max_abs_err"])


@pytest.mark.parametrize("kernel", list(OP_KERNELS))
def test_op_kernel_other_gradient_is_at_the_floor(
        kernel: str, capsys: pytest.CaptureFixture[str]) -> None:
    check = OP_KERNELS[kernel][0]
    doc = _plotted(capsys, "--kernel", kernel, "--check", check)
    assert doc["plot"] == f"{check} error against relative step h/ℓ"
    (c,) = doc["curves"]
    assert c["min_err"] < 1e-9 * c["max_abs_dx"], (kernel, check, c["max_abs_err"])


def test_op_kernel_in_the_terminal_names_op_and_gradient(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*OP_ARGS, "--kernel", "tests/kernels/rms_norm_gated.py", "--check", "dz"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("dz finite-difference error vs step") and "(rms_norm_gated)" in text
    assert "max |analytic dz − FD dz| (units of dL/dz)" in text
    assert "run's step scale for z" in text


def test_op_point_at_the_run_step_is_the_error_run_reports() -> None:
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.stepsweep import point_config

    spec = resolve("tests/kernels/fused_add_rms_norm.py")
    sw = step_sweep([spec], weights=["randn"], shape=(2, 32), check="dresidual",
                    steps=[2.0**e for e in range(-12, -9)])
    at_run = dict(zip(sw.curves[0].step_rel, sw.curves[0].max_abs_err, strict=True))[RUN_STEP]
    m = run_check(spec.fn, point_config(spec, "dresidual", shape=(2, 32)))
    assert at_run == m.details["max_abs_err_any"], (at_run, m.details["max_abs_err_any"])


@pytest.mark.parametrize(("kernels", "check", "message"), [
    (["torch:layer_norm"], "dz", "layer_norm has no dz: its gradients are dx, dw, dbias"),
    (["after", "torch:layer_norm"], "dx", "after is rms_norm, torch:layer_norm is layer_norm"),
])
def test_a_gradient_the_op_lacks_or_two_ops_is_bad_usage(
        kernels: list[str], check: str, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for k in kernels for a in ("--kernel", k)]
    assert main([*OP_ARGS, *args, "--check", check]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradcheck-bi: error: ") and message in err, err


def test_an_op_kernels_own_crash_is_the_kernels(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "crashing_ln.py"
    path.write_text("def layer_norm(x, weight, bias, eps):\n    return x * wieght + bias\n")
    assert main([*OP_ARGS, "--kernel", f"{path}:layer_norm"]) == 1
    err = capsys.readouterr().err
    assert "the kernel raised: NameError" in err and "crashing_ln.py:2 in layer_norm" in err, err


def test_our_own_attribute_error_is_not_blamed_on_the_kernel(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # What 86eb384 fixed: gradcheck-bi reading an attribute the kernel object does not have.
    source = "def slip(spec, cfg):\n    return spec.fn.apply\n"
    namespace: dict[str, object] = {}
    exec(compile(source, str(ROOT / "gradcheck_bi" / "checks" / "slip.py"), "exec"), namespace)
    monkeypatch.setattr("gradcheck_bi.stepsweep.gradient", namespace["slip"])
    assert main([*OP_ARGS, "--kernel", "torch:layer_norm"]) == 4
    err = capsys.readouterr().err
    assert "internal error" in err and "the kernel raised" not in err, err


def test_a_correct_kernel_is_never_red_and_a_long_title_wraps(fp64_central4: StepSweep) -> None:
    from dataclasses import replace

    from gradcheck_bi.report.plot import DEFECT_COLOUR, kernel_colours
    from gradcheck_bi.stepsweep import Fit

    pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (gradcheck-bi[plot])")
    vee = Fit(4.0, 4.0, 1e-3, 1e-2, 2)
    correct = Curve("dir/sub/correct_norm.py:Correct", "randn", False, [1e-3, 1e-2],
                    [1e-9, 1e-9], 1.0, truncation=vee)
    broken = Curve("dir/sub/broken_norm.py:DxDoubleWeight", "randn", False, [1e-3, 1e-2],
                   [0.7, 0.7], 1.0)
    colours = kernel_colours([correct, broken])  # the correct kernel named first
    assert colours[broken.kernel] == DEFECT_COLOUR != colours[correct.kernel]
    title = build_figure(replace(fp64_central4, curves=[correct, broken])).axes[0].get_title()
    assert "correct_norm.py:Correct" in title and "dir/sub" not in title
    assert max(len(line) for line in title.splitlines()) <= 80, title
