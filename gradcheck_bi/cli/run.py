"""``gradcheck-bi run``: options → sweeps → results → the report and the exit code.

A thin layer: every step is a call into the library (:mod:`gradcheck_bi.cases`,
:mod:`gradcheck_bi.runner`, :mod:`gradcheck_bi.gate`, :mod:`gradcheck_bi.report`). Results go
to stdout (or ``--output``), progress and diagnostics to stderr, so ``--format json | jq``
works.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from gradcheck_bi.cases import CaseError, load_case
from gradcheck_bi.cli.early import as_program
from gradcheck_bi.cli.emit import Report, emit
from gradcheck_bi.cli.execute import environment, execute, print_tracebacks
from gradcheck_bi.cli.options import (
    EXPECTS,
    FORMATS,
    JUDGE,
    OUTPUT,
    WHAT,
    WHERE,
    ZCG,
    UsageError,
    check_paths,
    choices,
    many_of,
    one_of,
    parse_kernel_arg,
    read,
)
from gradcheck_bi.fd import MemoryBudgetError
from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.gate import baseline as baselines
from gradcheck_bi.gate import exit_code
from gradcheck_bi.generic import load_spec as _generic  # noqa: F401  (run --generic)
from gradcheck_bi.generic import own_checks
from gradcheck_bi.kernels.adapting.loader import complete_ref
from gradcheck_bi.kernels.calling.writes import MUTABLE
from gradcheck_bi.ops import OPS
from gradcheck_bi.point import AXES, AXIS, BadValue, nonnegative
from gradcheck_bi.shard import ShardError, parse_shard
from gradcheck_bi.sweep import CASE_TIMEOUT_S, Sweep, with_overrides


def _targets(device: str | None, dtype: str | None) -> list[tuple[str, str]] | None:
    if device is None and dtype is None:
        return None
    dev = device if device is not None else "cpu"
    dt = dtype if dtype is not None else ("fp64" if dev == "cpu" else "fp32")
    return [(dev, dt)]


def set_threads(threads: int | None) -> None:
    """``--threads N``: the library's policy (:func:`gradcheck_bi.fd.threads.apply_policy`)."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: must be >= 1")
    # Before any torch op; as the program, forked workers may then use every thread.
    fd_threads.start_serial(fresh=as_program())
    fd_threads.pin_policy(threads)  # applied where the points are measured


