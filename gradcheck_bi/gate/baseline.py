"""Baselines: a recorded run, and the drift of a new run from it.

A baseline is a JSON file holding, per result, what identifies it (kernel, check, device,
dtype, shape, eps, seed, γ control, zero_centered_gamma, input and weight scale, and every
setting that sets the check's tolerance: atol, rtol, mode, stencil, step_rel) and what was
measured (status, max_abs_err, tolerance). Kernel refs are keyed normalised
(:func:`~gradcheck_bi.kernels.adapting.loader.normal_ref`: ``./k.py:F`` and ``k.py:F`` are one key).
Comparing a run with it, a result *drifts* when:

* its status changed (``pass`` → ``fail``, ``pass`` → ``error``, ``unsupported`` → ``pass``…);
* its tolerance loosened: ``now > recorded × (1 + tolerance_slack)``, on the loosest
  element's tolerance (``tolerance_max``; the reported ``tolerance`` belongs to the
  worst-ratio element, which moves from run environment to run environment). A run with another
  ``--atol``, ``--mode``, stencil or step is another key (new + missing); this catches the
  same settings giving a looser tolerance — a changed formula or default, or a derived
  floor that grew because the kernel's forward got noisier. ``tolerance_slack`` (stored in
  the file) absorbs what the derived floor moves by with no change at all: the last bits of
  the kernel's output differ between backends and machines, and the truncation estimate
  ``|D2 - D4|`` is a difference of noisy estimates (see :data:`TOLERANCE_SLACK`);
* its error grew: ``now > max_growth × max(recorded, floor_fraction × tolerance)``. The
  default ``max_growth`` is 10 and ``floor_fraction`` 1e-6, both stored in the file (edit
  them there). The floor keeps an error that was recorded as exactly 0 (γ = zeros, a
  bitwise comparison) from drifting on a last-bit change far below its tolerance;
* it is new (not in the baseline), or a recorded result did not run: the gate must not
  shrink silently. Record a new baseline with ``--update-baseline`` when the sweep changes.

Errors that shrink and tolerances that tighten are not drift. Files are written atomically
(temporary file + rename). A file of an older schema (whose keys lack the tolerance
settings) is refused with a message to re-record it, never read with guessed settings.
Rendering drift lines is the report's job (:mod:`gradcheck_bi.report.baseline`).

>>> from gradcheck_bi.vocab import Result
>>> r = Result("after", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, 1e-15, 1e-13,
...            "pass", "pass", True)
>>> base = Baseline.from_results([r])
>>> grown = Result(**{**r.__dict__, "max_abs_err": 5e-14})
>>> [d.kind for d in compare([grown], base)]
['error grew']
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradcheck_bi._atomic import write_atomically
from gradcheck_bi._version import __version__
from gradcheck_bi.point import (
    AXIS,
    KEY_NAMES,
    ROW_DEFAULTS,
    SETTING_NAMES,
    has_eps,
    key_words,
    weight_words,
)
from gradcheck_bi.vocab import OP_FIELDS, Result, format_error

FORMAT = "gradcheck-bi baseline"
# 2: keys carry the tolerance settings, kernel refs normalised, tolerance_slack in the head.
SCHEMA = 2
MAX_GROWTH = 10.0
FLOOR_FRACTION = 1e-6
# How far a derived tolerance moves with nothing changed but the last bits of the kernel's
# output: cases/ci.toml's dx/dw for `after`, torch backend vs Triton's interpreter on one
# machine, moved 97 of 130 per-element-floor tolerance_max values, by at most 3.8% (the
# floor model before the per-element one: 72 of 110, at most 9.7%); one backend run twice,
# or on 1 vs 2 threads, moved none. 0.25 sits above that with room, and far below a real
# loosening (a safety factor or step default doubled: ×2; an fp64 kernel computing in fp32:
# ×1e8). Same machine and backend, a tighter slack (even 0) holds; edit it in the file.
TOLERANCE_SLACK = 0.25
# every field of the point the JSON carries; ``variant``: an op of any shape's option values
KEY_FIELDS = ("kernel", *KEY_NAMES, "variant")
# Keys a baseline recorded before they existed, and the op fields an RMSNorm result leaves
# out (as its JSON does): read as the value every such result has.
KEY_DEFAULTS: dict[str, Any] = {name: AXIS[name].default for name in ("layout", *OP_FIELDS)}
KEY_DEFAULTS["variant"] = None
KEY_DEFAULTS.update(ROW_DEFAULTS)  # a result of an op of any shape has none of them
Key = tuple[Any, ...]


class BaselineError(Exception):
    """A baseline file that cannot be read or is not a baseline (exit 2)."""


def key_of(r: Result | dict[str, Any]) -> Key:
    d = r if isinstance(r, dict) else r.__dict__
    return tuple(tuple(d[k]) if k == "shape" else _options(d.get(k)) if k == "variant"
                 else d[k] if k in d else KEY_DEFAULTS[k] for k in KEY_FIELDS)


def _options(variant: Any) -> tuple[tuple[str, Any], ...] | None:
    """A variant as a key: its ``(option, value)`` pairs in the op's order (a result's
    dict, or a baseline row's); ``None`` for a norm's result, which has none."""
    if variant is None:
        return None
    pairs = variant.items() if isinstance(variant, dict) else variant
    return tuple((str(k), v) for k, v in pairs)


def describe_key(key: Key) -> str:
    d = dict(zip(KEY_FIELDS, key, strict=True))
    text = " ".join([f"{d['kernel']} {d['check']} {d['device']}/{d['dtype']} "
                     f"shape {tuple(d['shape'])}", *weight_words(d),
                     *([f"eps {d['eps']:g}"] if has_eps(d) else []), f"seed {d['seed']}"])
    if d["input_scale"] != 1.0:
        text += f" x-scale {d['input_scale']:g}"
    if d["weight_scale"] != 1.0:
        text += f" γ-scale {d['weight_scale']:g}"
    if d["layout"] != "contiguous":
        text += f" layout {d['layout']}"
    if d["op"] != AXIS["op"].default:
        text += f" op {d['op']}"
    if d["variant"]:
        text += " " + " ".join(f"{k}={v}" for k, v in d["variant"])
    text += "".join(f" {w}" for w in key_words(d))
    for name in SETTING_NAMES:  # only what a run set: None is the derived default
        value = d[name]
        if value is not None and (name, value) not in (("mode", "full"), ("stencil", "central-4")):
            text += f" {name} {value:g}" if isinstance(value, float) else f" {name} {value}"
    return text


def _float(v: Any) -> float | None:
    if v is None:
        return None
    return float(v)  # "inf"/"nan" strings (JSON has no such literals) parse too


@dataclass
class Recorded:
    status: str
    max_abs_err: float | None
    tolerance: float | None
    tolerance_max: float | None = None  # the loosest element's (None: as ``tolerance``)


def loosest(r: Result) -> float | None:
    """The loosest tolerance any element of ``r`` was held to (per-element checks report it
    in their details; elsewhere one tolerance holds for every element)."""
    value = r.details.get("tolerance_max", r.tolerance)
    return None if value is None else float(value)


@dataclass
class Baseline:
    """Recorded results by key, with the drift rule's two constants."""

    entries: dict[Key, Recorded] = field(default_factory=dict)
    max_growth: float = MAX_GROWTH
    floor_fraction: float = FLOOR_FRACTION
    tolerance_slack: float = TOLERANCE_SLACK

    @classmethod
    def from_results(cls, results: list[Result]) -> Baseline:
        return cls({key_of(r): Recorded(r.status, r.max_abs_err, r.tolerance, loosest(r))
                    for r in results})

    def to_json(self) -> str:
        rows = []
        for key, rec in self.entries.items():
            row: dict[str, Any] = dict(zip(KEY_FIELDS, key, strict=True))
            row["shape"] = list(row["shape"])
            if row["variant"] is None:
                del row["variant"]
            else:
                row["variant"] = dict(row["variant"])
            for name in OP_FIELDS:  # as the JSON: an RMSNorm row reads as it always has
                if row[name] == KEY_DEFAULTS[name]:
                    del row[name]
            row.update(status=rec.status, max_abs_err=_jsonable(rec.max_abs_err),
                       tolerance=_jsonable(rec.tolerance),
                       tolerance_max=_jsonable(rec.tolerance_max))
            rows.append(row)
        head = {"format": FORMAT, "schema": SCHEMA, "version": __version__,
                "max_growth": self.max_growth, "floor_fraction": self.floor_fraction,
                "tolerance_slack": self.tolerance_slack}
        # One result per line: a re-recorded baseline reviews as a readable diff.
        lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        body = ",\n".join("    " + json.dumps(row, ensure_ascii=False) for row in rows)
        return "{\n" + "\n".join(lines) + '\n  "results": [\n' + body + "\n  ]\n}\n"


