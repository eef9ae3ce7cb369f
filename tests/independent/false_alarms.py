"""Seeded random configurations for the false-alarm runs (CPU test and GPU script).

A correct kernel must pass every check at every configuration: a failure is a false alarm
of the tool, never something to tolerate. Each configuration draws a shape (1-3 dims, D
from 1 to 2048 including non-powers of two, rows capped so the dx check stays cheap), an
input scale 10^U(-3, 3), a randn-γ scale 10^U(-2, 1), eps 10^U(-12, -1), a γ control, zcg
and a dtype, and runs all four checks on it for each correct kernel.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WIDTHS = (1, 2, 3, 7, 16, 33, 64, 100, 128, 255, 256, 257, 384, 513, 1000, 1024, 1030, 2048)
# rows · D² bounds the dx check's cost (D columns × a batch of rows · D elements).
MAX_ROWS_D2 = 3_000_000
CHECKS = ("forward", "dx", "dw", "batch_invariance")


def configs(n: int, dtypes: tuple[str, ...], device: str, seed: int = 20240607,
            widths: tuple[int, ...] = WIDTHS) -> Iterator[dict[str, Any]]:
    """``n`` random configurations (keyword arguments of ``checks.Config`` minus ``check``).

    Each carries a random memory layout (every layout as often as contiguous), drawn from a
    stream of its own so that the other draws are those of earlier runs."""
    from gradcheck_bi.kernels.calling.layout import LAYOUTS

    rng = random.Random(seed)
    layouts = random.Random(seed + 1)
    for _ in range(n):
        d = rng.choice(widths)
        ndim = rng.choice((1, 2, 3))
        max_rows = max(1, min(48, MAX_ROWS_D2 // (d * d)))
        lead: list[int] = []
        if ndim >= 2:
            lead.append(rng.randint(1, max_rows))
        if ndim == 3:
            lead.append(rng.randint(1, max(1, max_rows // lead[0])))
        yield dict(
            device=device, dtype=rng.choice(dtypes), shape=(*lead, d),
            eps=10 ** rng.uniform(-12, -1), seed=rng.randrange(1 << 31),
            control=rng.choice(("randn", "ones", "zeros")), zero_centered_gamma=rng.random() < 0.5,
            input_scale=10 ** rng.uniform(-3, 3), weight_scale=10 ** rng.uniform(-2, 1),
            layout=layouts.choice(LAYOUTS),
        )


@dataclass
class Tally:
    count: int = 0
    failures: int = 0
    worst_ratio: float = 0.0
    worst_at: str = ""
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)


def kernels() -> dict[str, Any]:
    """The correct kernels: the bundled ``after`` and the independent one in this folder."""
    from gradcheck_bi.kernels.bundled.rmsnorm import After

    sys.path.insert(0, str(HERE))
    from rmsnorm_ref import IndependentRMSNorm

    return {"after": After, "independent": IndependentRMSNorm}


def run(n: int, dtypes: tuple[str, ...], device: str,
        log: Callable[[str], None] = lambda s: None, seed: int = 20240607,
        widths: tuple[int, ...] = WIDTHS) -> dict[tuple[str, str, str], Tally]:
    """Every check of every correct kernel at ``n`` configurations → tallies per
    (kernel, dtype, check). ``ratio`` is err / tolerance (bitwise checks: 0 or inf)."""
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.kernels.calling.layout import applies
    from gradcheck_bi.vocab import Config

    tallies: dict[tuple[str, str, str], Tally] = {}
    for i, base in enumerate(configs(n, dtypes, device, seed, widths)):
        for name, fn in kernels().items():
            for check in CHECKS:
                layout = base["layout"] if applies(base["layout"], check) else "contiguous"
                cfg = Config(check=check, **{**base, "layout": layout})
                t0 = time.perf_counter()
                try:
                    m = run_check(fn, cfg)
                    err, tol, ok, msg = m.max_abs_err, m.tolerance, m.passed, m.message
                except Exception as exc:  # a crash is a false alarm too
                    err, tol, ok, msg = math.inf, 0.0, False, f"{type(exc).__name__}: {exc}"
                t = tallies.setdefault((name, cfg.dtype, check), Tally())
                t.seconds += time.perf_counter() - t0
                t.count += 1
                ratio = err / tol if tol > 0 else (0.0 if err == 0 else math.inf)
                if ratio >= t.worst_ratio:
                    t.worst_ratio = ratio
                    t.worst_at = f"#{i} {cfg.shape} eps {cfg.eps:.1e} x·{cfg.input_scale:.1e}"
                if not ok:
                    t.failures += 1
                    t.messages.append(f"config #{i} {base}: err {err:.3e} tol {tol:.3e} {msg}")
                    log(f"FALSE ALARM {name} {check} #{i} {base}: {err:.3e} > {tol:.3e} {msg}")
        log(f"{i + 1}/{n} done")
    return tallies


def summary(tallies: dict[tuple[str, str, str], Tally], header: str) -> str:
    """A Markdown table: per (kernel, dtype, check) the count, failures, worst err/tol."""
    lines = [header, "",
             "| kernel | dtype | check | configs | false alarms | worst err/tol | at | s |",
             "| --- | --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for (name, dtype, check), t in sorted(tallies.items()):
        lines.append(f"| {name} | {dtype} | {check} | {t.count} | {t.failures} | "
                     f"{t.worst_ratio:.3g} | {t.worst_at} | {t.seconds:.1f} |")
    total = sum(t.count for t in tallies.values())
    bad = sum(t.failures for t in tallies.values())
    lines += ["", f"{total} checks, {bad} false alarms."]
    for t in tallies.values():
        lines += [f"- {m}" for m in t.messages]
    return "\n".join(lines) + "\n"
