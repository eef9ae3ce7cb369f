"""False alarms of the ops of any shape, and the smallest defect each one's checks catch.

    PYTHONPATH=. python benchmarks/shaped_false_alarms.py [--n 200] [--ops gemm,…]
        [--dtypes fp64,fp32,bf16] [--seed S] [--device cpu|cuda] [--deadline SECONDS]
        [--shard I/K] [--json PATH] [--no-power] [--quiet]

For every op in :data:`gradcheck_bi.ops.SHAPED` (an op without a correct kernel in
:data:`KERNELS` is listed as such, never skipped in silence), each dtype: ``--n`` random
configurations (:func:`configs`), each run through every check of the op that applies
there, the way a sweep runs a point (probe, working precision, gate:
:class:`gradcheck_bi.measure.PointMeasurer`). A correct kernel must pass every one: a result
that is not ``pass`` is a false alarm, printed with the Config that reproduces it.

A configuration draws, generically from the op's record:

* a seed;
* a shape: 1–3 leading dims of at most :data:`MAX_ROWS` rows in all, each trailing (inner)
  size uniform in 1–:data:`MAX_INNER` (:data:`INNER_CAP`: a GEMM's ``K``, a Python loop in
  the reference kernel, to 64) — small, odd, non-powers of two; a shape whose finite
  differences would take more than :data:`MAX_CALLS` forward calls in one check (the
  colours of :mod:`gradcheck_bi.fd.plan`, counted from the op's axes) is drawn again, so
  that a point stays cheap: a check takes every colour of a small tensor, or the sampled
  colours and random directions of one past ``FULL_COLOURS``, never thousands of calls;
* every axis of the op at a random value, crossed freely (not only ``op.variants()``),
  an option the kernel fixes (``spec.fixed``) at its value;
* a layout among what a sweep offers the op (:func:`gradcheck_bi.sweep.shaped_layouts`): a
  check the layout does not apply to runs contiguous.

* an input scale ``10^U(−3, 3)`` for an op that draws roles at one (``ShapedOp.scaled``:
  swiglu's ``a, b``, where silu's tail lies at large inputs); every other op at its own
  draw's scale (GEMM's inputs are unit normals, ``gelu_and_mul``'s gate 3×,
  cross-entropy's logits 2×), which this harness does not change.

Detection power (``--no-power`` skips it), fp64 and fp32: the correct kernel with every
output's cotangent multiplied by ``1 + δ`` in its backward (so every input gradient is off by
a relative ``δ``), at the op's default point (its default shape and variant, seed 0,
contiguous): the smallest ``δ`` in 1e-1 … 1e-12 that some gradient check fails, found by a
decade scan downwards and a bisection in log ``δ`` between the last decade caught and the
first missed.

``--device cuda`` runs the same configurations (the same draws, in the same order) with the
kernel's tensors on the GPU, the smallest defect too. ``--deadline`` bounds a process: the
smallest defect first (stopped, and said so, at a quarter of the deadline), then
configurations until that many seconds from the start; a row counts the configurations it
completed, never the ``--n`` asked for. ``--shard I/K`` runs configuration ``i`` of the
``--n`` only where ``i % K == I`` (every shard draws all of them, so K processes run the same
``--n`` configurations between them; shard 0 alone measures the smallest defect). ``--json``
writes the rows (and every false alarm's Config) for :mod:`merge_false_alarms`, which joins
the rows of several processes into one table (benchmarks/gpu_false_alarms.sh).

"s per configuration" holds the first configuration's one-off costs (the working-precision
probe, the first calls): at a small ``--n`` it overstates the cost of many.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gradcheck_bi.checks.shaped import run_shaped_check
from gradcheck_bi.fd.plan import (
    DIRECTIONS,
    FULL_COLOURS,
    LEVELS,
    SAMPLED_COLOURS,
    shared_and_colour,
)
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.calling.shaped_call import ShapedKernel
from gradcheck_bi.measure import PointMeasurer
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import ShapedOp, Variant
from gradcheck_bi.sweep import Sweep, _layout_applies, _variant_has, shaped_layouts
from gradcheck_bi.vocab import Config, KernelSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from merge_false_alarms import alarm_lines, markdown

# The correct kernel of each op of any shape; an op missing here is reported, not skipped.
KERNELS = {
    "gemm": "tests/kernels/gemm.py:GemmFn",
    "gelu_and_mul": "tests/kernels/gelu_and_mul.py:GeluAndMul",
    "gelu_and_mul_halves": "tests/kernels/entry_points.py:GeluAndMul",  # vLLM's module
    "cross_entropy": "tests/kernels/cross_entropy.py:CrossEntropy",
    "swiglu": "tests/kernels/entry_points.py:LigerSiLUMulFunction",  # its multipliers drawn
    "silu_and_mul": "tests/kernels/silu_and_mul.py:SiluAndMul",
    "log_softmax": "tests/kernels/log_softmax.py:LogSoftmax",
    "token_logprobs": "tests/kernels/token_logprobs.py:TokenLogprobs",
    # Liger's signature, every option taken (the plain FusedLinearCrossEntropy fixes bias
    # off and the options at their defaults)
    "fused_linear_cross_entropy":
        "tests/kernels/fused_linear_cross_entropy.py:ChunkedFusedLinearCrossEntropy",
}
ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("fp64", "fp32", "bf16")
POWER_DTYPES = ("fp64", "fp32")
MAX_ROWS = 40
MAX_INNER = 300
# An inner size (by its name in op.sizes) whose cost is quadratic in the reference kernel:
# GEMM's K is a Python loop in tests/kernels/gemm.py, and dA/dB take K colours each.
INNER_CAP = {("gemm", "k"): 64}
# The most forward calls one gradient check of a configuration may take (redrawn past it).
MAX_CALLS = 600


@dataclass
class Tally:
    asked: int = 0  # the configurations of --n this shard runs
    configs: int = 0  # completed (fewer than asked where a deadline stopped the draws)
    results: int = 0
    alarms: list[str] = field(default_factory=list)
    alarm_configs: list[dict[str, Any]] = field(default_factory=list)  # one per alarm
    worst: float = 0.0  # the largest error/tolerance of a passing gradient or forward
    seconds: float = 0.0
    by_check: dict[str, int] = field(default_factory=dict)


# -- drawing configurations ----------------------------------------------------------------
def _inner_names(op: ShapedOp) -> list[str]:
    """The op's trailing sizes, in ``--shape`` order: the names ``op.sizes`` gives that are
    not the rows (``n``) or the leading dims — where they are ``--shape``'s trailing dims
    one for one; else (a halves op's ``two, d`` from one ``2D``) those dims unnamed."""
    s = op.sizes(op.default_shape)
    names = [k for k in s if k != "n" and not k.startswith("lead")]
    trailing = len(op.default_shape) - s.get("lead", len(op.default_shape) - len(names))
    return names if trailing == len(names) else [f"dim{i}" for i in range(trailing)]


def forward_calls(op: ShapedOp, shape: tuple[int, ...], variant: Variant) -> int:
    """The most forward calls a gradient check takes at ``shape`` and ``variant``: per
    colour (every one up to FULL_COLOURS, else the sampled ones and the directions), two
    per level."""
    sizes = op.sizes(shape)
    outs = [o.axes for o in op.outputs_at(dict(variant.values))]
    most = 0
    for check, name in op.gradient_checks.items():
        if not _variant_has(op, variant, check):
            continue
        r = op.role(name)
        _, colour = shared_and_colour(r.axes, outs, op.coupled)
        total = math.prod(sizes[a] for a in colour)
        picks = total if total <= FULL_COLOURS else SAMPLED_COLOURS + DIRECTIONS
        most = max(most, 2 * len(LEVELS) * picks)
    return most


def random_shape(op: ShapedOp, rng: random.Random) -> tuple[int, ...]:
    """1–3 leading dims of at most MAX_ROWS rows, then each inner size in 1–its cap."""
    rows = rng.randint(1, MAX_ROWS)
    lead: list[int] = [rows]
    for _ in range(rng.choice((0, 0, 1, 2))):  # split the rows into more leading dims
        divisors = [d for d in range(1, lead[-1] + 1) if lead[-1] % d == 0]
        d = rng.choice(divisors)
        lead[-1:] = [d, lead[-1] // d]
    while True:  # redrawn where the op refuses it (an odd width of a halves op)
        inner = [rng.randint(1, INNER_CAP.get((op.name, k), MAX_INNER))
                 for k in _inner_names(op)]
        shape = (*lead, *inner)
        try:
            op.sizes(shape)
        except ValueError:
            continue
        return shape


def random_variant(op: ShapedOp, fixed: dict[str, Any], rng: random.Random) -> Variant:
    return Variant(tuple((a.name, fixed[a.name] if a.name in fixed else rng.choice(a.values))
                         for a in op.axes))


def layouts_for(op: ShapedOp, variant: Variant) -> list[str]:
    """What a sweep offers the op, less a strided role that is absent and a layout that
    applies to none of the op's checks at ``variant``."""
    out = []
    for layout in shaped_layouts(op, Sweep()):
        if layout.endswith("-strided") and not layout.startswith("grad"):
            r = op.role(layout[: -len("-strided")])
            if r.optional and variant.get(r.name) is False:
                continue
        if any(_layout_applies(op, layout, variant, c) for c in op.checks
               if _variant_has(op, variant, c)):
            out.append(layout)
    return out


def configs(op: ShapedOp, spec: KernelSpec, dtype: str, n: int, seed: int,
            max_calls: int = MAX_CALLS, device: str = "cpu") -> Iterator[list[Config]]:
    """``n`` configurations of ``op``, each as its list of Configs, one per check."""
    rng = random.Random(f"{seed}-{op.name}-{dtype}")
    fixed = dict(spec.fixed)
    for _ in range(n):
        variant = random_variant(op, fixed, rng)
        shape = random_shape(op, rng)
        while forward_calls(op, shape, variant) > max_calls:
            shape = random_shape(op, rng)
        layout = rng.choice(layouts_for(op, variant))
        point_seed = rng.randrange(1 << 31)
        scale = 10.0 ** rng.uniform(-3.0, 3.0) if op.scaled else 1.0
        out = []
        for check in op.checks:
            if not _variant_has(op, variant, check):
                continue
            lay = layout if _layout_applies(op, layout, variant, check) else "contiguous"
            out.append(Config(check=check, device=device, dtype=dtype, shape=shape,
                              seed=point_seed, op=op.name, variant=variant.values,
                              layout=lay, input_scale=scale))
        yield out


def reproduce(ref: str, cfg: Config) -> str:
    where = f"device={cfg.device!r}, " if cfg.device != "cpu" else ""
    return (f"run_shaped_check(resolve({ref!r}).fn, Config(check={cfg.check!r}, {where}"
            f"dtype={cfg.dtype!r}, shape={cfg.shape!r}, seed={cfg.seed}, op={cfg.op!r}, "
            f"variant={cfg.variant!r}, layout={cfg.layout!r}"
            + (f", input_scale={cfg.input_scale!r}" if cfg.input_scale != 1.0 else "") + "))")


def false_alarms(op_name: str, dtype: str, n: int, seed: int = 20261203,
                 log: Callable[[str], None] = lambda s: None, max_calls: int = MAX_CALLS,
                 device: str = "cpu", until: float | None = None,
                 shard: tuple[int, int] = (0, 1)) -> Tally:
    """Every applicable check of ``op_name``'s correct kernel at ``n`` configurations (those
    of ``shard`` ``(I, K)``: ``i % K == I``; none begun once ``time.perf_counter()`` is past
    ``until``)."""
    ref = KERNELS[op_name]
    spec = resolve(str(ROOT / ref))
    op = SHAPED[op_name]
    sweep = Sweep(kernels=[spec.ref], targets=[(device, dtype)])
    measure = PointMeasurer()
    mine, of = shard
    tally = Tally(asked=len(range(mine, n, of)))
    start = time.perf_counter()
    for i, cfgs in enumerate(configs(op, spec, dtype, n, seed, max_calls, device)):
        if i % of != mine:
            continue
        if until is not None and time.perf_counter() >= until:
            log(f"{op_name} {dtype}: deadline reached after {tally.configs} of "
                f"{tally.asked} configurations")
            break
        tally.configs += 1
        for cfg in cfgs:
            r = measure(spec, cfg, sweep)
            tally.results += 1
            if r.status != "pass":
                tally.by_check[cfg.check] = tally.by_check.get(cfg.check, 0) + 1
                line = (f"{op_name} {dtype} #{i} {cfg.check} {r.status}: {r.message}\n"
                        f"    {reproduce(ref, cfg)}")
                tally.alarms.append(line)
                tally.alarm_configs.append({
                    "configuration": i, "check": cfg.check, "status": r.status,
                    "message": r.message, "config": dataclasses.asdict(cfg),
                    "reproduce": reproduce(ref, cfg)})
                log("FALSE ALARM " + line)
            elif r.max_abs_err is not None and r.tolerance:
                tally.worst = max(tally.worst, r.max_abs_err / r.tolerance)
        if tally.configs % 25 == 0:
            log(f"{op_name} {dtype}: {tally.configs} of {tally.asked} configurations, "
                f"{tally.results} results, "
                f"{len(tally.alarms)} false alarms, worst err/tol {tally.worst:.2f}, "
                f"{time.perf_counter() - start:.0f} s")
    tally.seconds = time.perf_counter() - start
    return tally


# -- detection power -----------------------------------------------------------------------
class _ScaledCotangent(torch.autograd.Function):
    """Identity forward; the backward multiplies the cotangent by ``1 + δ`` (in fp64)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, delta: float) -> torch.Tensor:
        ctx.delta = delta
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (g.double() * (1.0 + ctx.delta)).to(g.dtype), None


def off_by(out: Any, delta: float) -> Any:
    """A kernel's outputs (a tensor or a tuple) with every differentiable one's cotangent
    multiplied by ``1 + delta`` in the backward."""
    if isinstance(out, torch.Tensor):
        return _ScaledCotangent.apply(out, delta) if out.requires_grad else out
    return tuple(off_by(y, delta) if isinstance(y, torch.Tensor) else y for y in out)


@dataclass(frozen=True)
class Defective:
    """A correct kernel whose every input gradient is off by a relative ``delta``."""

    kernel: ShapedKernel
    delta: float

    def __call__(self, tensors: dict[str, Any], options: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(off_by(tuple(self.kernel(tensors, options)), self.delta))


def caught(op: ShapedOp, kernel: ShapedKernel, cfgs: list[Config], delta: float) -> bool:
    bad = Defective(kernel, delta)
    return any(not run_shaped_check(bad, cfg).passed for cfg in cfgs)  # type: ignore[arg-type]


def smallest_caught(op_name: str, dtype: str, steps: int = 4, device: str = "cpu",
                    until: float | None = None) -> tuple[float | None, bool]:
    """The smallest relative defect δ ∈ [1e-12, 1e-1] a gradient check of the op's default
    point catches (None: not even 1e-1), and whether the search ran to its end: past
    ``until`` (a ``time.perf_counter()``) it stops, with the smallest δ caught so far (an
    upper bound on the answer; None where none was tried)."""
    spec = resolve(str(ROOT / KERNELS[op_name]))
    op = SHAPED[op_name]
    variant = op.variants({k: [v] for k, v in spec.fixed})[0]
    cfgs = [Config(check=c, device=device, dtype=dtype, shape=op.default_shape, seed=0,
                   op=op_name, variant=variant.values)
            for c in op.gradient_checks if _variant_has(op, variant, c)]
    assert all(run_shaped_check(spec.fn, cfg).passed for cfg in cfgs), "correct kernel fails"
    return smallest(lambda delta: caught(op, spec.fn, cfgs, delta), steps, until)


def smallest(caught_at: Callable[[float], bool], steps: int = 4,
             until: float | None = None) -> tuple[float | None, bool]:
    """The smallest δ ∈ [1e-12, 1e-1] that ``caught_at`` catches, by a decade scan downwards
    and ``steps`` bisections in log δ between the last decade caught and the first missed,
    and whether the search ran to its end (see :func:`smallest_caught`)."""
    hit: float | None = None
    miss: float | None = None

    def stopped() -> bool:
        return until is not None and time.perf_counter() >= until

    def so_far(complete: bool) -> tuple[float | None, bool]:
        return (None if hit is None else 10.0**-hit), complete

    for e in range(1, 13):
        if stopped():
            return so_far(False)
        if caught_at(10.0**-e):
            hit = float(e)
        else:
            miss = float(e)
            break
    if hit is None or miss is None:
        return so_far(True)
    for _ in range(steps):  # hit < miss in decades: bisect log10 δ
        if stopped():
            return so_far(False)
        mid = (hit + miss) / 2
        if caught_at(10.0**-mid):
            hit = mid
        else:
            miss = mid
    return so_far(True)


# -- the table -----------------------------------------------------------------------------
def row(op_name: str, dtype: str, device: str, t: Tally | None, power: float | None = None,
        power_measured: bool = False, n: int | None = None, shard: tuple[int, int] = (0, 1),
        power_complete: bool = True, seed: int | None = None) -> dict[str, Any]:
    """One row of the table as JSON-ready data (``t`` None: the op has no correct kernel);
    ``n``: the configurations asked of all the shards together."""
    out: dict[str, Any] = {"op": op_name, "dtype": dtype, "device": device,
                           "kernel": KERNELS.get(op_name), "n": n, "seed": seed,
                           "shard": list(shard)}
    if t is None:
        return out
    return {**out, "asked": t.asked, "configurations": t.configs, "results": t.results,
            "false_alarms": len(t.alarms), "worst_err_tol": t.worst, "seconds": t.seconds,
            "s_per_configuration": t.seconds / t.configs if t.configs else None,
            "power_measured": power_measured, "power_complete": power_complete,
            "smallest_defect": power,
            "by_check": t.by_check, "alarms": t.alarm_configs}


def table(tallies: dict[tuple[str, str], Tally | None],
          power: dict[tuple[str, str], float | None], device: str = "cpu") -> str:
    return markdown([row(o, d, device, t, power.get((o, d)), (o, d) in power,
                         None if t is None else t.asked) for (o, d), t in tallies.items()])


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="configurations per op and dtype")
    ap.add_argument("--ops", default=",".join(SHAPED))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                    help="draw no configuration past this many seconds from the start")
    ap.add_argument("--shard", default="0/1", metavar="I/K",
                    help="run configuration i only where i %% K == I")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH",
                    help="write the rows, every false alarm's Config with them")
    ap.add_argument("--no-power", action="store_true", help="skip the smallest defect")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in SHAPED]
    if unknown:
        ap.error(f"unknown op(s) {', '.join(unknown)}: expected {', '.join(SHAPED)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"unknown dtype(s) {', '.join(bad)}: expected {', '.join(DTYPES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    try:
        mine, of = (int(x) for x in args.shard.split("/"))
        if not 0 <= mine < of:
            raise ValueError
    except ValueError:
        ap.error(f"--shard {args.shard}: expected I/K with 0 <= I < K, e.g. 0/2")
    until = None if args.deadline is None else started + args.deadline
    rows = []
    for op_name in ops:
        for dtype in dtypes:
            if op_name not in KERNELS:
                rows.append(row(op_name, dtype, args.device, None, n=args.n, seed=args.seed))
                continue
            power, measured, complete = None, False, True
            # the smallest defect first, under a deadline within its first quarter (past it
            # the search stops and says so): the configurations are the table's count
            if not args.no_power and mine == 0 and dtype in POWER_DTYPES:
                quarter = None if until is None else started + args.deadline / 4
                power, complete = smallest_caught(op_name, dtype, device=args.device,
                                                  until=quarter)
                measured = True
                log(f"{op_name} {dtype}: smallest defect caught {power}"
                    + ("" if complete else " (stopped at a quarter of the deadline)"))
            t = false_alarms(op_name, dtype, args.n, args.seed, log, device=args.device,
                             until=until, shard=(mine, of))
            log(f"{op_name} {dtype}: {t.configs} configurations, {t.results} results, "
                f"{len(t.alarms)} false alarms, {t.seconds:.0f} s")
            rows.append(row(op_name, dtype, args.device, t, power, measured, args.n,
                            (mine, of), complete, args.seed))
    elapsed = time.perf_counter() - started
    head = (f"{args.n} random configurations asked per op and dtype (seed {args.seed}), "
            f"{args.device}"
            + (f", shard {mine}/{of}" if of > 1 else "")
            + (f", deadline {args.deadline:g} s" if args.deadline is not None else "")
            + f", {elapsed:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"commit": _commit(), "torch": torch.__version__, "n": args.n, "seed": args.seed,
             "device": args.device, "deadline": args.deadline, "shard": [mine, of],
             "seconds": elapsed,
             "rows": rows}, indent=1, default=str) + "\n")
    print(head)
    print(markdown(rows))
    missing = sorted({o for o in ops if o not in KERNELS})
    if missing:
        print(f"no correct kernel: {', '.join(missing)} (add it to KERNELS)")
    alarms = alarm_lines(rows)
    for a in alarms:
        print(a)
    return 1 if alarms else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["KERNELS", "Defective", "Tally", "configs", "false_alarms", "main", "off_by",
           "row", "smallest", "smallest_caught", "table"]
