"""``gradcheck-bi plot``: finite-difference error against step size, as a PNG, text or JSON.

The measurement is :mod:`gradcheck_bi.stepsweep`; the drawing :mod:`gradcheck_bi.report.plot`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from gradcheck_bi.cli.emit import log_width
from gradcheck_bi.cli.execute import measuring
from gradcheck_bi.cli.options import (
    OUTPUT,
    PLOT_DTYPES,
    PLOT_FORMATS,
    PLOT_STENCILS,
    WHAT,
    WHERE,
    ZCG,
    UsageError,
    check_paths,
    choices,
    many_of,
    one_of,
    parse_shape,
    write_output,
)
from gradcheck_bi.gate import EXIT_UNEXPECTED, EXIT_UNSUPPORTED
from gradcheck_bi.kernels.calling.trace import is_internal, located
from gradcheck_bi.ops import ALL_CHECKS
from gradcheck_bi.report.plot import PlotDependencyError, render_text, save_png
from gradcheck_bi.runner import resolve_kernels
from gradcheck_bi.stepsweep import STEP_EXPONENTS, plot_op, step_sweep, to_json
from gradcheck_bi.vocab import CONTROLS, DEVICES, Unsupported

DEFAULT_SHAPE = "4,256"
# Every gradient check of any op (dx, dresidual, dz, dw, dbias, …).
GRADIENT_CHECKS = tuple(c for c in ALL_CHECKS if c.startswith("d"))


def _parse_steps(text: str) -> list[float]:
    """``"-30:0"`` → the powers of two ``2^-30 … 2^0``."""
    try:
        lo, hi = (int(p) for p in text.split(":"))
    except ValueError:
        raise UsageError(f"--steps {text!r}: expected LO:HI exponents of two, e.g. -30:0") from None
    if not (-60 <= lo and lo + 4 <= hi <= 4):
        raise UsageError(
            f"--steps {text!r}: need -60 <= LO, LO + 4 <= HI <= 4 (steps are 2^LO … 2^HI)")
    return [2.0**e for e in range(lo, hi + 1)]


def plot_command(
    kernel: Annotated[list[str] | None, typer.Option(
        "--kernel", metavar="KERNEL,…", rich_help_panel=WHAT,
        show_default="before,after", help="The kernels to sweep, as run's --kernel.")] = None,
    op: Annotated[str | None, typer.Option(
        "--op", metavar="OP", rich_help_panel=WHAT, show_default="from the parameter names",
        help="The op the kernels compute, as run's --op.")] = None,
    weight: Annotated[list[str] | None, typer.Option(
        metavar=choices(CONTROLS, many=True), rich_help_panel=WHAT, show_default="randn,ones",
        help="γ controls.")] = None,
    check: Annotated[str, typer.Option(
        "--check", metavar="CHECK", rich_help_panel=WHAT,
        help="The gradient to plot (dx, dw, …): any the kernels' op has (`gradcheck-bi "
        "ops` lists each op's).")] = "dx",
    zcg: Annotated[str, typer.Option(
        metavar=choices(tuple(ZCG)), rich_help_panel=WHAT, help="zero_centered_gamma.")
    ] = "off",
    stencil: Annotated[str, typer.Option(
        metavar=choices(PLOT_STENCILS), rich_help_panel=WHAT,
        help="central-4 is what run uses.")] = "central-4",
    steps: Annotated[str | None, typer.Option(
        metavar="LO:HI", rich_help_panel=WHAT,
        show_default=f"{STEP_EXPONENTS['fp64'][0]}:0 (fp64), {STEP_EXPONENTS['fp32'][0]}:0 "
        "(fp32)", help="Sweep the relative step h/ℓ over 2^LO … 2^HI.")] = None,
    device: Annotated[str, typer.Option(
        metavar=choices(DEVICES), rich_help_panel=WHERE, help="Where the kernel runs.")
    ] = "cpu",
    dtype: Annotated[str, typer.Option(
        metavar=choices(PLOT_DTYPES), rich_help_panel=WHERE,
        help="Finite differences of fp16/bf16 are noise.")] = "fp64",
    shape: Annotated[str, typer.Option(
        metavar="D0,D1,…", rich_help_panel=WHERE, help="Input shape.")] = DEFAULT_SHAPE,
    eps: Annotated[float, typer.Option(rich_help_panel=WHERE, help="The norm's eps (> 0).")
                   ] = 1e-6,
    seed: Annotated[int, typer.Option(
        rich_help_panel=WHERE, help="Seed of the random x, g, γ (as in run).")] = 0,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar=choices(PLOT_FORMATS), rich_help_panel=OUTPUT,
        show_default="png/json by --output's suffix, else terminal",
        help="png needs --output.")] = None,
    output: Annotated[Path | None, typer.Option(
        metavar="FILE.png|FILE.json", rich_help_panel=OUTPUT, show_default="stdout",
        help="Write the PNG or JSON here.")] = None,
    debug: Annotated[bool, typer.Option(
        "--debug", rich_help_panel=OUTPUT, show_default=False, help="Show tracebacks.")
    ] = False,
) -> int:
    """Plot max |analytic dx − FD dx| (or --check's gradient) against the finite-difference
    step, on log-log axes.

    A correct backward traces a V: slope −1 (rounding) at small steps, the stencil's order
    (truncation) at large ones, the bottom near the step `run` uses. A defective backward
    stays on a plateau far above it, whatever the step.
    """
    fmt_name = _format(one_of("--format", fmt, PLOT_FORMATS), output)
    if not (math.isfinite(eps) and eps > 0):
        raise UsageError(f"--eps {eps}: must be a finite number > 0")
    dims = parse_shape(shape)
    step_list = _parse_steps(steps) if steps is not None else None
    if output is not None:
        check_paths(output=output)
    check_name = one_of("--check", check, GRADIENT_CHECKS) or "dx"
    specs = resolve_kernels(many_of("--kernel", kernel) or ["before", "after"],
                            {"op": op} if op is not None else None)
    try:
        plot_op(specs, check_name)
    except ValueError as exc:  # another op's kernel, a gradient the op has not
        raise UsageError(str(exc)) from None
    zcg_values = ZCG[one_of("--zcg", zcg, tuple(ZCG)) or "off"]
    try:
        with measuring():
            sweep = step_sweep(
                specs,
                weights=many_of("--weight", weight, CONTROLS) or ["randn", "ones"],
                zcg=zcg_values, device=one_of("--device", device, DEVICES) or "cpu",
                dtype=one_of("--dtype", dtype, PLOT_DTYPES) or "fp64", shape=dims, eps=eps,
                seed=seed, stencil=one_of("--stencil", stencil, PLOT_STENCILS) or "central-4",
                steps=step_list, check=check_name,
            )
    except Unsupported as exc:
        sys.stderr.write(f"gradcheck-bi: unsupported here: {exc}\n")
        return EXIT_UNSUPPORTED
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # the kernel's crash, not gradcheck-bi's (that one exits 4)
        if is_internal(exc):
            raise
        sys.stderr.write(f"gradcheck-bi: the kernel raised: {located(exc)}\n")
        return EXIT_UNEXPECTED
    if fmt_name == "json":
        text = to_json(sweep)
        if output is None:
            sys.stdout.write(text)
        else:
            write_output(output, text)
            sys.stderr.write(f"wrote {output}\n")
    elif fmt_name == "png":
        assert output is not None
        try:
            save_png(sweep, output)
        except PlotDependencyError as exc:
            raise UsageError(str(exc)) from None
        sys.stderr.write(f"wrote {output}\n")
    else:
        sys.stdout.write(render_text(sweep, columns=log_width()))
    return 0


def _format(fmt: str | None, output: Path | None) -> str:
    if fmt is None:
        if output is None:
            return "terminal"
        return "json" if output.suffix.lower() == ".json" else "png"
    if fmt == "png" and output is None:
        raise UsageError("--format png needs --output FILE.png")
    if fmt == "terminal" and output is not None:
        raise UsageError("--format terminal prints to stdout; drop --output or use --format png")
    return fmt
