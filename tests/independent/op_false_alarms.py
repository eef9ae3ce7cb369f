"""Seeded random configurations of every row op (the norms), for the false-alarm runs.

The correct kernels (:data:`KERNELS`: the bundled ``after``, tests/kernels/) must pass every
check of their op at every configuration: a failure is a false alarm of the tool. Each
configuration draws a shape (1-3 dims, D from 2 to 1030, rows capped so the finite
differences stay cheap), an input scale 10^U(-3, 3), a randn-γ scale 10^U(-2, 1), eps
10^U(-12, -1), a γ control, zcg (where the kernel takes it), a β control (layer_norm), a
group size among D's divisors and norm_before_gate (rms_norm_gated), and a dtype.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The correct kernel of each op: a bundled name, or a path under the repository.
KERNELS = {"rms_norm": "after",
           "fused_add_rms_norm": "tests/kernels/fused_add_rms_norm.py",
           "layer_norm": "tests/kernels/layer_norm.py",
           "rms_norm_gated": "tests/kernels/rms_norm_gated.py"}
WIDTHS = (2, 3, 8, 16, 33, 64, 100, 128, 255, 256, 384, 513, 1000, 1030)
MAX_ROWS_D2 = 3_000_000


def configs(op: str, n: int, dtypes: tuple[str, ...], device: str, seed: int,
            widths: tuple[int, ...] = WIDTHS) -> Iterator[dict[str, Any]]:
    """``n`` random configurations of ``op`` (Config keyword arguments minus ``check``)."""
    rng = random.Random(f"{seed}-{op}")
    for _ in range(n):
        d = rng.choice(widths)
        max_rows = max(1, min(48, MAX_ROWS_D2 // (d * d)))
        ndim = rng.choice((1, 2, 3))
        lead: list[int] = []
        if ndim >= 2:
            lead.append(rng.randint(1, max_rows))
        if ndim == 3:
            lead.append(rng.randint(1, max(1, max_rows // lead[0])))
        divisors = [g for g in range(1, d + 1) if d % g == 0]
        yield dict(
            op=op, device=device, dtype=rng.choice(dtypes), shape=(*lead, d),
            eps=10 ** rng.uniform(-12, -1), seed=rng.randrange(1 << 31),
            control=rng.choice(("randn", "ones", "zeros")),
            zero_centered_gamma=rng.random() < 0.5,
            input_scale=10 ** rng.uniform(-3, 3), weight_scale=10 ** rng.uniform(-2, 1),
            bias=rng.choice(("randn", "zeros")) if op == "layer_norm" else None,
            group_size=rng.choice(divisors) if op == "rms_norm_gated" else None,
            norm_before_gate=rng.random() < 0.5 if op == "rms_norm_gated" else None,
        )


def kernel(ref: str) -> Any:
    """The KernelSpec of ``ref`` (a bundled name, ``PATH:ATTR``, or a path under REPO)."""
    from gradcheck_bi.kernels import resolve
    from gradcheck_bi.kernels.registry import BUNDLED

    return resolve(ref if ":" in ref or ref in BUNDLED else str(REPO / ref))


def run(n: int, dtypes: tuple[str, ...], device: str, seed: int = 20260601,
        widths: tuple[int, ...] = WIDTHS, log: Callable[[str], None] = lambda s: None,
        ops: tuple[str, ...] | None = None, kernels: dict[str, str] | None = None
        ) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every check of every op's correct kernel (``kernels``: others, by op) at ``n``
    configurations per op → tallies per (op, dtype, check): count, failures, the worst
    err/tol ratio, the messages and the seconds. A β and the op's own options (a gate's
    activation) are drawn where the kernel takes them."""
    from dataclasses import replace

    from gradcheck_bi.checks import run_check
    from gradcheck_bi.ops import ROWS
    from gradcheck_bi.sweep import checks_of, takes
    from gradcheck_bi.vocab import Config

    tallies: dict[tuple[str, str, str], dict[str, Any]] = {}
    for op, ref in (kernels or KERNELS).items():
        if ops is not None and op not in ops:
            continue
        spec = kernel(ref)
        own = [a for a in ROWS[op].axes if a.name not in dict(spec.fixed)]
        rng = random.Random(f"{seed}-{op}-own")
        for i, kw in enumerate(configs(op, n, dtypes, device, seed, widths)):
            if kw["zero_centered_gamma"] not in spec.zcg:
                kw = {**kw, "zero_centered_gamma": False}
            if op == "rms_norm_gated" and takes(spec, "bias"):
                kw = {**kw, "bias": rng.choice(("randn", "zeros"))}
            if own:
                kw = {**kw, "variant": tuple((a.name, rng.choice(a.values)) for a in own)}
            started = time.perf_counter()
            for check in checks_of(spec):  # the kernel's: the gated norm's bias is optional
                cfg = replace(Config(check=check), **kw)
                t = tallies.setdefault((op, cfg.dtype, check), {
                    "count": 0, "failures": 0, "worst_ratio": 0.0, "worst_at": "",
                    "messages": [], "seconds": 0.0})
                began = time.perf_counter()
                try:
                    m = run_check(spec.fn, cfg)
                    ok, msg = m.passed, m.message
                    tol = m.tolerance
                    ratio = (m.max_abs_err / tol if tol else (0.0 if m.max_abs_err == 0
                                                             else float("inf")))
                except Exception as exc:  # a crash is a false alarm too
                    ok, msg, ratio = False, f"{type(exc).__name__}: {exc}", float("inf")
                t["count"] += 1
                t["seconds"] += time.perf_counter() - began
                if ratio > t["worst_ratio"]:
                    t["worst_ratio"], t["worst_at"] = ratio, f"{kw}"
                if not ok:
                    t["failures"] += 1
                    t["messages"].append(f"{op} {check} {kw}: {msg} (ratio {ratio:.3g})")
            log(f"{op} {i + 1}/{n} {kw['dtype']} {kw['shape']} "
                f"{time.perf_counter() - started:.1f}s")
    return tallies


def summary(tallies: dict[tuple[str, str, str], dict[str, Any]], header: str) -> str:
    lines = [header, "", "| op | dtype | check | results | false alarms | worst err/tol |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for (op, dtype, check), t in sorted(tallies.items()):
        lines.append(f"| {op} | {dtype} | {check} | {t['count']} | {t['failures']} | "
                     f"{t['worst_ratio']:.3f} |")
    return "\n".join(lines)