def _jsonable(v: float | None) -> float | str | None:
    return v if v is None or math.isfinite(v) else str(v)


def load(path: str | Path) -> Baseline:
    """Read a baseline file; :class:`BaselineError` says what is wrong with it."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"baseline {path} not found (record one with --update-baseline)"
                            ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"baseline {path}: cannot read: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BaselineError(f"baseline {path}: not a gradcheck-bi baseline "
                            f"(expected \"format\": \"{FORMAT}\")")
    schema = doc.get("schema")
    if schema != SCHEMA:
        older = isinstance(schema, int) and schema < SCHEMA
        raise BaselineError(
            f"baseline {path}: schema {schema} " + (
                "was recorded by an older gradcheck-bi (its keys lack the tolerance settings "
                "and normalised kernel refs); re-record it with --update-baseline"
                if older else f"is not one this gradcheck-bi reads (schema {SCHEMA})"))
    try:
        base = Baseline(max_growth=float(doc.get("max_growth", MAX_GROWTH)),
                        floor_fraction=float(doc.get("floor_fraction", FLOOR_FRACTION)),
                        tolerance_slack=float(doc.get("tolerance_slack", TOLERANCE_SLACK)))
        for i, row in enumerate(doc["results"]):
            try:
                key = key_of(row)
                base.entries[key] = Recorded(str(row["status"]), _float(row["max_abs_err"]),
                                             _float(row["tolerance"]),
                                             _float(row["tolerance_max"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise BaselineError(f"baseline {path}: result #{i + 1} is malformed ({exc!r})"
                                    ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise BaselineError(f"baseline {path}: malformed ({exc!r})") from None
    if not (base.max_growth >= 1 and base.floor_fraction >= 0 and base.tolerance_slack >= 0):
        raise BaselineError(f"baseline {path}: max_growth must be >= 1, floor_fraction >= 0, "
                            "tolerance_slack >= 0")
    return base


def write(path: str | Path, baseline: Baseline) -> None:
    """Write ``baseline`` to ``path`` atomically: a temporary file in the folder, renamed."""
    target = Path(path)
    folder = target.resolve().parent
    if not folder.is_dir():
        raise BaselineError(f"baseline {path}: folder {folder} does not exist")
    write_atomically(target, baseline.to_json())


@dataclass
class Drift:
    """One result that moved away from the baseline, with the line that says how."""

    key: Key
    # "status changed" | "tolerance loosened" | "settings changed" | "error grew" | "new" |
    # "missing"
    kind: str
    line: str


def drifted_results(drifts: list[Drift]) -> int:
    """How many results drifted (a result can drift in more than one way)."""
    return len({d.key for d in drifts})


def _loosened(now: float | None, was: float | None, slack: float) -> str:
    """The drift line's tail when ``now`` is looser than ``was`` past the slack, else ""."""
    if now is None or was is None or math.isnan(now) or math.isnan(was):
        return ""
    if not now > was * (1 + slack):
        return ""
    factor = "∞" if was == 0 or math.isinf(now) else f"{now / was:.3g}×"
    return (f"tolerance loosened {factor}, {format_error(was)} → {format_error(now)} "
            f"(a looser tolerance passes larger errors; allowed up to "
            f"{format_error(was * (1 + slack))}: "
            f"tolerance_slack {slack:g})")


