"""A step sweep → a PNG (matplotlib, imported when called) or a plain-text picture.

>>> from gradcheck_bi.kernels import resolve
>>> from gradcheck_bi.stepsweep import step_sweep
>>> sw = step_sweep([resolve("after")], weights=["randn"], shape=(2, 16),
...                 steps=[2.0**e for e in range(-20, -1)])
>>> "after γ=randn" in render_text(sw)
True
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from typing import Any

from gradcheck_bi._atomic import save_atomically
from gradcheck_bi.report.tables import short_name
from gradcheck_bi.stepsweep import Curve, StepSweep


class PlotDependencyError(ImportError):
    """A drawing backend (matplotlib) is not installed."""


def x_label(sweep: StepSweep) -> str:
    return f"relative step h/ℓ  (ℓ = {sweep.scale}; dimensionless)"


def y_label(sweep: StepSweep) -> str:
    c = sweep.check
    return f"max |analytic {c} − FD {c}|  (units of dL/{c})"


MARKERS = "o*+x#@%&"
AXIS_W = 9  # the y tick labels and the axis line left of the plot
LINE_STYLES = ("-", "--", "-.", ":")
# Red is kept for a kernel whose curve shows a defect (a flat curve: no V); the others take
# the rest in order, so a correct kernel is never drawn red, whatever order it was named in.
DEFECT_COLOUR = "tab:red"
COLOURS = ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")


def shows_defect(curve: Curve) -> bool:
    """A curve with no V (neither a rounding nor a truncation slope), not exactly 0: the
    analytic gradient is not the derivative of the forward at any step."""
    return (curve.rounding is None and curve.truncation is None
            and any(e != 0 for e in curve.max_abs_err))


def kernel_colours(curves: Sequence[Curve]) -> dict[str, str]:
    """Each kernel's colour: red where one of its curves shows a defect, else the next of
    :data:`COLOURS`.

    >>> from gradcheck_bi.stepsweep import Fit
    >>> flat = Curve("before", "randn", False, [1e-3, 1e-2], [1.0, 1.0], 1.0)
    >>> vee = Curve("after", "randn", False, [1e-3, 1e-2], [1e-9, 1e-9], 1.0,
    ...             truncation=Fit(4.0, 4.0, 1e-3, 1e-2, 2))
    >>> kernel_colours([vee, flat])
    {'after': 'tab:blue', 'before': 'tab:red'}
    """
    out: dict[str, str] = {}
    kernels = list(dict.fromkeys(c.kernel for c in curves))
    defective = {c.kernel for c in curves if shows_defect(c)}
    others = iter(COLOURS * len(kernels))
    for kernel in kernels:
        out[kernel] = DEFECT_COLOUR if kernel in defective else next(others)
    return out


def _log_span(values: Sequence[float]) -> tuple[int, int]:
    logs = [math.log10(v) for v in values if math.isfinite(v) and v > 0]
    return math.floor(min(logs)), math.ceil(max(logs))


def render_text(sweep: StepSweep, width: int = 72, height: int = 20,
                columns: int | None = None) -> str:
    """The plot in plain characters: one marker per curve, ``|`` at the run step, ``-`` at
    ``u^(2/3)``. Log-log axes: a column per octave of step or less, a row per fraction of a
    decade of error. ``width`` columns of plot; with ``columns`` (a terminal's width) no
    line is wider: the plot narrows and the title and legend wrap."""
    total = width + AXIS_W if columns is None else columns
    width = min(width, total - AXIS_W)
    steps = sorted({s for c in sweep.curves for s in c.step_rel})
    errs = [e for c in sweep.curves for e in c.max_abs_err] + [sweep.reference_floor]
    y_lo, y_hi = _log_span(errs)
    y_hi = max(y_hi, y_lo + 1)
    x_lo, x_hi = math.log2(steps[0]), math.log2(steps[-1])
    x_hi = max(x_hi, x_lo + 1)
    grid = [[" "] * width for _ in range(height)]

    def col(step: float) -> int:
        return round((math.log2(step) - x_lo) / (x_hi - x_lo) * (width - 1))

    def row(err: float) -> int:
        frac = (math.log10(err) - y_lo) / (y_hi - y_lo)
        return height - 1 - round(min(max(frac, 0.0), 1.0) * (height - 1))

    floor_row = row(sweep.reference_floor)
    for c in range(width):
        grid[floor_row][c] = "-"
    if steps[0] <= sweep.run_step_rel <= steps[-1]:
        run_col = col(sweep.run_step_rel)
        for r in range(height):
            grid[r][run_col] = "|"
    cells: list[set[tuple[int, int]]] = []  # where each curve has a point
    for k, curve in enumerate(sweep.curves):
        mark = MARKERS[k % len(MARKERS)]
        mine = set()
        for s, e in zip(curve.step_rel, curve.max_abs_err, strict=True):
            if math.isfinite(e) and e > 0:
                grid[row(e)][col(s)] = mark
                mine.add((row(e), col(s)))
        cells.append(mine)

    lines = [*textwrap.wrap(sweep.title, total, subsequent_indent="  "), ""]
    label_w = AXIS_W - 2
    ticks_y: dict[int, str] = {}
    for d in range(y_hi, y_lo - 1, -1):
        ticks_y.setdefault(row(10.0**d), f"1e{d:+03d}")
    for r in range(height):
        lines.append(f"{ticks_y.get(r, ''):>{label_w}} ┤" + "".join(grid[r]))
    lines.append(" " * label_w + " └" + "─" * width)
    ticks = [" "] * (width + 8)
    first = math.ceil(x_lo / 5) * 5
    for e in range(first, math.floor(x_hi) + 1, 5):
        text = f"2^{e}"
        c0 = min(col(2.0**e), width - len(text))
        ticks[c0:c0 + len(text)] = list(text)
    lines.append(" " * (label_w + 2) + "".join(ticks).rstrip())
    for axis, label in (("x", x_label(sweep)), ("y", y_label(sweep))):
        lines += textwrap.wrap(f"{axis}: {label}", total, initial_indent=" " * (label_w + 2),
                               subsequent_indent=" " * (label_w + 5))
    lines.append("")
    for k, curve in enumerate(sweep.curves):
        entry = f"{curve.label:<30} {_summary(curve)}{_hidden_note(k, cells, grid)}"
        lines += textwrap.wrap(entry, total, initial_indent=f"  {MARKERS[k % len(MARKERS)]}  ",
                               subsequent_indent=" " * 36)
    lines.append(f"  |  step run uses: h/ℓ = 2^{round(math.log2(sweep.run_step_rel))}")
    lines.append(f"  -  u^(2/3) = {sweep.reference_floor:.2e} ({sweep.dtype} reference floor)")
    return "\n".join(lines) + "\n"


def _hidden_note(k: int, cells: list[set[tuple[int, int]]], grid: list[list[str]]) -> str:
    """Say so when a curve's marker shows nowhere: a later curve was drawn over every point
    (``before`` and ``after`` agree at γ=ones), or it has no positive error to draw."""
    mark = MARKERS[k % len(MARKERS)]
    if not cells[k]:
        return "  (not drawn: no error above 0)"
    if any(grid[r][c] == mark for r, c in cells[k]):
        return ""
    over = sorted({grid[r][c] for r, c in cells[k]})
    return f"  (not visible: under {' '.join(over)}, the same points)"


def _summary(curve: Curve) -> str:
    if all(e == 0 for e in curve.max_abs_err):
        return "exactly 0 at every step"
    if curve.rounding is None and curve.truncation is None:
        return f"flat near {curve.plateau:.2e} (no V)"
    parts = [f"min {curve.min_err:.2e} at 2^{round(math.log2(curve.min_step))}"]
    fits = [f for f in (curve.rounding, curve.truncation) if f is not None]
    if fits:
        parts.append("slopes " + " / ".join(f"{f.slope:+.2f}" for f in fits) + " (theory "
                     + " / ".join(f"{f.theory:+.0f}" for f in fits) + ")")
    return " · ".join(parts)


def build_figure(sweep: StepSweep, dpi: int = 110) -> Any:
    """The sweep as a matplotlib ``Figure``: log-log, one line per kernel × control, the run
    step and the ``u^(2/3)`` reference marked, the legend below the axes."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotDependencyError(
            "drawing a PNG needs matplotlib: pip install 'gradcheck-bi[plot]'") from None

    # A bare Figure (no pyplot): no global backend or figure registry is touched.
    fig = Figure(figsize=(8.0, 6.0), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    kernels = list(dict.fromkeys(c.kernel for c in sweep.curves))
    controls = list(dict.fromkeys(c.controls for c in sweep.curves))
    colours = kernel_colours(sweep.curves)
    for curve in sweep.curves:
        k = kernels.index(curve.kernel)
        # Colour per kernel, line style per control; earlier kernels wider and paler, so a
        # curve hidden under another (before and after agree at γ=ones) still shows.
        width = 1.2 + 2.2 * (len(kernels) - 1 - k)
        ax.loglog(curve.step_rel, curve.max_abs_err, color=colours[curve.kernel],
                  linestyle=LINE_STYLES[controls.index(curve.controls) % len(LINE_STYLES)],
                  linewidth=width, alpha=1.0 if width < 2 else 0.45,
                  marker="o", markersize=2 + width, label=f"{curve.label}: {_summary(curve)}")
    ax.axvline(sweep.run_step_rel, color="0.3", linestyle=":", linewidth=1.2,
               label=f"step run uses (h/ℓ = 2^{round(math.log2(sweep.run_step_rel))})")
    ax.axhline(sweep.reference_floor, color="0.5", linestyle="-.", linewidth=1.0,
               label=f"u^(2/3) = {sweep.reference_floor:.1e} ({sweep.dtype})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(x_label(sweep))
    ax.set_ylabel(y_label(sweep))
    shape = "×".join(str(d) for d in sweep.shape)
    # Wrapped to the figure's width: two kernel paths would run past its edges.
    head = (f"{sweep.check} finite-difference error vs step — "
            f"{', '.join(short_name(k) for k in kernels)}{sweep.op_note}")
    ax.set_title("\n".join([*textwrap.wrap(head, 80),
                            f"{sweep.device} · {sweep.dtype} · shape {shape} · "
                            f"{sweep.stencil.name} stencil · eps {sweep.eps:g} · seed "
                            f"{sweep.seed}"]), fontsize=9)
    ax.grid(True, which="major", linewidth=0.4, alpha=0.6)
    fig.legend(fontsize=7.5, loc="outside lower center", ncols=1, frameon=False)
    return fig


def save_png(sweep: StepSweep, path: str | os.PathLike[str], dpi: int = 110) -> None:
    """Draw the sweep with matplotlib and write a PNG to ``path`` (atomically)."""
    fig = build_figure(sweep, dpi)
    save_atomically(path, lambda tmp: fig.savefig(tmp, format="png", metadata={"Software": None}))
