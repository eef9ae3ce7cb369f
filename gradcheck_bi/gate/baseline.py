"""Baselines: a recorded run, and the drift of a new run from it.

A baseline is a JSON file holding, per result, what identifies it (kernel, check, device,
dtype, shape, eps, seed, γ control, zero_centered_gamma, input and weight scale) and what was
measured (status, max_abs_err, tolerance). Comparing a run with it, a result *drifts* when:

* its status changed (``pass`` → ``fail``, ``pass`` → ``error``, ``unsupported`` → ``pass``…);
* its error grew: ``now > max_growth × max(recorded, floor_fraction × tolerance)``. The
  default ``max_growth`` is 10 and ``floor_fraction`` 1e-6, both stored in the file (edit
  them there). The floor keeps an error that was recorded as exactly 0 (γ = zeros, a
  bitwise comparison) from drifting on a last-bit change far below its tolerance;
* it is new (not in the baseline), or a recorded result did not run: the gate must not
  shrink silently. Record a new baseline with ``--update-baseline`` when the sweep changes.

Errors that shrink are not drift. Files are written atomically (temporary file + rename).
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
from gradcheck_bi.vocab import Result

FORMAT = "gradcheck-bi baseline"
SCHEMA = 1
MAX_GROWTH = 10.0
FLOOR_FRACTION = 1e-6
KEY_FIELDS = ("kernel", "check", "device", "dtype", "shape", "eps", "seed", "weight",
              "zero_centered_gamma", "input_scale", "weight_scale")
Key = tuple[Any, ...]


class BaselineError(Exception):
    """A baseline file that cannot be read or is not a baseline (exit 2)."""


def key_of(r: Result | dict[str, Any]) -> Key:
    d = r if isinstance(r, dict) else r.__dict__
    return tuple(tuple(d[k]) if k == "shape" else d[k] for k in KEY_FIELDS)


def describe_key(key: Key) -> str:
    d = dict(zip(KEY_FIELDS, key, strict=True))
    text = (f"{d['kernel']} {d['check']} {d['device']}/{d['dtype']} shape {tuple(d['shape'])} "
            f"γ={d['weight']} zcg={'on' if d['zero_centered_gamma'] else 'off'} "
            f"eps {d['eps']:g} seed {d['seed']}")
    if d["input_scale"] != 1.0:
        text += f" x-scale {d['input_scale']:g}"
    if d["weight_scale"] != 1.0:
        text += f" γ-scale {d['weight_scale']:g}"
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


@dataclass
class Baseline:
    """Recorded results by key, with the drift rule's two constants."""

    entries: dict[Key, Recorded] = field(default_factory=dict)
    max_growth: float = MAX_GROWTH
    floor_fraction: float = FLOOR_FRACTION

    @classmethod
    def from_results(cls, results: list[Result]) -> Baseline:
        return cls({key_of(r): Recorded(r.status, r.max_abs_err, r.tolerance) for r in results})

    def to_json(self) -> str:
        rows = []
        for key, rec in self.entries.items():
            row: dict[str, Any] = dict(zip(KEY_FIELDS, key, strict=True))
            row["shape"] = list(row["shape"])
            row.update(status=rec.status, max_abs_err=_jsonable(rec.max_abs_err),
                       tolerance=_jsonable(rec.tolerance))
            rows.append(row)
        head = {"format": FORMAT, "schema": SCHEMA, "version": __version__,
                "max_growth": self.max_growth, "floor_fraction": self.floor_fraction}
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
    try:
        base = Baseline(max_growth=float(doc.get("max_growth", MAX_GROWTH)),
                        floor_fraction=float(doc.get("floor_fraction", FLOOR_FRACTION)))
        for i, row in enumerate(doc["results"]):
            try:
                key = key_of(row)
                base.entries[key] = Recorded(str(row["status"]), _float(row["max_abs_err"]),
                                             _float(row["tolerance"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise BaselineError(f"baseline {path}: result #{i + 1} is malformed ({exc!r})"
                                    ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise BaselineError(f"baseline {path}: malformed ({exc!r})") from None
    if not (base.max_growth >= 1 and base.floor_fraction >= 0):
        raise BaselineError(f"baseline {path}: max_growth must be >= 1, floor_fraction >= 0")
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
    kind: str  # "status changed" | "error grew" | "new" | "missing"
    line: str


def _fmt(v: float | None) -> str:
    return "—" if v is None else ("0" if v == 0 else f"{v:.3e}")


def compare(results: list[Result], base: Baseline) -> list[Drift]:
    """Every drift of ``results`` from ``base``, in the run's order, then missing ones."""
    drifts = []
    seen = set()
    for r in results:
        key = key_of(r)
        seen.add(key)
        rec = base.entries.get(key)
        where = describe_key(key)
        if rec is None:
            drifts.append(Drift(key, "new", f"drift: {where}: not in the baseline (status "
                                            f"{r.status}; re-record with --update-baseline)"))
            continue
        if r.status != rec.status:
            drifts.append(Drift(key, "status changed",
                                f"drift: {where}: status {rec.status} → {r.status} "
                                f"(max |err| {_fmt(rec.max_abs_err)} → {_fmt(r.max_abs_err)})"))
            continue
        now, was = r.max_abs_err, rec.max_abs_err
        if now is None or was is None or math.isnan(now):
            continue
        tol = rec.tolerance if rec.tolerance is not None and math.isfinite(rec.tolerance) else 0
        allowed = base.max_growth * max(was, base.floor_fraction * tol)
        if now > allowed:
            factor = "∞" if was == 0 else f"{now / was:.3g}×"
            drifts.append(Drift(key, "error grew",
                                f"drift: {where}: max |err| grew {factor}, {_fmt(was)} → "
                                f"{_fmt(now)} (allowed up to {_fmt(allowed)}: "
                                f"{base.max_growth:g}× the recorded error)"))
    for key in base.entries:
        if key not in seen:
            drifts.append(Drift(key, "missing", f"drift: {describe_key(key)}: recorded in the "
                                                "baseline but not run"))
    return drifts
