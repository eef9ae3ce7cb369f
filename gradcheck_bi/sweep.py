"""A sweep: kernels × (device, dtype) × shapes × scales × eps × seeds × checks × γ × zcg.

:class:`Sweep` holds the axes (its field names are the keys of a case file, see
``cases/README.md``); :func:`grid` expands it into ``(kernel, Config)`` points in a fixed
order; :func:`run` measures each point and judges it against the kernel's expectation.

>>> s = Sweep(kernels=["after"], targets=[("cpu", "fp64")], checks=["forward"])
>>> [r.status for r in run(s)][:3]
['pass', 'pass', 'pass']
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.checks import DTYPES, HALF_DTYPES, Config, Unsupported, run_check
from gradcheck_bi.kernels.registry import CHECKS, WEIGHTS, KernelSpec, resolve
from gradcheck_bi.verdict import Result, judge

DEFAULT_SHAPE = (2, 8, 256)


def default_targets() -> list[tuple[str, str]]:
    """fp64 on CPU, plus fp32 on CUDA when a GPU is present."""
    targets = [("cpu", "fp64")]
    if torch.cuda.is_available():
        targets.append(("cuda", "fp32"))
    return targets


@dataclass(frozen=True)
class Expectation:
    """A case's rule: at every point it matches (``None`` matches anything) expect ``status``.

    Rules outrank both ``expect`` and a bundled kernel's declared defects.
    """

    status: str
    kernel: str | None = None
    check: str | None = None
    device: str | None = None
    dtype: str | None = None
    weight: str | None = None
    zcg: bool | None = None
    reason: str = ""

    def matches(self, kernel: str, cfg: Config) -> bool:
        wanted = (self.kernel, self.check, self.device, self.dtype, self.weight, self.zcg)
        actual = (kernel, cfg.check, cfg.device, cfg.dtype, cfg.weight, cfg.zcg)
        return all(w is None or w == a for w, a in zip(wanted, actual, strict=True))


@dataclass
class Sweep:
    """The axes of a sweep. Every list is an axis; the grid is their product."""

    kernels: list[str] = field(default_factory=lambda: ["before", "after"])
    targets: list[tuple[str, str]] = field(default_factory=default_targets)
    shapes: list[tuple[int, ...]] = field(default_factory=lambda: [DEFAULT_SHAPE])
    input_scales: list[float] = field(default_factory=lambda: [1.0])
    weight_scales: list[float] = field(default_factory=lambda: [1.0])
    eps: list[float] = field(default_factory=lambda: [1e-6])
    seeds: list[int] = field(default_factory=lambda: [0])
    checks: list[str] | None = None  # None: every check the dtype supports
    weights: list[str] = field(default_factory=lambda: list(WEIGHTS))
    zcg: list[bool] = field(default_factory=lambda: [False, True])
    atol: float | None = None
    rtol: float | None = None
    stencil: str = "central-4"
    step_rel: float | None = None
    max_memory: int = fd.DEFAULT_MAX_MEMORY
    mode: str = "full"  # dx: "full" (every element) or "directional" (random projections)
    directions: int = 8
    expect: str | None = None  # "fail": every result of every kernel is expected to fail
    # A case's [[expectation]] rules; the last match decides (see Expectation).
    expectations: list[Expectation] = field(default_factory=list)

    def checks_for(self, dtype: str) -> list[str]:
        if self.checks is not None:
            return list(self.checks)
        if dtype in HALF_DTYPES:  # gradients of a half-precision forward: see checks._fd_stencil
            return ["forward", "batch_invariance"]
        return list(CHECKS)


def check_memory(sweep: Sweep) -> None:
    """Refuse up front (``fd.MemoryBudgetError``, with the estimate) a shape whose dx or dw
    check cannot fit in ``sweep.max_memory``."""
    for _, dtype in sweep.targets:
        if not {"dx", "dw"} & set(sweep.checks_for(dtype)) or dtype in HALF_DTYPES:
            continue
        for shape in sweep.shapes:
            checked = tuple(shape)
            if sweep.mode == "directional":  # one stacked row per (direction, row)
                checked = (sweep.directions, *checked)
            fd.check_budget(checked, fd.STENCILS[sweep.stencil], DTYPES[dtype],
                            sweep.max_memory)


def resolve_kernels(refs: list[str]) -> list[KernelSpec]:
    """Load every kernel once, up front: a kernel that cannot load stops the run (exit 2)."""
    return [resolve(ref) for ref in refs]


def grid(sweep: Sweep, kernels: list[KernelSpec]) -> Iterator[tuple[KernelSpec, Config]]:
    """Every point of the sweep, in a fixed order (check, zcg, kernel, target, ..., γ)."""
    for device, dtype in sweep.targets:
        for check, zcg, spec, shape, scale, wscale, eps, seed, weight in itertools.product(
            sweep.checks_for(dtype), sweep.zcg, kernels, sweep.shapes, sweep.input_scales,
            sweep.weight_scales, sweep.eps, sweep.seeds, sweep.weights,
        ):
            yield spec, Config(
                check=check, device=device, dtype=dtype, shape=tuple(shape), eps=eps,
                seed=seed, weight=weight, zcg=zcg, input_scale=scale, weight_scale=wscale,
                atol=sweep.atol, rtol=sweep.rtol, stencil=sweep.stencil,
                step_rel=sweep.step_rel, max_memory=sweep.max_memory, mode=sweep.mode,
                directions=sweep.directions,
            )


def _expected(spec: KernelSpec, cfg: Config, sweep: Sweep) -> str:
    for rule in reversed(sweep.expectations):
        if rule.matches(spec.name, cfg):
            return rule.status
    # --expect overrides only kernels that declare nothing: bundled ones know their defects.
    if sweep.expect is not None and spec.source != "bundled":
        return sweep.expect
    return spec.expected(cfg.check, cfg.zcg, cfg.weight)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def probe(spec: KernelSpec, device: str, dtype: str) -> str | None:
    """``None`` if the kernel runs a tiny forward here, else why it refuses (unsupported)."""
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda asked for, but no CUDA GPU is visible here"
    try:
        cfg = Config(check="forward", device=device, dtype=dtype, shape=(2, 8))
        from gradcheck_bi.checks import make_inputs

        x, w, _ = make_inputs(cfg)
        with torch.no_grad():
            spec.fn.apply(x, w, 1e-6, False)
    except Unsupported as exc:  # e.g. a user kernel whose module could not be imported here
        return str(exc)
    except Exception as exc:  # a kernel may raise anything; it is reported, not re-raised
        return f"kernel refuses {device}/{dtype}: {_first_line(exc)}"
    return None


def run_point(spec: KernelSpec, cfg: Config, sweep: Sweep, refused: str | None) -> Result:
    """Measure one point; kernel exceptions become ``error`` results with their message."""
    expected = _expected(spec, cfg, sweep)
    if refused is not None:
        return judge(spec.name, expected, cfg, status="unsupported", message=refused)
    try:
        measurement = run_check(spec.fn, cfg)
    except Unsupported as exc:
        return judge(spec.name, expected, cfg, status="unsupported", message=str(exc))
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # the kernel's own failure, reported per result
        return judge(spec.name, expected, cfg, status="error", message=_first_line(exc))
    return judge(spec.name, expected, cfg, measurement)


def run_points(
    points: list[tuple[KernelSpec, Config, Sweep]],
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Measure and judge each ``(kernel, config, its sweep)`` point, probing each kernel once
    per (device, dtype); ``on_result(result, done, total)`` reports progress."""
    refusals: dict[tuple[str, str, str], str | None] = {}
    results = []
    for i, (spec, cfg, sweep) in enumerate(points):
        key = (spec.name, cfg.device, cfg.dtype)
        if key not in refusals:
            refusals[key] = probe(spec, cfg.device, cfg.dtype)
        results.append(run_point(spec, cfg, sweep, refusals[key]))
        if on_result is not None:
            on_result(results[-1], i + 1, len(points))
    return results


def run(
    sweep: Sweep,
    kernels: list[KernelSpec] | None = None,
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Run every point of the sweep; ``on_result(result, done, total)`` reports progress."""
    specs = kernels if kernels is not None else resolve_kernels(sweep.kernels)
    return run_points([(spec, cfg, sweep) for spec, cfg in grid(sweep, specs)], on_result)


def with_overrides(sweep: Sweep, **overrides: Any) -> Sweep:
    """A copy of ``sweep`` with every non-``None`` override applied (command line over case)."""
    return replace(sweep, **{k: v for k, v in overrides.items() if v is not None})
