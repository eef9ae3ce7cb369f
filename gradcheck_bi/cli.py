"""The ``gradcheck-bi`` command: parse options, build a sweep, run it, render, exit.

A thin layer: everything it does is a call into the library. Results go to stdout (or
``--output``), progress and diagnostics to stderr, so ``--format json | jq`` works.
Errors are one line on stderr with the contract's exit code; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

try:  # typer >= 0.24 vendors click; older releases (e.g. on GPU images) depend on it
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[no-redef]


from gradcheck_bi._atomic import write_atomically
from gradcheck_bi._options import Check, Device, DType, Weight, Zcg
from gradcheck_bi.cases import CaseError, load_case, run_sweeps
from gradcheck_bi.fd import MemoryBudgetError
from gradcheck_bi.kernels.registry import KernelLoadError
from gradcheck_bi.report import baseline as baselines
from gradcheck_bi.report.junit import to_junit
from gradcheck_bi.report.render import render_markdown, render_rich, to_json
from gradcheck_bi.report.tables import build_tables, summarize
from gradcheck_bi.sweep import Sweep, check_memory, resolve_kernels, with_overrides
from gradcheck_bi.verdict import (
    EXIT_INTERRUPTED,
    EXIT_UNEXPECTED,
    EXIT_USAGE,
    Result,
    exit_code,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Prove a batch-invariant RMSNorm's hand-written backward right or wrong.",
)


@app.callback()
def _root() -> None:
    """Prove a batch-invariant RMSNorm's hand-written backward right or wrong."""


class UsageError(Exception):
    """Bad usage or input: one line on stderr, exit 2."""


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"
    junit = "junit"


class Mode(str, Enum):
    full = "full"
    directional = "directional"


class Expect(str, Enum):
    pass_ = "pass"
    fail = "fail"


def parse_shape(text: str) -> tuple[int, ...]:
    """``"2,8,256"`` → ``(2, 8, 256)``; every dim a positive integer."""
    try:
        dims = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise UsageError(
            f"--shape {text!r}: expected comma-separated integers, e.g. 2,8,256") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"--shape {text!r}: every dimension must be a positive integer")
    return dims


def parse_memory(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1048576"`` → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise UsageError(f"--max-memory {text!r}: expected bytes, e.g. 512M or 2G") from None


def _targets(device: Device | None, dtype: Any) -> list[tuple[str, str]] | None:
    if device is None and dtype is None:
        return None
    dev = device.value if device is not None else "cpu"
    dt = dtype.value if dtype is not None else ("fp64" if dev == "cpu" else "fp32")
    return [(dev, dt)]


def set_threads(threads: int | None) -> None:
    """Pin torch's CPU threads: ``--threads``, else ``OMP_NUM_THREADS``, else 1."""
    import torch

    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: must be >= 1")
    if threads is None and os.environ.get("OMP_NUM_THREADS"):
        return
    torch.set_num_threads(threads or 1)


def environment() -> dict[str, Any]:
    """What ran the checks (stable from run to run on one machine)."""
    import platform

    import torch

    from gradcheck_bi.kernels.reduction import triton_available

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "reduction": {"cpu": os.environ.get("GRADCHECK_BI_BACKEND") or "torch",
                      "cuda": os.environ.get("GRADCHECK_BI_BACKEND") or "triton (compiled)"},
    }
    if triton_available():
        import triton

        env["triton"] = triton.__version__
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def write_output(path: Path, text: str) -> None:
    """Write the report to ``--output`` whole or not at all."""
    folder = path.resolve().parent
    if not folder.is_dir():
        raise UsageError(f"--output {path}: folder {folder} does not exist")
    write_atomically(path, text)


def _progress(enabled: bool) -> tuple[Any, Any]:
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), console=Console(stderr=True), transient=True)
    task = progress.add_task("checking", total=None)

    def on_result(r: Result, done: int, total: int) -> None:
        progress.update(task, completed=done, total=total,
                        description=f"{r.kernel} {r.check} {r.device}/{r.dtype}")

    return progress, on_result


