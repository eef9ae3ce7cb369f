"""Verdicts → the before/after tables, as plain data (no Rich, no Markdown).

One :class:`Table` per (check, γ's mode — zcg off or on): rows are kernel × device/dtype,
columns are the γ controls randn | ones (control) | zeros, and a cell holds the largest
error over every result that falls in it (several shapes, seeds or scales fold into one
cell; the cell counts them). Each table carries the discrimination ratio per row —
randn error / ones error — the number that says the sensitive control moved and the
blind one did not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from gradcheck_bi.gate import discrimination_ratio
from gradcheck_bi.ops import ALL_CHECKS, DEFAULT_OP, ROWS, SHAPED
from gradcheck_bi.ops.record import ZCG
from gradcheck_bi.point import has_eps, op_words, weight_words
from gradcheck_bi.vocab import CONTROLS, HALF_DTYPES, Result, format_error

CHECK_TITLES = {
    "forward": "forward: y vs an independent fp64 reference with the effective weight γ",
    "dx": "dx: analytic vs central finite differences of the kernel's own forward",
    "dw": "dw: analytic vs central finite differences of the kernel's own forward",
    "batch_invariance": "batch invariance: rows alone vs in batches, bitwise (y, dx); "
    "run to run (y, dx, dw)",
}
# bf16/fp16 results get tables of their own: their forward is measured in ulps and their
# gradients against a lifted reference (gradcheck_bi.checks.rows.lift), not like fp32/fp64.
HALF_CHECK_TITLES = {
    "forward": "forward (bf16/fp16): y in ulps vs the correctly rounded fp64 reference",
    "dx": "dx (bf16/fp16): analytic vs central differences of the kernel's own forward "
    "lifted to a higher precision at the same inputs",
    "dw": "dw (bf16/fp16): analytic vs central differences of the kernel's own forward "
    "lifted to a higher precision at the same inputs",
    "batch_invariance": "batch invariance (bf16/fp16): rows alone vs in batches, bitwise "
    "(y, dx); run to run (y, dx, dw)",
}
# The other row ops (gradcheck_bi.ops): tables of their own, named by the op.
OP_CHECK_TITLES = {
    "forward": "forward: every output vs the op's fp64 reference (effective γ, β)",
    **{c: f"{c}: analytic vs central finite differences of the kernel's own forward, "
       "random cotangents on every output" for c in ALL_CHECKS[1:-1]},
    "batch_invariance": "batch invariance: rows alone vs in batches, bitwise (every output "
    "and input gradient); run to run (every gradient)",
}
# An op without a weight (its record has no ``weight`` parameter) runs one point a case: its
# tables have one column and no γ or zcg words.
UNWEIGHTED_FORWARD_TITLE = "forward: every output vs the op's fp64 reference"
UNWEIGHTED_COLUMN = "error"
T = TypeVar("T")
COLUMN_TITLES = {"randn": "γ=randn", "ones": "γ=ones (control)", "zeros": "γ=zeros"}


@dataclass
class Cell:
    """The worst of the results that share a (table, row, γ) cell."""

    results: list[Result] = field(default_factory=list)

    @property
    def worst(self) -> Result | None:
        def key(r: Result) -> tuple[int, float]:
            err = r.max_abs_err if r.max_abs_err is not None else -1.0
            return (0 if r.as_expected else 1, err if not math.isnan(err) else math.inf)

        return max(self.results, key=key) if self.results else None

    @property
    def max_err(self) -> float | None:
        errs = [r.max_abs_err for r in self.results if r.max_abs_err is not None]
        return max(errs) if errs else None

    @property
    def shown_err(self) -> float | None:
        """The largest error in the unit the cell shows (ulps for bf16/fp16 gradients)."""
        errs = [r.max_abs_err / (ulp_unit(r) or 1.0) for r in self.results
                if r.max_abs_err is not None]
        return max(errs) if errs else None

    @property
    def as_expected(self) -> bool:
        return all(r.as_expected for r in self.results)

    def text(self) -> str:
        """``1.117e+00 fail (expected)`` — the error and the verdict of the worst result.

        Readable without colour: an expected failure says so, anything not as expected is
        in capitals (``FAIL (unexpected)``, ``PASS (defect missed)``).
        """
        w = self.worst
        if w is None:
            return "—"
        if w.status in ("error", "unsupported"):
            return w.status.upper() if not w.as_expected and w.status == "error" else w.status
        number = shown(w, w.max_abs_err)
        if not self.as_expected:
            verdict = "FAIL (unexpected)" if w.status == "fail" else "PASS (defect missed)"
        else:
            verdict = "fail (expected)" if w.status == "fail" else "pass"
        return f"{number} {verdict}"


@dataclass
class Row:
    kernel: str
    target: str  # "cpu fp64"
    cells: dict[str, Cell]

    @property
    def ratio(self) -> float | None:
        if "randn" not in self.cells or "ones" not in self.cells:
            return None  # an op of any shape: its columns are its own axis's values
        return discrimination_ratio(self.cells["randn"].shown_err, self.cells["ones"].shown_err)

    @property
    def has_ratio(self) -> bool:
        return "ones" in self.cells and bool(self.cells["ones"].results)

    @property
    def loosest(self) -> Result | None:
        """The result with the largest tolerance (the markdown's tolerance column)."""
        found = [r for c in self.cells.values() for r in c.results if r.tolerance is not None]
        return max(found, key=lambda r: r.tolerance or 0.0) if found else None

    @property
    def methods(self) -> list[str]:
        """How the row's results were measured (bf16/fp16 gradients: ``"lifted to fp64"``,
        ``"lifted to fp32"`` or ``"independent fp64 formula"``), in first-seen order."""
        return _unique(str(r.details["method"]) for c in self.cells.values()
                       for r in c.results if "method" in r.details)

    @property
    def worst_randn(self) -> list[int] | None:
        first = self.cells.get("randn") or next(iter(self.cells.values()))
        w = first.worst
        return w.worst if w is not None else None

    @property
    def detectable_randn(self) -> float | None:
        """The largest ``detectable_rel`` of the γ=randn results (dx, dw): the smallest
        relative error in the gradient that every one of them typically catches."""
        found = [float(r.details["detectable_rel"])
                 for r in (self.cells["randn"].results if "randn" in self.cells else [])
                 if "detectable_rel" in r.details]
        return max(found) if found else None


@dataclass
class Table:
    check: str
    zcg: bool
    rows: list[Row]
    shapes: list[list[int]]
    eps: list[float]
    seeds: list[int]
    half: bool = False  # bf16/fp16 rows (see HALF_CHECK_TITLES)
    op: str = DEFAULT_OP
    # An op of any shape: its column axis, its values in order, and its blind value.
    column: tuple[str, tuple[str, ...], str | None] | None = None

    @property
    def weighted(self) -> bool:
        """Whether the op has a weight: γ controls and zcg exist (its record says)."""
        return self.column is None and ROWS[self.op].offset_param is not None

    @property
    def controls(self) -> tuple[str, ...]:
        """The γ controls the table has columns for: all three, or the one point an op
        without a weight runs at (the results' own control); an op of any shape's column
        axis values."""
        if self.column is not None:
            return self.column[1]
        if self.weighted:
            return CONTROLS
        return tuple(w for w in CONTROLS if any(row.cells[w].results for row in self.rows))

    def column_title(self, w: str) -> str:
        if self.column is not None:
            name, _, blind = self.column
            return f"{name}={w}" + (" (control)" if w == blind else "")
        return COLUMN_TITLES[w] if self.weighted else UNWEIGHTED_COLUMN

    @property
    def title(self) -> str:
        if self.column is not None:
            return f"{self.op} · " + SHAPED_TITLES.get(
                self.check, f"{self.check}: analytic vs central differences of the kernel's "
                "own forward, per element (sampled colours and directions where too many)")
        zcg = f"{ZCG.public}={_word(self.zcg)}"  # γ's mode, by its JSON name
        if not self.weighted:
            return f"{self.op} · " + (UNWEIGHTED_FORWARD_TITLE if self.check == "forward"
                                      else OP_CHECK_TITLES[self.check])
        titles = HALF_CHECK_TITLES if self.half else CHECK_TITLES
        if self.op != DEFAULT_OP or self.check not in titles:  # the default op's dbias too
            return f"{self.op} · {OP_CHECK_TITLES[self.check]} · {zcg}"
        return f"{titles[self.check]} · {zcg}"

    @property
    def per_row_method(self) -> bool:
        """bf16/fp16 gradients: each row names the reference its results were lifted to."""
        return self.half and self.check in ("dx", "dw")

    @property
    def subtitle(self) -> str:
        shapes = ", ".join("×".join(str(d) for d in s) for s in self.shapes)
        n = sum(len(c.results) for row in self.rows for c in row.cells.values())
        eps = ", ".join(f"{e:g}" for e in self.eps)
        seeds = ", ".join(str(s) for s in self.seeds)
        eps_part = f" · eps {eps}" if self.op in ROWS and ROWS[self.op].has("eps") else ""
        return f"shape {shapes}{eps_part} · seed {seeds} · {n} results"

    @property
    def as_expected(self) -> bool:
        return all(c.as_expected for row in self.rows for c in row.cells.values())


def build_tables(results: list[Result]) -> list[Table]:
    """Group results into tables by op (the default op first), then in check order, zcg off
    before on, fp32/fp64 before bf16/fp16, rows in first-seen order."""
    tables = []
    ops = [op for op in ROWS if any(r.op == op for r in results)]
    for op, check, zcg, half in itertools.product(ops, ALL_CHECKS, (False, True),
                                                  (False, True)):
        mine = [r for r in results if r.check == check and getattr(r, ZCG.public) == zcg
                and (r.dtype in HALF_DTYPES) == half and r.op == op]
        if not mine:
            continue
        rows: dict[tuple[str, str], Row] = {}
        for r in mine:
            # A layout other than contiguous gets a row of its own (shown only where used).
            lay = "" if r.layout == "contiguous" else f" {r.layout}"
            key = (short_name(r.kernel), f"{r.device} {r.dtype}{lay}")
            if key not in rows:
                rows[key] = Row(key[0], key[1], {w: Cell() for w in CONTROLS})
            rows[key].cells[r.weight].results.append(r)
        tables.append(Table(
            check, zcg, list(rows.values()),
            _unique(r.shape for r in mine), _unique(r.eps for r in mine),
            _unique(r.seed for r in mine), half, op,
        ))
    return tables + shaped_tables(results)


def _word(v: object) -> str:
    return "on" if v is True else "off" if v is False else str(v)


def shaped_tables(results: list[Result]) -> list[Table]:
    """The tables of ops of any shape: one per (op, check, low precision or not); columns
    the op's column axis (its blind value marked), a row per kernel, target, the other
    axes where they leave the op's default, and layout."""
    tables = []
    for name, op in SHAPED.items():
        axis = op.axis(op.column) if op.column else None
        default = dict(op.variants()[0].values)
        for check, half in itertools.product(op.checks, (False, True)):
            mine = [r for r in results if r.op == name and r.check == check
                    and (r.dtype in HALF_DTYPES) == half]
            if not mine:
                continue
            values = tuple(_word(v) for v in (axis.values if axis else ("—",)))
            rows: dict[tuple[str, str], Row] = {}
            for r in mine:
                variant = r.variant or {}
                moved = [f"{k}={_word(v)}" for k, v in variant.items()
                         if k != op.column and default.get(k) != v]
                lay = [] if r.layout == "contiguous" else [r.layout]
                key = (short_name(r.kernel), " ".join([f"{r.device} {r.dtype}", *moved, *lay]))
                if key not in rows:
                    rows[key] = Row(key[0], key[1], {w: Cell() for w in values})
                col = _word(variant.get(op.column, "—")) if axis else "—"
                rows[key].cells[col].results.append(r)
            blind = _word(axis.blind) if axis and axis.blind is not None else None
            used = tuple(v for v in values if any(row.cells[v].results for row in rows.values()))
            tables.append(Table(check, False, list(rows.values()),
                                _unique(r.shape for r in mine), [], _unique(r.seed for r in mine),
                                half, name, (op.column or "—", used, blind)))
    return tables


SHAPED_TITLES = {
    "forward": "forward: every output vs the op's fp64 reference, per element, at the "
               "rounding derived from that reference",
    "batch_invariance": "batch invariance: first and last rows alone and in batches of "
                        "other sizes, bitwise (outputs and the gradients that carry the rows); "
                        "run to run, bitwise",
}


def short_name(kernel: str) -> str:
    """``dir/sub/my_norm.py:Fn`` → ``my_norm.py:Fn`` for table rows (JSON keeps the full ref)."""
    path, sep, attr = kernel.rpartition(":")
    return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{attr}" if sep else kernel


def _unique(values: Iterable[T]) -> list[T]:
    seen: list[T] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    if math.isinf(ratio):
        return "∞ (control exactly 0)"
    return f"{ratio:.2e}"


def format_tolerance(tol: float | None) -> str:
    return "—" if tol is None else ("0 (bitwise)" if tol == 0 else f"{tol:.1e}")


def format_ulp(value: float) -> str:
    """``0.4998 ulp``, ``255 ulp``, ``1.667e+05 ulp``: four significant digits and the unit."""
    return "0 ulp" if value == 0 else f"{value:.4g} ulp"


def ulp_unit(r: Result) -> float | None:
    """What one ulp is in ``r``'s own numbers: the output ulp at the reported element for a
    bf16/fp16 result (``details["ulp"]``: its JSON keeps the gradient's or output's units),
    None for a result reported in absolute units."""
    ulp = r.details.get("ulp")
    return float(ulp) if isinstance(ulp, (int, float)) and ulp > 0 else None


def shown(r: Result, value: float | None) -> str:
    """An error or tolerance of ``r`` as the reports write it: in ulps with the unit where
    :func:`ulp_unit` has one, else whole, as :func:`format_error` writes it."""
    unit = ulp_unit(r)
    if value is None or unit is None:
        return format_error(value)
    return format_ulp(value / unit)


def format_detectable(rel: float | None) -> str:
    """``≥ 2.1e-14``: the relative error a dx/dw check catches (``—`` where none)."""
    return "—" if rel is None else f"≥ {rel:.1e}"


def format_index(idx: list[int] | None) -> str:
    return "—" if not idx else "[" + ",".join(str(i) for i in idx) + "]"


def error_words(r: Result) -> str:
    """How ``r.max_abs_err`` is named: ``max |err|`` where it is the largest error, ``|err|``
    where a per-element check reports the element with the largest error / tolerance ratio
    and the largest error (``details["max_abs_err_any"]``) lies elsewhere.

    >>> from gradcheck_bi.vocab import Result
    >>> r = Result("k", "dx", "cpu", "bf16", [4, 8], 1e-6, 0, "randn", False, 0.04, 0.01,
    ...            "fail", "pass", False, details={"max_abs_err_any": 6.2})
    >>> error_words(r)
    '|err|'
    """
    anywhere = r.details.get("max_abs_err_any")
    if isinstance(anywhere, float) and r.max_abs_err is not None and anywhere != r.max_abs_err:
        return "|err|"
    return "max |err|"


def describe(r: Result, scales: bool = False) -> str:
    """One line naming a result and what went wrong with it (``scales``: name the input and
    γ scales even when both are 1)."""
    row = r.__dict__
    gamma = weight_words(row)
    scale = "" if (r.input_scale, r.weight_scale) == (1.0, 1.0) and not scales else (
        f" x·{r.input_scale:g}" + (f" γ·{r.weight_scale:g}" if gamma else ""))
    if r.layout != "contiguous":
        scale += f" layout {r.layout}"
    where = " ".join([f"{r.kernel} {r.check} {r.device}/{r.dtype} shape {tuple(r.shape)}",
                      *gamma]) + scale + (f" eps {r.eps:g}" if has_eps(row) else "") + (
        f" seed {r.seed}" + "".join(f" {w}" for w in op_words(row)))
    if r.status in ("error", "unsupported") or (r.max_abs_err is None and r.message):
        return f"{where}: {r.status}" + (
            f" (expected {r.expected})" if r.status == "fail" else "") + f": {r.message}"
    err, tol = shown(r, r.max_abs_err), shown(r, r.tolerance)
    # A fail within tolerance failed on its message (non-finite values, a training forward
    # that differs): say "≤" there, never a comparison that did not happen.
    within = (r.max_abs_err is not None and r.tolerance is not None
              and r.max_abs_err <= r.tolerance)
    sign = ">" if r.status == "fail" and not within else "≤"
    text = (f"{where}: {r.status} (expected {r.expected}), {error_words(r)} {err} {sign} "
            f"tol {tol}")
    if r.worst:
        text += f" at {format_index(r.worst)}"
    anywhere = r.details.get("max_abs_err_any")
    if error_words(r) != "max |err|" and isinstance(anywhere, float):
        nearest = "furthest past" if sign == ">" else "nearest"
        text += (f", the element {nearest} its tolerance (max |err| {shown(r, anywhere)} "
                 "elsewhere)")
    if r.message:
        text += f" — {r.message}"
    return text