def run_command(
    kernel: Annotated[list[str] | None, typer.Option(
        "--kernel", metavar="KERNEL,…", rich_help_panel=WHAT,
        show_default="before,after",
        help="A bundled name (before, after, fixed-forward, fixed-dx), a named adapter (torch, "
        "liger, …), PATH.py (its one Function), PATH.py:ATTR or package.module:ATTR: an "
        "autograd Function, a function or an nn.Module class of any op `gradcheck-bi ops` lists "
        "(what it computes is found from its parameters and one forward). `gradcheck-bi kernels` "
        "lists them.")] = None,
    kernel_arg: Annotated[list[str] | None, typer.Option(
        "--kernel-arg", metavar="NAME=VALUE", rich_help_panel=WHAT, show_default="none",
        help="A parameter of your kernel the adapter cannot fill (a module's constructor "
        "argument, Liger's casting_mode; zcg=builtin|absent). Repeatable.")] = None,
    op: Annotated[str | None, typer.Option(
        "--op", metavar="OP", rich_help_panel=WHAT, show_default="from the parameter names",
        help=f"The op your kernels compute: {', '.join(OPS)} (`gradcheck-bi ops`).")] = None,
    generic: Annotated[bool, typer.Option(
        "--generic", rich_help_panel=WHAT, show_default=False,
        help="A kernel that computes no op here: each floating input's gradient against "
        "central differences of its own forward, its dependency pattern measured; one "
        "--shape per tensor argument, in order (random fp64 inputs).")] = False,
    allow_mutation: Annotated[list[str] | None, typer.Option(
        "--allow-mutation", metavar="TENSOR,…", rich_help_panel=WHAT, show_default="none",
        help="Tensors your kernel writes into by design (x, weight, grad_output): a note, "
        "not a failure.")] = None,
    timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", rich_help_panel=WHAT,
        show_default=f"{CASE_TIMEOUT_S:g} with --case, else none",
        help="A point still running after this long is an error (its worker process is "
        "killed; the other points run). 0: no limit.")] = None,
    layout: Annotated[list[str] | None, typer.Option(
        "--layout", metavar="LAYOUT,…", rich_help_panel=WHAT,
        show_default="contiguous; x-, grad-strided at γ=randn",
        help="Memory layouts of x, the weight and the cotangent: contiguous; x-, weight-, "
        "grad-strided; x-, grad-transposed; x-, weight-, grad-offset. Each but contiguous "
        "runs at γ=randn.")] = None,
    check: Annotated[list[str] | None, typer.Option(
        metavar="CHECK,…", rich_help_panel=WHAT, show_default="all",
        help=f"Which checks: {', '.join(AXIS['check'].choices)} (each op has its own: "
        "`gradcheck-bi ops`).")] = None,
    weight: Annotated[list[str] | None, typer.Option(
        metavar=choices(AXIS["control"].choices, many=True), rich_help_panel=WHAT,
        show_default="all",
        help="γ controls (on the effective weight; ones is the blind control).")] = None,
    zcg: Annotated[str | None, typer.Option(
        metavar=choices(tuple(ZCG)), rich_help_panel=WHAT, show_default="both",
        help="zero_centered_gamma.")] = None,
    bias: Annotated[list[str] | None, typer.Option(
        metavar=choices(AXIS["bias"].choices, many=True), rich_help_panel=WHAT, show_default="all",
        help="β controls (layer_norm).")] = None,
    group_size: Annotated[list[str] | None, typer.Option(
        metavar="N|D,…", rich_help_panel=WHAT, show_default="D/4 and D",
        help="Group sizes of rms_norm_gated (D: one group per row).")] = None,
    norm_before_gate: Annotated[str | None, typer.Option(
        metavar=choices(tuple(ZCG)), rich_help_panel=WHAT, show_default="both",
        help="rms_norm_gated: normalise before the gate (on) or after (off).")] = None,
    case: Annotated[Path | None, typer.Option(
        metavar="FILE.toml", rich_help_panel=WHAT, show_default="none",
        help="A TOML sweep (cases/README.md); other options override what it sets.")] = None,
    mode: Annotated[str | None, typer.Option(
        metavar=choices(AXIS["mode"].choices), rich_help_panel=WHAT, show_default="full",
        help="dx: every element, or random projections per row (elements not checked).")
    ] = None,
    directions: Annotated[int | None, typer.Option(
        rich_help_panel=WHAT, show_default="8",
        help="Random directions per row in --mode directional.")] = None,
    device: Annotated[str | None, typer.Option(
        metavar=choices(AXIS["device"].choices), rich_help_panel=WHERE,
        show_default="cpu, + cuda if present",
        help="Where the kernel runs.")] = None,
    dtype: Annotated[str | None, typer.Option(
        metavar=choices(AXIS["dtype"].choices), rich_help_panel=WHERE,
        show_default="fp64 on cpu, fp32 on cuda", help="Input dtype.")] = None,
    shape: Annotated[list[str] | None, typer.Option(
        metavar="D0,D1,…", rich_help_panel=WHERE, show_default="2,8,256",
        help="Input shape; repeat for several shapes.")] = None,
    eps: Annotated[float | None, typer.Option(
        rich_help_panel=WHERE, show_default="1e-06", help="RMSNorm eps (> 0).")] = None,
    seed: Annotated[int | None, typer.Option(
        rich_help_panel=WHERE, show_default="0", help="Seed of the random x, g, γ.")] = None,
    max_memory: Annotated[str | None, typer.Option(
        metavar="BYTES", rich_help_panel=WHERE, show_default="¼ of free memory",
        help="Budget for the finite differences, e.g. 2G; a shape that cannot fit is "
        "refused (exit 2).")] = None,
    threads: Annotated[int | None, typer.Option(
        rich_help_panel=WHERE, show_default="by chunk size, or OMP_NUM_THREADS",
        help="Pin every torch CPU op to N threads; unset, the finite differences use one "
        "thread for small chunks and every idle core for large ones (docs/benchmarks.md).")
    ] = None,
    atol: Annotated[float | None, typer.Option(
        rich_help_panel=JUDGE, show_default="derived",
        help="Replace the derived tolerance with this absolute one.")] = None,
    rtol: Annotated[float | None, typer.Option(
        rich_help_panel=JUDGE, show_default="0", help="Add rtol × max|reference|.")] = None,
    precision: Annotated[str | None, typer.Option(
        metavar=choices(AXIS["precision"].choices), rich_help_panel=JUDGE,
        show_default="measured",
        help="Judge rounding at the precision the kernel computes in, measured from its "
        "forward (fp32 inside an fp64 call: at fp32), or exact: at the dtype's.")] = None,
    expect: Annotated[str | None, typer.Option(
        metavar=choices(EXPECTS), rich_help_panel=JUDGE, show_default="pass",
        help="What kernels that declare no defects must do everywhere.")] = None,
    baseline: Annotated[Path | None, typer.Option(
        metavar="FILE.json", rich_help_panel=JUDGE, show_default="none",
        help="Compare every result with this recorded run; drift exits 1.")] = None,
    update_baseline: Annotated[bool, typer.Option(
        "--update-baseline", rich_help_panel=JUDGE, show_default=False,
        help="Record this run as --baseline FILE instead of comparing.")] = False,
    strict: Annotated[bool, typer.Option(
        "--strict", rich_help_panel=JUDGE, show_default=False,
        help="Unsupported results (no GPU, a kernel refusing a dtype) and a run that checked "
        "nothing exit 1, not 3.")] = False,
    bisect: Annotated[bool, typer.Option(
        "--bisect", rich_help_panel=JUDGE, show_default=False,
        help="For `git bisect run`: bad input, could not run or nothing checked (exit 2, "
        "3) exits 125, git's skip; an internal error (4) exits 255, which stops the "
        "bisection.")] = False,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar="FORMAT", rich_help_panel=OUTPUT,
        show_default="table on a terminal, else text",
        help="table (Rich), text (logs), markdown (PRs), json, junit, github (annotations).")
    ] = None,
    output: Annotated[Path | None, typer.Option(
        metavar="FILE", rich_help_panel=OUTPUT, show_default="stdout",
        help="Write the report here (atomically); the verdict still goes to stdout.")] = None,
    plot: Annotated[str | None, typer.Option(
        metavar="PNG", rich_help_panel=OUTPUT, show_default="none",
        help="--format markdown: embed this image (from `gradcheck-bi plot --output`).")
    ] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", rich_help_panel=OUTPUT, show_default=False,
        help="List every result not as expected, not only the worst per kernel and check.")
    ] = False,
    progress: Annotated[bool, typer.Option(
        rich_help_panel=OUTPUT, show_default="on", help="Progress on stderr (TTY only).")
    ] = True,
    shard: Annotated[str | None, typer.Option(
        metavar="K/N", rich_help_panel=WHERE, show_default="all points",
        help="Run shard K of N (balanced by cost); `gradcheck-bi merge` joins the shards' "
        "--format json reports into the unsharded run's report.")] = None,
    debug: Annotated[bool, typer.Option(
        "--debug", rich_help_panel=OUTPUT, show_default=False, help="Show tracebacks.")
    ] = False,
) -> int:
    """Check a kernel's forward, every gradient and batch invariance over its op's blind controls.

    gradcheck-bi run --kernel my_kernels.py:MyFn --dtype fp32 --shape 4,1000
    """
    given = dict(locals())  # the options by name: the point's are read by its table
    started = time.perf_counter()
    check_paths(output=output, baseline=baseline, update_baseline=update_baseline, plot=plot)
    fmt_name = one_of("--format", fmt, FORMATS) or (
        "table" if Console().is_terminal else "text")
    set_threads(threads)
    _validate(fmt_name, plot, update_baseline, baseline)
    own: list[str] = []
    if generic:  # a generic kernel's gradients are named by its parameters (--check dinput)
        given["check"], own = own_checks(given["check"])
    point = point_options(given)
    if own:
        point["check"] = [*point.get("check", []), *own]
    expect = one_of("--expect", expect, EXPECTS)
    try:
        part = parse_shard(shard) if shard is not None else None
    except ShardError as exc:
        raise UsageError(str(exc)) from None
    sweeps, recorded, dropped = _load(case, baseline, update_baseline)
    kernels = many_of("--kernel", kernel)
    extra = dict(parse_kernel_arg(a) for a in kernel_arg or [])
    if point.get("op") is not None:
        # the adapter's reserved kernel arg (kernels/adapting/adapters.py)
        extra["op"] = point.pop("op")
    targets = _targets(point.pop("device", None), point.pop("dtype", None))
    if generic:
        extra["generic"] = _generic_shapes(point, extra, targets)
    if targets is not None:
        dropped = []  # the command line's targets replace the case's: nothing of it dropped
    for d in dropped:  # one line per target skip_missing_devices left out
        sys.stderr.write(f"gradcheck-bi: note: {d['target']} dropped from sweep "
                         f"{d['sweep']!r} (skip_missing_devices): {d['reason']}\n")
    sweeps = [with_overrides(
        sweep,
        **{key: value for name, value in point.items() if (key := AXIS[name].key)},
        kernels=[complete_ref(k) for k in kernels] if kernels else None,
        targets=targets,
        expect=expect,
        expectations=[] if expect else None,  # --expect outranks a case's rules
        kernel_args={**sweep.kernel_args, **extra} if extra else None,
        allow_mutation=many_of("--allow-mutation", allow_mutation, MUTABLE),
        timeout=_timeout(timeout),
    ) for sweep in sweeps]
    try:
        done = execute(sweeps, progress, part)
    except MemoryBudgetError as exc:  # refused with the grid, before any point ran
        raise UsageError(str(exc)) from None
    results, notes, idle = done.results, done.notes, done.idle
    drifts = baselines.compare(results, recorded) if recorded is not None else []
    code = exit_code(results, drifted=bool(drifts), strict=strict, unchecked=idle)
    if update_baseline and baseline is not None:
        baselines.write(baseline, baselines.Baseline.from_results(results))
        Console(stderr=True).print(f"recorded baseline {baseline} ({len(results)} results)")
    report = Report(results, drifts, baseline if recorded is not None else None, code,
                    strict, verbose, environment() if fmt_name == "json" else {}, notes,
                    dropped, idle,
                    None if done.shard is None else {**done.shard, "strict": strict})
    if debug:
        print_tracebacks(results)
    emit(report, fmt_name, output, plot, time.perf_counter() - started)
    return code


