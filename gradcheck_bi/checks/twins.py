"""A layout point judged by its contiguous twin: one call per layout, not finite differences.

A gradient check at a layout other than ``contiguous`` (:mod:`gradcheck_bi.kernels.calling.layout`)
asks one question: does the kernel give on this memory what it gives on fresh contiguous
tensors? Its *twin* — the same point (kernel, check, device, dtype, shape, γ, zcg, seed,
scales, eps, settings, …) at ``contiguous`` — has been checked against finite differences
earlier in this process (just before it: the layout is the sweep's innermost axis,
:func:`gradcheck_bi.sweep.grid`; or in an earlier sweep of the run that shares it). So the
point runs the kernel's forward and backward once on the laid-out tensors and once on
contiguous ones — the same values, bitwise: one draw of the point's inputs, laid out by
:func:`~gradcheck_bi.kernels.calling.layout.lay_out`, which copies values — and compares every
output and the gradient the check judges (``dx`` for dx; another gradient is its own
point's business):

1. **bitwise** — each has the twin's bits: the kernel is layout-blind here and its
   finite differences would repeat the twin's, so the point's measurement is the twin's
   (error, tolerance, worst element, verdict);
2. **within the twin's margin** — every output has the twin's bits and the judged gradient
   differs (a layout that changes the order of a sum legitimately changes its last bits) by
   at most ``tol_i − err_i`` at every element, the twin's unused
   finite-difference budget. With ``fd`` the twin's differences (of the same forward: its
   outputs are bitwise the twin's), ``|g − fd| ≤ |g_twin − fd| + |g − g_twin| ≤ tol_i``: the
   point passes against the twin's differences at the twin's tolerance, and reports that
   bound ``err_i + |g − g_twin|`` as its error;
3. otherwise — an output differs, the gradient differs beyond the margin, a NaN — the twin
   cannot decide, and the point runs its own finite-difference check, as every point did
   before.

A twin never fails a point on its own: a failure comes from the point's own finite
differences, or is its bitwise twin's. ``details["twin"]`` says which rule decided and, for
the third, why. What the kernel raises in the laid-out call is what its own check would
raise first (the same call): a side effect or a broken contract reads as before.

Not judged by a twin (their own check, as before): forward points (no finite differences to
save), batch invariance (contiguous only), bf16/fp16 gradients (the lifted check also runs
the kernel in fp64/fp32, which a comparison at the point's dtype does not cover), and a point
whose twin was not measured in this process or raised.
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from gradcheck_bi.checks import run_check
from gradcheck_bi.checks._measure import bitwise_diff, kept_judgements, measured_per_element
from gradcheck_bi.checks.rows.point import make_point
from gradcheck_bi.checks.shaped_batch import same_as_contiguous
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.kernels.calling.opcall import laid_out, op_grads
from gradcheck_bi.kernels.calling.writes import (
    allowed_mutations,
    declared_mutations,
    noted_mutations,
)
from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.tolerance.rules import per_element_ratio
from gradcheck_bi.vocab import Config, Measurement

TWIN_DTYPES = ("fp64", "fp32")
# What one process keeps of its twins: a twin's layout points follow it in a sweep's grid,
# but a run of several sweeps measures a point they share once, in the first (cases/ci.toml's
# "layouts" block shares its contiguous points with earlier blocks). The judged (err, tol)
# pairs are what costs memory: the oldest go first past this many bytes.
KEEP_BYTES = 64 * 2**20
# Layouts whose calls are kept for the next point that differs only in its check: a sweep's
# layouts of one point (x-strided, grad-strided, …), dx's then dw's; within KEEP_BYTES.
KEEP_CALLS = 4
# fd_verdict's details at the twin's worst element, which a margin verdict does not share.
_AT_WORST = ("noise_floor", "rounding_floor")
Tensors = dict[str, torch.Tensor]


@dataclass
class Twin:
    """A contiguous point's measurement, and its ``(err, tol)`` per element of the judged
    gradient (``None`` where the check judged something else: directional projections)."""

    fn: Any
    measurement: Measurement
    judged: tuple[torch.Tensor, torch.Tensor] | None

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.judged or ())


def judged_by_twin(cfg: Config) -> bool:
    """Whether a point's check can lean on a twin: a gradient check in fp64/fp32."""
    record = ROWS.get(cfg.op) or SHAPED.get(cfg.op)
    return (cfg.dtype in TWIN_DTYPES and record is not None
            and cfg.check in record.gradient_checks)