_POINT = [i for i, name in enumerate(KEY_FIELDS) if name not in SETTING_NAMES]
_SETTINGS = [i for i, name in enumerate(KEY_FIELDS) if name in SETTING_NAMES]


def _point(key: Key) -> Key:
    """The key without the tolerance settings: the same point of the sweep, judged anyhow."""
    return tuple(key[i] for i in _POINT)


def _settings_changed(key: Key, was: Key) -> str:
    """``rtol none → 0.001, stencil central-4 → central-2``: the settings that differ."""
    def show(v: Any) -> str:
        return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{KEY_FIELDS[i]} {show(was[i])} → {show(key[i])}"
                     for i in _SETTINGS if key[i] != was[i])


def _resettled(r: Result, key: Key, was: Key, rec: Recorded) -> Drift:
    """One drift for a result recorded at the same point under other tolerance settings:
    how its tolerance moved (loosened / tightened N×) and whether its status changed."""
    now, then = loosest(r), rec.tolerance_max
    if now is None or then is None or math.isnan(now) or math.isnan(then) or now == then:
        how = "tolerance settings changed (the tolerance did not move)"
    elif now > then:
        factor = "∞" if then == 0 or math.isinf(now) else f"{now / then:.3g}×"
        how = f"tolerance loosened {factor} ({format_error(then)} → {format_error(now)})"
    else:
        factor = "∞" if now == 0 or math.isinf(then) else f"{then / now:.3g}×"
        how = f"tolerance tightened {factor} ({format_error(then)} → {format_error(now)})"
    status = (f"; status {rec.status} → {r.status}" if r.status != rec.status else "")
    kind = "tolerance loosened" if "loosened" in how else "settings changed"
    return Drift(key, kind, f"drift: {describe_key(key)}: {how} by "
                            f"{_settings_changed(key, was)}{status}")