def _generic_shapes(point: dict[str, Any], extra: dict[str, Any],
                    targets: list[tuple[str, str]] | None) -> list[tuple[int, ...]]:
    """``--generic``: the ``--shape`` of each input (taken from the sweep's shapes: the
    inputs' shapes are one point), refusing what it cannot check."""
    shapes = point.pop("shape", None)
    if not shapes:
        raise UsageError("--generic needs one --shape per tensor argument of the kernel, in "
                         "order (e.g. --shape 4,64 --shape 64)")
    if "op" in extra:
        raise UsageError("--generic and --op exclude each other: --generic is for a kernel "
                         "that computes no op here")
    half = [dt for _, dt in targets or [] if dt in ("bf16", "fp16")]
    if half:
        raise UsageError(f"--generic --dtype {half[0]}: the generic check needs fp32 or fp64 "
                         "(no difference of a half-precision forward resolves a gradient, "
                         "and there is no reference to hold it to)")
    return [tuple(s) for s in shapes]


def _timeout(seconds: float | None) -> float | None:
    """``--timeout``, by the case key's rule (gradcheck_bi.cases: a number >= 0)."""
    try:
        return None if seconds is None else nonnegative(seconds)
    except BadValue as exc:
        raise UsageError(f"--timeout {seconds:g}: expected {exc}") from None


