"""Shared by the checks: where the worst element is, non-finite values, error → Measurement
(one tolerance per element)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from gradcheck_bi.kernels.calling.writes import all_bits_equal
from gradcheck_bi.tolerance.rules import per_element_ratio
from gradcheck_bi.vocab import Measurement


def locate(err: torch.Tensor) -> tuple[float, list[int]]:
    """``(max err, its index)``; a NaN counts as the worst."""
    flat = int(torch.argmax(torch.nan_to_num(err, nan=math.inf)).item())
    worst = float(err.reshape(-1)[flat].item())
    return worst, _unravel(flat, err.shape)


def bitwise_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float, list[int] | None]:
    """(number of elements whose bits differ, max |a - b|, index of the first such element)."""
    ia = a.contiguous().view(_int_view(a.dtype))
    ib = b.contiguous().view(_int_view(b.dtype))
    if torch.equal(ia, ib):  # the usual case: one op and one sync, no count
        return 0, 0.0, None
    differ = ia != ib
    n = int(differ.sum().item())
    if n == 0:
        return 0, 0.0, None
    diff = (a.to(torch.float64) - b.to(torch.float64)).abs()
    first = torch.nonzero(differ)[0].tolist()
    return n, float(torch.nan_to_num(diff[differ], nan=math.inf).max().item()), first


@dataclass
class BitwiseLog:
    """Bitwise comparisons of a batch-invariance check: each difference one line, the worst
    element (its row, its last index) and the count; :meth:`measurement` is the verdict.

    :meth:`compare` queues; :meth:`settle` compares the queue with one host sync when all of
    it is equal (the usual case), pair by pair, in order, when not. Settle before the kernel
    runs again, so each comparison sees the tensors as the kernel returned them."""

    failures: list[str] = field(default_factory=list)
    worst_err: float = 0.0
    worst_at: list[int] | None = None
    compared: int = 0
    queued: list[tuple[str, torch.Tensor, torch.Tensor, int]] = field(default_factory=list)

    def compare(self, label: str, a: torch.Tensor, b: torch.Tensor, row: int) -> None:
        self.compared += 1
        self.queued.append((label, a, b, row))

    def settle(self) -> None:
        """Compare what was queued (see the class)."""
        queued, self.queued = self.queued, []
        if all_bits_equal([(a, b) for _, a, b, _ in queued]):
            return
        for label, a, b, row in queued:
            self._one(label, a, b, row)

    def _one(self, label: str, a: torch.Tensor, b: torch.Tensor, row: int) -> None:
        n, err, first = bitwise_diff(a, b)
        if n:
            self.failures.append(f"{label}: {n} of {a.numel()} elements differ "
                                 f"(max {err:.3e}){tail(a, b)}")
            if err >= self.worst_err:
                self.worst_err, self.worst_at = err, [row, *(first or [])[-1:]]

    def measurement(self, details: dict[str, Any]) -> Measurement:
        """Pass iff no bits differed; the first three differences in the message."""
        self.settle()
        more = len(self.failures) - 3
        msg = "; ".join(self.failures[:3]) + (f"; and {more} more" if more > 0 else "")
        return Measurement(self.worst_err, 0.0, not self.failures, self.worst_at, msg,
                           {"comparisons": self.compared, **details})


def _int_view(dtype: torch.dtype) -> torch.dtype:
    return {8: torch.int64, 4: torch.int32, 2: torch.int16}[dtype.itemsize]


def nonfinite(name: str, t: torch.Tensor) -> str:
    """A note naming how many elements of ``t`` are inf or NaN ("" when none are)."""
    return nonfinite_notes((name, t))[0]


def nonfinite_notes(*named: tuple[str, torch.Tensor]) -> list[str]:
    """:func:`nonfinite` of each ``(name, tensor)``, their sums read by the host together
    (one sync where one each took one)."""
    floats = [i for i, (_, t) in enumerate(named) if t.is_floating_point()]
    totals = to_host(*(named[i][1].detach().sum() for i in floats))
    notes = [""] * len(named)
    for i, total in zip(floats, totals, strict=True):
        if math.isfinite(total):
            continue  # the usual case in one op: a sum of finite values (it may overflow)
        name, t = named[i]
        bad = int((~torch.isfinite(t)).sum().item())
        notes[i] = f"{name} has {bad} non-finite element(s)" if bad else ""
    return notes


_KEPT: ContextVar[list[tuple[torch.Tensor, torch.Tensor]] | None] = ContextVar(
    "kept_judgements", default=None)


@contextmanager
def kept_judgements() -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Within: every ``(err, tol)`` that :func:`measured_per_element` judges is kept, in
    order — a contiguous point's finite-difference margin, which its layout twins reuse
    (:mod:`gradcheck_bi.checks.twins`)."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    token = _KEPT.set(kept)
    try:
        yield kept
    finally:
        _KEPT.reset(token)


def measured_per_element(err: torch.Tensor, tol: torch.Tensor, notes: Sequence[str],
                         details: dict[str, Any]) -> Measurement:
    """Judge ``err`` element by element against ``tol``: pass iff ``max err_i / tol_i ≤ 1``.

    Reported: the element with the largest ratio — its error as ``max_abs_err``, its
    tolerance as ``tolerance`` (so ``max_abs_err ≤ tolerance`` iff the check passes) — and,
    in the details, that ``ratio``, the largest error anywhere (``max_abs_err_any``), the
    tolerance at that element (``tolerance_at_max_err``) and the loosest element's
    (``tolerance_max``: what a baseline compares, as it does not jump with the worst element).
    """
    kept = _KEPT.get()
    if kept is not None:
        kept.append((err, tol))
    ratio = per_element_ratio(err, tol)
    if ratio.shape == err.shape == tol.shape and ratio.numel():
        (top, at_err, at_tol, max_err, tol_at_max, tol_max), (worst, where_max) = _worst(
            ratio, err, tol)
    else:
        top, worst = locate(ratio)
        at = tuple(worst)
        at_err, at_tol = float(err[at].item()), float(tol[at].item())
        max_err, where_max = locate(err)
        tol_at_max, tol_max = float(tol[tuple(where_max)].item()), float(tol.max().item())
    problems = [n for n in notes if n]
    passed = not problems and math.isfinite(at_err) and top <= 1.0
    extra = {"ratio": top, "max_abs_err_any": max_err, "tolerance_at_max_err": tol_at_max,
             "tolerance_max": tol_max}
    return Measurement(at_err, at_tol, passed, worst, "; ".join(problems), {**details, **extra})


def _worst(ratio: torch.Tensor, err: torch.Tensor, tol: torch.Tensor
           ) -> tuple[list[float], tuple[list[int], list[int]]]:
    """What :func:`measured_per_element` reports, brought to the host at once (one sync,
    where an ``item`` each took eight): ratio, err and tol at the largest ratio, err and tol
    at the largest error (NaN the largest, as :func:`locate`), the largest tol; and the
    indices of the two elements."""
    flat = torch.stack([t.reshape(-1).to(torch.float64) for t in (ratio, err, tol)])
    at = torch.argmax(torch.nan_to_num(flat[:2], nan=math.inf), dim=1)  # (2,)
    picked = flat[:, at]  # (3, 2): [ratio, err, tol] at [largest ratio, largest err]
    got = torch.cat([picked.reshape(-1), flat[2].max().reshape(1), at.to(torch.float64)])
    r_top, _, r_err, e_err, r_tol, e_tol, t_max, i_r, i_e = got.tolist()
    return [r_top, r_err, r_tol, e_err, e_tol, t_max], (_unravel(int(i_r), ratio.shape),
                                                        _unravel(int(i_e), ratio.shape))


def to_host(*scalars: torch.Tensor) -> list[float]:
    """One-element tensors as floats, brought to the host together: one sync per device
    they live on, not one each (a CPU tensor and a CUDA one may come mixed: the steps of a
    finite difference are kept on the host).

    >>> to_host(torch.tensor(0.5), torch.tensor([2.0], dtype=torch.float16))
    [0.5, 2.0]
    """
    got: list[float] = [0.0] * len(scalars)
    for dev in {t.device for t in scalars}:
        at = [i for i, t in enumerate(scalars) if t.device == dev]
        values = torch.cat([scalars[i].reshape(1).to(torch.float64) for i in at]).tolist()
        for i, v in zip(at, values, strict=True):
            got[i] = v
    return got


def _unravel(flat: int, shape: torch.Size) -> list[int]:
    """The index of element ``flat`` of a tensor of ``shape``, as a list."""
    idx: list[int] = []
    for size in reversed(shape):  # (torch.unravel_index would import sympy: ~0.3 s)
        flat, i = divmod(flat, size)
        idx.append(i)
    idx.reverse()
    return idx


def tail(a: torch.Tensor, b: torch.Tensor) -> str:
    """`` (only in the last 12 of 64 elements: a vectorised loop's tail?)`` where every
    differing element sits at the end of the row."""
    diff = (a != b).reshape(-1).nonzero()
    if diff.numel() == 0 or a.numel() < 8:
        return ""
    first = int(diff.min())
    if first >= a.numel() // 2:
        return (f" (only in the last {a.numel() - first} of {a.numel()} elements: a "
                "vectorised loop's tail?)")
    return ""