class Twins:
    """The checks of one process: contiguous gradient points keep what their layout twins
    need, layout points are judged by them (:meth:`check` replaces ``run_check``)."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self._kept: OrderedDict[Config, Twin] = OrderedDict()
        # The last few layouts' calls (_both_layouts) by point less its check: dx's and dw's
        # points at one layout make the very same forward and backward calls.
        self._calls: OrderedDict[Config, tuple[Any, Tensors, Tensors, list[str]]] = \
            OrderedDict()

    def check(self, fn: Any, cfg: Config) -> Measurement:
        if not judged_by_twin(cfg):
            return run_check(fn, cfg)
        if cfg.layout == "contiguous":
            return self._measure_twin(fn, cfg)
        twin = self._kept.get(replace(cfg, layout="contiguous"))
        if twin is None or twin.fn is not fn:
            return run_check(fn, cfg)
        if cfg.op in SHAPED:  # an op of any shape: bitwise, or its own check
            return shaped_against_twin(fn, cfg, twin)
        return against_twin(fn, cfg, twin, self._shared_layouts)

    def _shared_layouts(self, fn: Any, cfg: Config) -> tuple[Tensors, Tensors]:
        """:func:`_both_layouts`, shared by the points that differ only in their check:
        their tensors and calls are the same (the draw never depends on the check), so the
        second point reads the first's outputs and gradients, and its declared writes'
        notes are the first call's again."""
        key = replace(cfg, check="")
        hit = self._calls.get(key)
        if hit is not None and hit[0] is fn:
            self._calls.move_to_end(key)
            noted_mutations().extend(hit[3])
            return hit[1], hit[2]
        notes = noted_mutations()
        before = len(notes)
        laid, flat = _both_layouts(fn, cfg)
        self._calls[key] = (fn, laid, flat, notes[before:])
        _trim(self._calls, lambda c: _nbytes(c[1]) + _nbytes(c[2]), self.keep_bytes,
              KEEP_CALLS)
        return laid, flat

    def _measure_twin(self, fn: Any, cfg: Config) -> Measurement:
        with kept_judgements() as kept:
            m = run_check(fn, cfg)
        self._kept[cfg] = Twin(fn, copy.deepcopy(m), kept[0] if len(kept) == 1 else None)
        self._kept.move_to_end(cfg)
        _trim(self._kept, lambda t: t.nbytes, self.keep_bytes)
        return m


def _trim(kept: OrderedDict[Config, Any], size: Callable[[Any], int], keep_bytes: int,
          most: int | None = None) -> None:
    """Drop ``kept``'s oldest entries while they hold more than ``keep_bytes`` (``size``
    of each) or number more than ``most``."""
    while kept and ((most is not None and len(kept) > most)
                    or sum(size(v) for v in kept.values()) > keep_bytes):
        kept.popitem(last=False)


def _nbytes(ts: Tensors) -> int:
    return sum(t.nbytes for t in ts.values())