@app.command("run")
def run_command(
    kernel: Annotated[list[str] | None, typer.Option(
        "--kernel", help="Bundled name (before, after, fixed-forward, fixed-dx), PATH.py:ATTR "
        "or package.module:ATTR. Repeatable. Default: before and after.")] = None,
    device: Annotated[Device | None, typer.Option(help="Default: cpu (+ cuda if present).")] = None,
    dtype: Annotated[DType | None, typer.Option(  # type: ignore[valid-type]
        help="Default: fp64 on cpu, fp32 on cuda.")] = None,
    shape: Annotated[str | None, typer.Option(help="e.g. 2,8,256 (the default).")] = None,
    eps: Annotated[float | None, typer.Option(help="RMSNorm eps (> 0). Default 1e-6.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the random x, g, γ.")] = None,
    check: Annotated[list[Check] | None, typer.Option(  # type: ignore[valid-type]
        help="forward, dx, dw, batch_invariance. Repeatable. Default: all.")] = None,
    weight: Annotated[list[Weight] | None, typer.Option(  # type: ignore[valid-type]
        help="γ control: randn, ones, zeros. Repeatable. Default: all.")] = None,
    zcg: Annotated[Zcg | None, typer.Option(help="zero_centered_gamma. Default: both.")] = None,
    atol: Annotated[float | None, typer.Option(
        help="Replace the derived tolerance with this absolute one.")] = None,
    rtol: Annotated[float | None, typer.Option(
        help="Add rtol × max|reference| to the tolerance.")] = None,
    expect: Annotated[Expect | None, typer.Option(
        help="What non-bundled kernels are expected to do everywhere. Default: pass.")] = None,
    max_memory: Annotated[str | None, typer.Option(
        help="Memory budget for the finite-difference checks, e.g. 2G. Default: a quarter "
        "of the memory available at start. A shape that cannot fit is refused (exit 2).")
    ] = None,
    mode: Annotated[Mode | None, typer.Option(
        help="dx check: full (every element, the default) or directional (random "
        "projections per row; individual elements are not checked).")] = None,
    directions: Annotated[int | None, typer.Option(
        help="Random directions per row in --mode directional. Default 8.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Report format.")] = Format.table,
    output: Annotated[Path | None, typer.Option(help="Write the report here (atomically).")
                      ] = None,
    case: Annotated[Path | None, typer.Option(
        help="A TOML sweep (see cases/README.md); the options above override it.")] = None,
    baseline: Annotated[Path | None, typer.Option(
        help="Compare every result with this recorded run; drift exits 1.")] = None,
    update_baseline: Annotated[bool, typer.Option(
        help="Record this run as --baseline FILE (atomically) instead of comparing.")] = False,
    plot: Annotated[str | None, typer.Option(
        help="Markdown only: embed this image (from `gradcheck-bi plot --output`).")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress on stderr (TTY only).")] = True,
    threads: Annotated[int | None, typer.Option(
        help="torch CPU threads. Default 1 unless OMP_NUM_THREADS is set: the finite "
        "differences run as many cache-sized ops, where thread hand-offs cost more than "
        "they save (measured in docs/benchmarks.md).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> int:
    """Check forward, dx, dw and batch invariance over the γ controls and zcg settings."""
    started = time.perf_counter()
    set_threads(threads)
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        raise UsageError(f"--eps {eps}: must be a finite number > 0")
    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{name} {value}: must be a finite number >= 0")
    if plot is not None and fmt is not Format.markdown:
        raise UsageError("--plot embeds an image in --format markdown only")
    if update_baseline and baseline is None:
        raise UsageError("--update-baseline needs --baseline FILE (where to record the run)")
    try:
        sweeps = load_case(case).sweeps if case is not None else [Sweep()]
        recorded = (baselines.load(baseline)
                    if baseline is not None and not update_baseline else None)
    except (CaseError, baselines.BaselineError) as exc:
        raise UsageError(str(exc)) from None
    targets = _targets(device, dtype)
    sweeps = [with_overrides(
        sweep,
        kernels=list(kernel) if kernel else None,
        targets=targets,
        shapes=[parse_shape(shape)] if shape is not None else None,
        eps=[eps] if eps is not None else None,
        seeds=[seed] if seed is not None else None,
        checks=[c.value for c in check] if check else None,
        weights=[w.value for w in weight] if weight else None,
        zcg=zcg.settings if zcg else None,
        atol=atol,
        rtol=rtol,
        expect=expect.value if expect else None,
        max_memory=parse_memory(max_memory) if max_memory else None,
        expectations=[] if expect else None,  # --expect outranks a case's rules
        mode=mode.value if mode else None,
        directions=directions,
    ) for sweep in sweeps]
    if directions is not None and directions < 1:
        raise UsageError(f"--directions {directions}: must be >= 1")
    for sweep in sweeps:
        try:
            check_memory(sweep)
        except MemoryBudgetError as exc:
            raise UsageError(str(exc)) from None
    if any(sweep.mode == "directional" for sweep in sweeps):
        Console(stderr=True, highlight=False).print(
            "note: --mode directional checks dx only along random directions "
            f"({', '.join(sorted({str(sw.directions) for sw in sweeps}))} per row); "
            "individual dx elements are not checked. dw is checked in full.", markup=False)
    refs = list(dict.fromkeys(k for sweep in sweeps for k in sweep.kernels))
    specs = resolve_kernels(refs)
    bar, on_result = _progress(progress and sys.stderr.isatty())
    if bar is not None:
        with bar:
            results = run_sweeps(sweeps, specs, on_result)
    else:
        results = run_sweeps(sweeps, specs)
    code = exit_code(results)
    drifts = baselines.compare(results, recorded) if recorded is not None else []
    if drifts:
        code = EXIT_UNEXPECTED
    if update_baseline and baseline is not None:
        baselines.write(baseline, baselines.Baseline.from_results(results))
        Console(stderr=True).print(f"recorded baseline {baseline} ({len(results)} results)")
    summary = summarize(results)
    elapsed = time.perf_counter() - started
    if fmt is Format.json:
        text = to_json(results, code == 0, environment(), {"seconds": round(elapsed, 3)})
        text = baselines.add_to_json(text, drifts, baseline) if recorded is not None else text
    elif fmt is Format.markdown:
        text = render_markdown(build_tables(results), summary, plot=plot)
        text += baselines.render_markdown(drifts, baseline) if recorded is not None else ""
    elif fmt is Format.junit:
        text = to_junit(results, drifts)
    else:
        text = ""
    if output is not None:
        if fmt is Format.table:
            console = Console(record=True, width=160, no_color=True, file=io.StringIO())
            render_rich(build_tables(results), summary, console)
            baselines.render_rich(drifts, baseline, recorded is not None, console)
            text = console.export_text()
        write_output(output, text)
        sys.stderr.write(f"wrote {output} — exit {code}\n")
    elif fmt is Format.table:
        render_rich(build_tables(results), summary, Console())
        baselines.render_rich(drifts, baseline, recorded is not None, Console())
    else:
        sys.stdout.write(text)
    if fmt is not Format.table or output is not None:
        for d in drifts:  # the CI log shows drift whatever the report format
            sys.stderr.write(f"gradcheck-bi: {d.line}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the Typer app and map every failure to one line and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args

    def err_line(text: str) -> None:  # one line, never wrapped to the terminal width
        sys.stderr.write(" ".join(text.split()) + "\n")

    try:
        rv = app(args=args, prog_name="gradcheck-bi", standalone_mode=False)
    except ClickUsageError as exc:
        err_line(f"gradcheck-bi: error: {exc.format_message()}")
        return EXIT_USAGE
    except (UsageError, KernelLoadError) as exc:
        if debug:
            raise
        err_line(f"gradcheck-bi: error: {exc}")
        return EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        err_line("gradcheck-bi: interrupted; partial results discarded")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        err_line(f"gradcheck-bi: error: {type(exc).__name__}: {exc}")
        return EXIT_USAGE
    if rv == EXIT_INTERRUPTED:
        # Typer >= 0.2x turns Ctrl-C inside a command into a silent Exit(130) that returns
        # here (older releases raise Abort, handled above); no command returns 130 itself.
        err_line("gradcheck-bi: interrupted; partial results discarded")
    return rv if isinstance(rv, int) else 0


from gradcheck_bi.cli_plot import plot_command  # noqa: E402  (it imports nothing from here)

app.command("plot")(plot_command)
