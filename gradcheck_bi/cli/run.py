"""``gradcheck-bi run``: options → sweeps → results → the report and the exit code.

A thin layer: every step is a call into the library (:mod:`gradcheck_bi.cases`,
:mod:`gradcheck_bi.runner`, :mod:`gradcheck_bi.gate`, :mod:`gradcheck_bi.report`). Results go
to stdout (or ``--output``), progress and diagnostics to stderr, so ``--format json | jq``
works.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from gradcheck_bi.cases import CaseError, load_case
from gradcheck_bi.cli.options import (
    Check,
    Control,
    Device,
    DType,
    Expect,
    Format,
    Mode,
    UsageError,
    Zcg,
    check_paths,
    parse_kernel_arg,
    parse_memory,
    parse_shape,
    write_output,
)
from gradcheck_bi.fd import MemoryBudgetError
from gradcheck_bi.gate import baseline as baselines
from gradcheck_bi.gate import exit_code
from gradcheck_bi.kernels import reduction
from gradcheck_bi.kernels.loader import complete_ref
from gradcheck_bi.report import baseline as drift_report
from gradcheck_bi.report.junit import to_junit
from gradcheck_bi.report.render import render_markdown, render_rich, to_json
from gradcheck_bi.report.tables import build_tables, summarize
from gradcheck_bi.runner import check_memory, resolve_kernels, run_sweeps
from gradcheck_bi.sweep import Sweep, not_run, with_overrides
from gradcheck_bi.vocab import Result


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

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "reduction": {"cpu": os.environ.get("GRADCHECK_BI_BACKEND") or "torch",
                      "cuda": os.environ.get("GRADCHECK_BI_BACKEND") or "triton (compiled)"},
    }
    if reduction.triton_available():
        import triton

        env["triton"] = triton.__version__
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


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


def run_command(
    kernel: Annotated[list[str] | None, typer.Option(
        "--kernel", help="Bundled name (before, after, fixed-forward, fixed-dx), named "
        "adapter (torch, liger, ...), PATH.py:ATTR or package.module:ATTR: an autograd "
        "Function, a function f(x, weight, eps) or an nn.Module class. Repeatable. Default: "
        "before and after. `gradcheck-bi kernels` lists them.")] = None,
    device: Annotated[Device | None, typer.Option(help="Default: cpu (+ cuda if present).")] = None,
    dtype: Annotated[DType | None, typer.Option(  # type: ignore[valid-type]
        help="Default: fp64 on cpu, fp32 on cuda.")] = None,
    shape: Annotated[str | None, typer.Option(help="e.g. 2,8,256 (the default).")] = None,
    eps: Annotated[float | None, typer.Option(help="RMSNorm eps (> 0). Default 1e-6.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the random x, g, γ.")] = None,
    check: Annotated[list[Check] | None, typer.Option(  # type: ignore[valid-type]
        help="forward, dx, dw, batch_invariance. Repeatable. Default: all.")] = None,
    weight: Annotated[list[Control] | None, typer.Option(  # type: ignore[valid-type]
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
    strict: Annotated[bool, typer.Option(
        help="Any unsupported result (no GPU, a kernel refusing a device or dtype) exits 1 "
        "instead of 3: for CI jobs that must run everything.")] = False,
    progress: Annotated[bool, typer.Option(help="Show progress on stderr (TTY only).")] = True,
    threads: Annotated[int | None, typer.Option(
        help="torch CPU threads. Default 1 unless OMP_NUM_THREADS is set: the finite "
        "differences run as many cache-sized ops, where thread hand-offs cost more than "
        "they save (measured in docs/benchmarks.md).")] = None,
    kernel_arg: Annotated[list[str] | None, typer.Option(
        "--kernel-arg", help="name=value for a parameter of your kernel the adapter cannot "
        "fill (a module's constructor argument, Liger's casting_mode; zcg=builtin|absent). "
        "Repeatable. `gradcheck-bi kernels` lists what each kernel takes.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> int:
    """Check forward, dx, dw and batch invariance over the γ controls and zcg settings."""
    started = time.perf_counter()
    check_paths(output=output, baseline=baseline, update_baseline=update_baseline, plot=plot)
    set_threads(threads)
    _validate(eps, atol, rtol, directions, fmt, plot, update_baseline, baseline)
    sweeps, recorded = _load(case, baseline, update_baseline)
    extra = dict(parse_kernel_arg(a) for a in kernel_arg or [])
    sweeps = [with_overrides(
        sweep,
        kernels=[complete_ref(k) for k in kernel] if kernel else None,
        targets=_targets(device, dtype),
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
        kernel_args={**sweep.kernel_args, **extra} if extra else None,
    ) for sweep in sweeps]
    _check_memory(sweeps)
    results, notes = _execute(sweeps, progress)
    drifts = baselines.compare(results, recorded) if recorded is not None else []
    code = exit_code(results, drifted=bool(drifts), strict=strict)
    if update_baseline and baseline is not None:
        baselines.write(baseline, baselines.Baseline.from_results(results))
        Console(stderr=True).print(f"recorded baseline {baseline} ({len(results)} results)")
    report = _Report(results, drifts, baseline if recorded is not None else None, code, notes,
                     strict)
    _emit(report, fmt, output, plot, time.perf_counter() - started)
    return code


def _validate(eps: float | None, atol: float | None, rtol: float | None,
              directions: int | None, fmt: Format, plot: str | None, update_baseline: bool,
              baseline: Path | None) -> None:
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        raise UsageError(f"--eps {eps}: must be a finite number > 0")
    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{name} {value}: must be a finite number >= 0")
    if plot is not None and fmt is not Format.markdown:
        raise UsageError("--plot embeds an image in --format markdown only")
    if update_baseline and baseline is None:
        raise UsageError("--update-baseline needs --baseline FILE (where to record the run)")
    if directions is not None and directions < 1:
        raise UsageError(f"--directions {directions}: must be >= 1")


def _load(case: Path | None, baseline: Path | None, update_baseline: bool
          ) -> tuple[list[Sweep], baselines.Baseline | None]:
    """The case's sweeps (or the default one) and the recorded baseline to compare with."""
    try:
        sweeps = load_case(case).sweeps if case is not None else [Sweep()]
        recorded = (baselines.load(baseline)
                    if baseline is not None and not update_baseline else None)
    except (CaseError, baselines.BaselineError) as exc:
        raise UsageError(str(exc)) from None
    return sweeps, recorded