def compare(results: list[Result], base: Baseline) -> list[Drift]:
    """Every drift of ``results`` from ``base``, in the run's order, then missing ones.

    A result whose point was recorded under other tolerance settings (``--atol``,
    ``--rtol``, ``--mode``, stencil, step) drifts once, as a change of tolerance that names
    the settings and how far the tolerance moved — not as a new result plus a missing one.
    """
    drifts = []
    seen = set()
    by_point: dict[Key, list[Key]] = {}
    for key in base.entries:
        by_point.setdefault(_point(key), []).append(key)
    keys = [key_of(r) for r in results]
    ran = set(keys)
    for r, key in zip(results, keys, strict=True):
        seen.add(key)
        rec = base.entries.get(key)
        where = describe_key(key)
        if rec is None:
            others = [k for k in by_point.get(_point(key), []) if k not in ran and k not in seen]
            if others:
                seen.add(others[0])
                drifts.append(_resettled(r, key, others[0], base.entries[others[0]]))
                continue
            drifts.append(Drift(key, "new", f"drift: {where}: not in the baseline (status "
                                            f"{r.status}; re-record with --update-baseline)"))
            continue
        if r.status != rec.status:
            drifts.append(Drift(key, "status changed",
                                f"drift: {where}: status {rec.status} → {r.status} "
                                f"(max |err| {format_error(rec.max_abs_err)} → "
                                f"{format_error(r.max_abs_err)})"))
            continue
        loosened = _loosened(loosest(r), rec.tolerance_max, base.tolerance_slack)
        if loosened:
            drifts.append(Drift(key, "tolerance loosened", f"drift: {where}: {loosened}"))
        now, was = r.max_abs_err, rec.max_abs_err
        if now is None or was is None or math.isnan(now):
            continue
        tol = rec.tolerance if rec.tolerance is not None and math.isfinite(rec.tolerance) else 0
        allowed = base.max_growth * max(was, base.floor_fraction * tol)
        if now > allowed:
            factor = "∞" if was == 0 else f"{now / was:.3g}×"
            drifts.append(Drift(key, "error grew",
                                f"drift: {where}: max |err| grew {factor}, {format_error(was)} → "
                                f"{format_error(now)} (allowed up to {format_error(allowed)}: "
                                f"{base.max_growth:g}× the recorded error)"))
    for key in base.entries:
        if key not in seen:
            drifts.append(Drift(key, "missing", f"drift: {describe_key(key)}: recorded in the "
                                                "baseline but not run"))
    return drifts