def against_twin(fn: Any, cfg: Config, twin: Twin,
                 both: Callable[[Any, Config], tuple[Tensors, Tensors]] | None = None
                 ) -> Measurement:
    """The layout point ``cfg`` by the rules of this module's docstring: its outputs and the
    gradient it judges (``cfg.check``) against the contiguous call's (made by ``both``,
    default :func:`_both_layouts`)."""
    laid, flat = (both or _both_layouts)(fn, cfg)
    names = [*ROWS[cfg.op].outputs, cfg.check]
    said = {"compared_with": "contiguous", "tensors": [n for n in names if n in flat]}
    if (set(laid) != set(flat) or cfg.check not in flat
            or any(laid[n].shape != flat[n].shape or laid[n].dtype != flat[n].dtype
                   for n in flat)):
        return _own_check(fn, cfg, said, "the kernel returned other tensors than on "
                                         "contiguous memory")
    differ = {n: d for n in said["tensors"] if (d := bitwise_diff(laid[n], flat[n]))[0]}
    if not differ:
        m = copy.deepcopy(twin.measurement)
        m.details["twin"] = {**said, "decided_by": "bitwise equal: the twin's measurement"}
        return m
    why = "; ".join(f"{n}: {k} of {laid[n].numel()} elements differ (max {e:.3e})"
                    for n, (k, e, _) in differ.items())
    if set(differ) != {cfg.check} or twin.judged is None:
        return _own_check(fn, cfg, said, why)
    err, tol = twin.judged
    if err.shape != flat[cfg.check].shape:
        return _own_check(fn, cfg, said, why)
    delta = (laid[cfg.check].to(torch.float64) - flat[cfg.check].to(torch.float64)).abs()
    bound = err + delta
    top = float(per_element_ratio(bound, tol).max())
    if not top <= 1.0:  # NaN too
        return _own_check(fn, cfg, said, f"{why}, beyond the twin's margin "
                                         f"(err + diff = {top:.3g} × tol)")
    details = {k: v for k, v in twin.measurement.details.items() if k not in _AT_WORST}
    details["twin"] = {**said, "decided_by": "within the twin's margin: against the twin's "
                       "finite differences", "differ": why}
    return measured_per_element(bound, tol, [], details)


def shaped_against_twin(fn: Any, cfg: Config, twin: Twin) -> Measurement:
    """Rule 1 alone for an op of any shape: the twin's measurement where every output and
    gradient has the contiguous call's bits (:func:`gradcheck_bi.checks.shaped.
    same_as_contiguous`), else the point's own finite differences."""
    said: dict[str, Any] = {"compared_with": "contiguous", "tensors": "outputs and gradients"}
    why = same_as_contiguous(fn, cfg)
    if why is not None:
        return _own_check(fn, cfg, said, why)
    m = copy.deepcopy(twin.measurement)
    m.details["twin"] = {**said, "decided_by": "bitwise equal: the twin's measurement"}
    return m


def _own_check(fn: Any, cfg: Config, said: dict[str, Any], why: str) -> Measurement:
    m = run_check(fn, cfg)
    m.details["twin"] = {**said, "decided_by": "own finite differences", "why": why}
    return m


def _both_layouts(fn: Any, cfg: Config) -> tuple[Tensors, Tensors]:
    """Every output and gradient of one forward and backward in ``cfg.layout``, then on
    contiguous tensors of the same values (its declared writes are the first call's notes)."""
    fn = as_op_kernel(fn)  # the one call path every check uses
    point = make_point(cfg)
    names = {t: c for c, t in point.op.gradient_checks.items()}
    out: list[Tensors] = []
    for layout in (cfg.layout, "contiguous"):
        with laid_out(layout), _notes_aside() if out else contextlib.nullcontext():
            outs, grads = op_grads(fn, point.inputs, point.params, point.cotangents,
                                   point.options, point.zcg)
        out.append({**outs, **{names[t]: grad for t, grad in grads.items()}})
    return out[0], out[1]


def _notes_aside() -> contextlib.AbstractContextManager[list[str]]:
    """The second call's declared writes: still allowed, noted apart (the first call's
    notes are the point's, as in its own check)."""
    return declared_mutations(allowed_mutations())