def _check_memory(sweeps: list[Sweep]) -> None:
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


def _execute(sweeps: list[Sweep], progress: bool) -> tuple[list[Result], list[str]]:
    """The results, and one line per kernel and zcg setting that is not run."""
    refs = list(dict.fromkeys(k for sweep in sweeps for k in sweep.kernels))
    specs = resolve_kernels(refs, {k: v for s in sweeps for k, v in s.kernel_args.items()})
    notes = not_run(sweeps, specs)
    bar, on_result = _progress(progress and sys.stderr.isatty())
    if bar is None:
        return run_sweeps(sweeps, specs), notes
    with bar:
        return run_sweeps(sweeps, specs, on_result), notes


class _Report:
    """What a run produced, for the renderers: results, drift, the baseline compared with."""

    def __init__(self, results: list[Result], drifts: list[baselines.Drift],
                 baseline: Path | None, code: int, notes: list[str], strict: bool = False
                 ) -> None:
        self.results, self.drifts, self.baseline, self.code = results, drifts, baseline, code
        self.summary = summarize(results, strict)
        self.notes = notes

    @property
    def compared(self) -> bool:
        return self.baseline is not None

    def rich(self, console: Console) -> None:
        render_rich(build_tables(self.results), self.summary, console, self.notes)
        drift_report.render_rich(self.drifts, self.baseline, self.compared, console)


def _text(report: _Report, fmt: Format, plot: str | None, elapsed: float) -> str:
    """The report in ``fmt`` as text (tables recorded without colour at 160 columns)."""
    results, drifts = report.results, report.drifts
    if fmt is Format.json:
        text = to_json(results, report.code == 0, environment(), {"seconds": round(elapsed, 3)},
                       report.notes)
        return (drift_report.add_to_json(text, drifts, report.baseline) if report.compared
                else text)
    if fmt is Format.markdown:
        text = render_markdown(build_tables(results), report.summary, plot=plot,
                               notes=report.notes)
        return text + (drift_report.render_markdown(drifts, report.baseline)
                       if report.compared else "")
    if fmt is Format.junit:
        return to_junit(results, drifts)
    console = Console(record=True, width=160, no_color=True, file=io.StringIO())
    report.rich(console)
    return console.export_text()


def _emit(report: _Report, fmt: Format, output: Path | None, plot: str | None,
          elapsed: float) -> None:
    if output is None and fmt is Format.table:
        report.rich(Console())
        return
    text = _text(report, fmt, plot, elapsed)
    if output is not None:
        write_output(output, text)
        sys.stderr.write(f"wrote {output} — exit {report.code}\n")
    else:
        sys.stdout.write(text)
    for d in report.drifts:  # the CI log shows drift whatever the report format
        sys.stderr.write(f"gradcheck-bi: {d.line}\n")