def point_options(given: dict[str, Any]) -> dict[str, Any]:
    """``{field: value}`` for every axis of the point whose ``run`` option was given (the
    option's parameter in ``given``), read and checked by the axis (:func:`read`)."""
    out = {}
    for axis in AXES:
        if axis.cli is not None:
            value = read(axis, given[axis.cli.removeprefix("--").replace("-", "_")])
            if value is not None:
                out[axis.field] = value
    return out


def _validate(fmt: str, plot: str | None, update_baseline: bool, baseline: Path | None) -> None:
    if plot is not None and fmt != "markdown":
        raise UsageError("--plot embeds an image in --format markdown only")
    if update_baseline and baseline is None:
        raise UsageError("--update-baseline needs --baseline FILE (where to record the run)")


def _load(case: Path | None, baseline: Path | None, update_baseline: bool
          ) -> tuple[list[Sweep], baselines.Baseline | None, list[dict[str, str]]]:
    """The case's sweeps (or the default one), the recorded baseline to compare with, and
    the targets the case dropped (skip_missing_devices)."""
    try:
        loaded = load_case(case) if case is not None else None
        recorded = (baselines.load(baseline)
                    if baseline is not None and not update_baseline else None)
    except (CaseError, baselines.BaselineError) as exc:
        raise UsageError(str(exc)) from None
    if loaded is None:
        return [Sweep()], recorded, []
    return loaded.sweeps, recorded, loaded.dropped


