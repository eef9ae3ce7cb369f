"""``gradcheck-bi plot``: finite-difference error against step size, as a PNG, text or JSON.

The measurement is :mod:`gradcheck_bi.stepsweep`; the drawing :mod:`gradcheck_bi.report.plot`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from gradcheck_bi.cli.options import (
    Control,
    Device,
    PlotDType,
    PlotFormat,
    PlotStencil,
    UsageError,
    Zcg,
    check_paths,
    parse_shape,
    write_output,
)
from gradcheck_bi.gate import EXIT_UNSUPPORTED
from gradcheck_bi.report.plot import PlotDependencyError, render_text, save_png
from gradcheck_bi.runner import resolve_kernels
from gradcheck_bi.stepsweep import STEP_EXPONENTS, step_sweep, to_json
from gradcheck_bi.vocab import Unsupported

DEFAULT_SHAPE = "4,256"


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
        "--kernel", help="Bundled name, PATH.py:ATTR or package.module:ATTR. Repeatable. "
        "Default: before and after.")] = None,
    weight: Annotated[list[Control] | None, typer.Option(  # type: ignore[valid-type]
        help="γ control: randn, ones, zeros. Repeatable. Default: randn and ones.")] = None,
    zcg: Annotated[Zcg, typer.Option(help="zero_centered_gamma: off, on or both.")
                   ] = Zcg.off,
    device: Annotated[Device, typer.Option(help="cpu or cuda.")] = Device.cpu,
    dtype: Annotated[PlotDType, typer.Option(
        help="fp64 or fp32 (finite differences of fp16/bf16 are noise).")] = PlotDType.fp64,
    shape: Annotated[str, typer.Option(help="e.g. 4,256 (the default) or 2,8,256.")
                     ] = DEFAULT_SHAPE,
    eps: Annotated[float, typer.Option(help="RMSNorm eps (> 0).")] = 1e-6,
    seed: Annotated[int, typer.Option(help="Seed of the random x, g, γ (as in run).")] = 0,
    stencil: Annotated[PlotStencil, typer.Option(
        help="central-4 (what run uses) or central-2.")] = PlotStencil.central4,
    steps: Annotated[str | None, typer.Option(
        help="LO:HI — sweep the relative step h/ℓ over 2^LO … 2^HI. "
        f"Default {STEP_EXPONENTS['fp64'][0]}:0 for fp64, "
        f"{STEP_EXPONENTS['fp32'][0]}:0 for fp32.")] = None,
    fmt: Annotated[PlotFormat | None, typer.Option(
        "--format", help="png (needs --output), terminal or json. Default: png with "
        "--output FILE.png, json with --output FILE.json, else terminal.")] = None,
    output: Annotated[Path | None, typer.Option(help="Write the PNG or JSON here.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> int:
    """Plot max |analytic dx − FD dx| against the finite-difference step, on log-log axes.

    A correct backward traces a V: slope −1 (rounding) at small steps, the stencil's order
    (truncation) at large ones, the bottom near the step `run` uses. A defective backward
    stays on a plateau far above it, whatever the step.
    """
    fmt_name = _format(fmt.value if fmt is not None else None, output)
    if not (math.isfinite(eps) and eps > 0):
        raise UsageError(f"--eps {eps}: must be a finite number > 0")
    dims = parse_shape(shape)
    step_list = _parse_steps(steps) if steps is not None else None
    if output is not None:
        check_paths(output=output)
    specs = resolve_kernels(list(kernel) if kernel else ["before", "after"])
    zcg_values = zcg.settings
    try:
        sweep = step_sweep(
            specs,
            weights=[w.value for w in weight] if weight else ["randn", "ones"],
            zcg=zcg_values, device=device.value, dtype=dtype.value, shape=dims, eps=eps,
            seed=seed, stencil=stencil.value, steps=step_list,
        )
    except Unsupported as exc:
        sys.stderr.write(f"gradcheck-bi: unsupported here: {exc}\n")
        return EXIT_UNSUPPORTED
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
        sys.stdout.write(render_text(sweep))
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
